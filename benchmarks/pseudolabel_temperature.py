"""What does the attention temperature cost? docs/s of `pseudolabel` at λ = 1, λ = 2 and
λ ~ U[1, 2], on one teacher and the same documents, measured side by side in one run.

    python benchmarks/pseudolabel_temperature.py            # 500 Debian validation documents
    python benchmarks/pseudolabel_temperature.py --docs 64 --rounds 1   # a quick look

The teacher is the bert2bert warm-started from the packaged MiniLM-L6 (49M parameters), the only
real pretrained weights available offline. Each summary is forced to exactly --length tokens
(min_length = max_length), so every setting does the same amount of decoding and docs/s differs
only by what the temperature itself costs; a different λ would otherwise change summary lengths
and with them the work. Settings run interleaved for --rounds rounds (order rotated each round)
so that drift of the machine falls on all of them alike; the median round is reported. Timing is
the generation loop as `pseudolabel` records it (model loading excluded). Results are written
into BENCHMARKS.md between this benchmark's markers.
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

ROOT = Path(__file__).resolve().parents[1]
DEBIAN = ROOT.parent / "shared" / "data" / "debian-descriptions" / "validation.jsonl.gz"

SETTINGS = {
    "λ = 1 (regular)": dict(lam=1.0),
    "λ = 2 (folded into weights)": dict(lam=2.0),
    "λ ~ U[1, 2] (per-row hooks)": dict(lambda_range=(1.0, 2.0)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--length", type=int, default=24, help="decoder tokens per summary")
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-source-length", type=int, default=256)
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args()
    if not DEBIAN.is_file():
        sys.exit(f"needs {DEBIAN} (../shared/data beside the project)")

    from modelshrink.steps.pseudolabel import PseudolabelOptions, pseudolabel
    from modelshrink.quickstart import warmstart_artifact
    from modelshrink.models.warmstart import packaged_minilm

    work = Path(tempfile.mkdtemp(prefix="bench-plate-"))
    teacher = warmstart_artifact(packaged_minilm(), work / "teacher")
    names = list(SETTINGS)
    # Untimed warm-up: the first generate call in a process pays for allocator and kernel setup.
    pseudolabel(PseudolabelOptions(teacher=str(teacher), data=str(DEBIAN), limit=args.batch_size,
                                   num_beams=args.beams, max_length=args.length, device="cpu"), work / "warmup")
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            options = PseudolabelOptions(
                teacher=str(teacher), data=str(DEBIAN), limit=args.docs, num_beams=args.beams,
                min_length=args.length, max_length=args.length, batch_size=args.batch_size,
                max_source_length=args.max_source_length, device="cpu", **SETTINGS[name])
            out = pseudolabel(options, work / f"r{r}-{names.index(name)}")
            metrics = json.loads((out / "modelshrink.json").read_text())["metrics"]
            seconds[name].append(metrics["seconds_this_run"])
            print(f"round {r + 1} {name}: {args.docs / metrics['seconds_this_run']:.3f} docs/s", file=sys.stderr)

    base = statistics.median(seconds[names[0]])
    rows = []
    for name in names:
        med = statistics.median(seconds[name])
        rows.append((name, args.docs / med, (med / base - 1) * 100, [args.docs / s for s in seconds[name]]))
    table = [
        f"Teacher: bert2bert warm-started from MiniLM-L6 (49M parameters), {args.docs} documents of "
        f"debian-descriptions/validation, beam {args.beams}, batch {args.batch_size}, source truncated to "
        f"{args.max_source_length} tokens, every summary exactly {args.length} tokens; {args.rounds} interleaved "
        f"rounds after an untimed warm-up, median reported. Machine: {cpu()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}. Command: `python benchmarks/pseudolabel_temperature.py"
        f"{'' if args.docs == 500 else f' --docs {args.docs}'}"
        f"{'' if args.rounds == 3 else f' --rounds {args.rounds}'}` ({time.strftime('%Y-%m-%d')}).",
        "",
        "| setting | docs/s (median) | time vs λ = 1 | every round (docs/s) |",
        "|---|---|---|---|",
    ]
    for name, rate, overhead, all_rates in rows:
        table.append(f"| {name} | {rate:.3f} | {overhead:+.1f}% | {', '.join(f'{x:.3f}' for x in all_rates)} |")
    text = "\n".join(table)
    publish("pseudolabel_temperature", "PLATE attention temperature: cost at generation time", text, write=not args.no_write)


if __name__ == "__main__":
    main()
