"""What `contrastive --trim-vocab` buys a classifier: an ACKD student of 3 layers copied from a fine-tuned MiniLM-L6
teacher, with MiniLM's 30,522 tokens and with the tokens of its training sentences, side by side.

    python benchmarks/classifier_vocab.py                       # rt-polarity: teacher and students 1 epoch each
    python benchmarks/classifier_vocab.py --limit 64 --steps 2 --no-write                # a smoke run

Teacher: the packaged MiniLM-L6 under a new 2-class head, fine-tuned by `contrastive --student` (cross-entropy) on
../shared/data/rt-polarity's training sentences (or the bundled Debian synopses with alternating labels where that
is absent). Students: `contrastive --teacher T --layers 3` (full ACKD, the defaults), the second with
`--trim-vocab`; both are the same run otherwise (same seed, batches and steps), so they learn the same weights at
the kept rows (a test checks it) and differ only where a validation sentence has a word the training sentences
lack, which the trimmed tokenizer splits into smaller pieces. Reported for each: parameters, float32 safetensors
bytes, the bytes of `quantize --method direct` at 8-8-8 and 2-2-8, validation accuracy, batch-1 PyTorch latency
(one sentence at a time, the two taking turns, p50), and how many validation sentences tokenize differently.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from _report import cpu, publish

RT = Path(__file__).resolve().parents[2] / "shared" / "data" / "rt-polarity"
FORMS = ("30,522 tokens", "trimmed")


def data(work: Path, limit: int | None) -> tuple[Path, Path, str]:
    """Training and validation jsonl (rt-polarity, or the bundled synopses), and what they are."""
    if (RT / "train.jsonl").is_file():
        splits = {name: [json.loads(x) for x in (RT / f"{name}.jsonl").read_text().splitlines()]
                  for name in ("train", "validation")}
        source = "`../shared/data/rt-polarity`"
    else:
        from modelshrink.quickstart import sample_path

        synopses = [json.loads(x)["summary"] for x in sample_path().read_text().splitlines()]
        rows = [{"sentence": s, "label": i % 2} for i, s in enumerate(synopses)]
        splits, source = {"train": rows[:-64], "validation": rows[-64:]}, "the bundled Debian synopses"
    paths = []
    for name, rows in splits.items():
        rows = rows[:limit] if limit else rows
        paths.append(work / f"{name}.jsonl")
        paths[-1].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths[0], paths[1], f"{source} ({len(splits['train'][:limit or None]):,} training sentences)"


def make(work: Path, train: Path, validation: Path, teacher: str | None, steps: int | None, log) -> dict:
    from modelshrink.models.warmstart import packaged_minilm
    from modelshrink.steps.contrastive import ContrastiveOptions, contrastive
    from modelshrink.steps.quantize import QuantizeOptions, quantize

    budget = {"max_steps": steps} if steps else {"epochs": 1}
    common = dict(data=str(train), validation=str(validation), batch_size=32, device="cpu", seed=0, **budget)
    if teacher is None:
        log("teacher: MiniLM-L6 fine-tuned")
        teacher = str(contrastive(ContrastiveOptions(student=packaged_minilm(), **common), work / "teacher",
                                  overwrite=True, log=log))
    forms: dict[str, dict[str, Path]] = {}
    for name, trim in zip(FORMS, (False, True)):
        log(f"student ({name})")
        student = contrastive(ContrastiveOptions(teacher=teacher, layers=3, trim_vocab=trim, **common),
                              work / f"student-{trim}", overwrite=True, log=log)
        forms[name] = {"float32": student}
        for bits in ("8-8-8", "2-2-8"):
            forms[name][bits] = quantize(QuantizeOptions(model=str(student), bits=bits, method="direct"),
                                         work / f"q{bits}-{trim}", overwrite=True)
    return forms


def latency(forms: dict[str, Path], sentences: list[str], rounds: int) -> dict[str, float]:
    import torch

    from modelshrink.models.loading import load_classifier

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    models = {name: load_classifier(str(path)) for name, path in forms.items()}
    times: dict[str, list[float]] = {name: [] for name in models}
    with torch.inference_mode():
        for _ in range(rounds):
            for text in sentences:
                for name, (model, tokenizer) in models.items():
                    start = time.perf_counter()
                    model(**tokenizer([text], return_tensors="pt"))
                    times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t[len(sentences) // 8:]) * 1e3 for name, t in times.items()}


def changed(forms: dict[str, Path], sentences: list[str]) -> int:
    """Validation sentences the trimmed tokenizer splits into other tokens than MiniLM's."""
    from transformers import AutoTokenizer

    full, small = (AutoTokenizer.from_pretrained(forms[name]) for name in FORMS)
    return sum(full.tokenize(s) != small.tokenize(s) for s in sentences)


