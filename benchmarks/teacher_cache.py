"""What `contrastive --teacher-cache` saves: whole ACKD student runs with the teacher cached once
against the teacher run on every batch, side by side in one run.

    python benchmarks/teacher_cache.py                          # 1,000 sentences, 2 epochs, 2 rounds
    python benchmarks/teacher_cache.py --sentences 300 --rounds 1 --no-write   # a quick look

Teacher: the packaged MiniLM-L6 (6 layers, hidden 384) with a new 2-class head, untrained (the
speed of a forward pass does not depend on what the weights have learned). Student: its layers
0, 3, 5, trained by full ACKD (KD + PT + A-CDL with SAR and a storage of 1,000) for --epochs on
--sentences sentences of rt-polarity (`../shared/data/rt-polarity`, or the bundled Debian
synopses with alternating labels where that is absent), batches of 32, no validation. Reported:
wall seconds of the whole `contrastive` call (loading, the cache pass, training, saving), the
seconds of the optimizer steps alone, and the seconds per step; settings are interleaved for
--rounds rounds and the median is reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from _report import cpu, publish

RT_POLARITY = Path(__file__).resolve().parents[2] / "shared" / "data" / "rt-polarity" / "train.jsonl"


def sentences(n: int, work: Path) -> tuple[Path, str]:
    if RT_POLARITY.is_file():
        rows = [json.loads(x) for x in RT_POLARITY.read_text().splitlines()[:n]]
        source = "rt-polarity"
    else:
        from modelshrink.quickstart import sample_path

        synopses = [json.loads(x)["summary"] for x in sample_path().read_text().splitlines()[:n]]
        rows = [{"sentence": s, "label": i % 2} for i, s in enumerate(synopses)]
        source = "the bundled Debian synopses (alternating labels)"
    path = work / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, f"{len(rows):,} sentences of {source}"


def run(data: Path, teacher: Path, out: Path, epochs: float, cache: bool) -> dict[str, float]:
    from modelshrink.steps.contrastive import ContrastiveOptions, contrastive

    started = time.perf_counter()
    contrastive(ContrastiveOptions(data=str(data), teacher=str(teacher), layers=3, epochs=epochs, batch_size=32,
                                   device="cpu", seed=0, teacher_cache=cache), out, overwrite=True)
    wall = time.perf_counter() - started
    log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    steps = [e for e in log if "seconds" in e]
    train = sum(e["seconds"] for e in steps)
    return {"wall": wall, "train": train, "per_step": train / steps[-1]["step"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from modelshrink.models.warmstart import packaged_minilm

    work = Path(tempfile.mkdtemp(prefix="bench-teacher-cache-"))
    torch.manual_seed(0)
    teacher = work / "teacher"
    AutoModelForSequenceClassification.from_pretrained(packaged_minilm(), num_labels=2).save_pretrained(teacher)
    AutoTokenizer.from_pretrained(packaged_minilm()).save_pretrained(teacher)
    data, described = sentences(args.sentences, work)
    settings = {"--no-teacher-cache (teacher on every batch)": False, "--teacher-cache (default)": True}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in settings}
    names = list(settings)
    for r in range(args.rounds):
        for name in names[r % 2:] + names[:r % 2]:
            results[name].append(run(data, teacher, work / f"student-{r}", args.epochs, settings[name]))
            print(f"round {r + 1} {name}: {results[name][-1]}", file=sys.stderr)

    def median(name: str, key: str) -> float:
        return statistics.median(x[key] for x in results[name])

    base = median(names[0], "wall")
    lines = [
        f"ACKD student of 3 layers (0, 3, 5) from MiniLM-L6 with a 2-class head; {described}, {args.epochs:g} "
        f"epochs of batches of 32, full ACKD, no validation; {args.rounds} interleaved rounds, median. Machine: "
        f"{cpu()}, {torch.get_num_threads()} threads, torch {torch.__version__}. Command: "
        f"`python benchmarks/teacher_cache.py --sentences {args.sentences} --epochs {args.epochs:g} --rounds "
        f"{args.rounds}` ({time.strftime('%Y-%m-%d')}).",
        "",
        "| setting | whole run, s | optimizer steps, s | s per step | whole run vs no cache |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        lines.append(f"| {name} | {median(name, 'wall'):.1f} | {median(name, 'train'):.1f} | "
                     f"{median(name, 'per_step'):.3f} | {median(name, 'wall') / base:.2f}× |")
    publish("teacher_cache", "contrastive: what the teacher cache saves", "\n".join(lines), write=not args.no_write,
            intro="The cache replaces the teacher's forward pass on every batch of every epoch with one pass "
                  "over the training data before training; the longer the run, the more it saves.")


if __name__ == "__main__":
    main()