def disagreements(forms: dict[str, Path], validation: Path) -> tuple[int, int, float]:
    """Validation sentences only the full student gets right, only the trimmed one does, and the exact two-sided
    sign test's p of that split."""
    from math import comb

    import torch

    from modelshrink.training import classify
    from modelshrink.models.loading import load_classifier

    rows = classify.read_labeled(str(validation))
    full, small = ([p == r["label"] for p, r in zip(classify.predict(*load_classifier(str(forms[name])), rows, 64,
                                                                      torch.device("cpu")), rows)] for name in FORMS)
    a, b = sum(x and not y for x, y in zip(full, small)), sum(y and not x for x, y in zip(full, small))
    n = a + b
    p = min(1.0, 2 * sum(comb(n, i) for i in range(max(a, b), n + 1)) / 2 ** n) if n else 1.0
    return a, b, p


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", help="a fine-tuned classifier to reuse [default: fine-tune MiniLM-L6 here]")
    parser.add_argument("--limit", type=int, help="the first N sentences of each split [default: all]")
    parser.add_argument("--steps", type=int, help="steps of each training run [default: 1 epoch]")
    parser.add_argument("--sentences", type=int, default=200, help="validation sentences timed [default: 200]")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-write", dest="write", action="store_false")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        train, validation, described = data(Path(tmp), args.limit)
        started = time.perf_counter()
        forms = make(Path(tmp), train, validation, args.teacher, args.steps, print)
        made = time.perf_counter() - started
        meta = {(n, k): json.loads((p / "modelshrink.json").read_text()) for n, f in forms.items() for k, p in f.items()}
        size = {(n, k): sum(x.stat().st_size for x in p.glob("*.safetensors")) / 1e6
                for n, f in forms.items() for k, p in f.items()}
        sentences = [json.loads(x)["sentence"] for x in validation.read_text().splitlines()]
        ms = latency({n: f["float32"] for n, f in forms.items()}, sentences[:args.sentences], args.rounds)
        differ = changed({n: f["float32"] for n, f in forms.items()}, sentences)
        only_full, only_trimmed, p = disagreements({n: f["float32"] for n, f in forms.items()}, validation)
    vocabulary = meta[("trimmed", "float32")]["resolved"]["vocabulary"]
    lines = [f"`python benchmarks/classifier_vocab.py` ({cpu()}, "
             f"{len(os.sched_getaffinity(0))} cores, {time.strftime('%Y-%m-%d')}, {made / 60:.0f} min to make); "
             f"data {described}: {vocabulary['kept']:,} of {vocabulary['of']:,} tokens kept. Batch-1 PyTorch float32, "
             f"one validation sentence at a time, {min(args.sentences, len(sentences))} sentences × {args.rounds} "
             "rounds, taking turns (p50, the first eighth left out as warm-up).", "",
             "| ACKD student, 3 layers | parameters | float32 MB | 8-8-8 MB | 2-2-8 MB | validation accuracy | "
             "batch-1 p50 ms |", "|---|---|---|---|---|---|---|"]
    for name in FORMS:
        m = meta[(name, "float32")]["metrics"]
        lines.append(f"| {name} | {m['parameters']:,} | {size[(name, 'float32')]:.2f} | "
                     f"{size[(name, '8-8-8')]:.2f} | {size[(name, '2-2-8')]:.2f} | "
                     f"{m['validation']['accuracy']:.2f} | {ms[name]:.2f} |")
    ratio = {k: size[("trimmed", k)] / size[("30,522 tokens", k)] for k in ("float32", "8-8-8", "2-2-8")}
    lines += ["", "Trimmed over full: " + ", ".join(f"{v:.2f}× the {k} bytes" for k, v in ratio.items())
              + f", {ms['trimmed'] / ms['30,522 tokens']:.2f}× the batch-1 latency. Validation sentences tokenized "
              f"differently: {differ} of {len(sentences):,}; right with one student only: {only_full + only_trimmed} "
              f"(the full {only_full}, the trimmed {only_trimmed}; exact sign test p = {p:.2f})."]
    publish("classifier-vocab", "Trimmed vocabularies for classifiers: what `contrastive --trim-vocab` buys",
            "\n".join(lines), args.write)


if __name__ == "__main__":
    main()
