"""Who should search on a CPU? docs/s of `pseudolabel` with `--generator transformers` (transformers' generate) and
`--generator static` (modelshrink's fixed-shape search, run eagerly off a GPU), on one teacher and the same
documents, side by side in one run; `--generator auto` takes the static search wherever it applies (issue 54).

    python benchmarks/cpu_generation.py                          # the packaged MiniLM bert2bert, 96 documents
    python benchmarks/cpu_generation.py --teacher runs/repro/teacher --data ../shared/data/debian-descriptions/validation.jsonl.gz
    python benchmarks/cpu_generation.py --docs 4 --rounds 1 --no-write   # a smoke run

The teacher defaults to the bert2bert warm-started from the packaged MiniLM-L6 (the frontier's teacher layout; its
cross attention is untrained, so its summaries run to --max-length) and the documents to the bundled sample, so the
run needs nothing beside the project. Both generators must write the same summaries (the run stops otherwise), so
they do the same work and docs/s differs only by the search. Settings run interleaved for --rounds rounds after an
untimed warm-up of each, the median round is reported; timing is the generation loop as `pseudolabel` records it.
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

GENERATORS = ("transformers", "static")


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", help="a seq2seq model folder [default: the packaged MiniLM as a bert2bert]")
    parser.add_argument("--data", help="documents [default: the bundled sample's train split]")
    parser.add_argument("--docs", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--beams", default="4,1", help="beam sizes, comma-separated [default: 4,1]")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=32)
    parser.add_argument("--max-source-length", type=int, default=128)
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    return parser


def main() -> None:
    args = arguments().parse_args()
    from modelshrink.quickstart import sample_path
    from modelshrink.steps.pseudolabel import PseudolabelOptions, pseudolabel

    work = Path(tempfile.mkdtemp(prefix="bench-cpu-generation-"))
    teacher = args.teacher or str(minilm_teacher(work))
    data = args.data or str(sample_path("train"))
    beams = [int(b) for b in args.beams.split(",")]
    settings = [(b, g) for b in beams for g in GENERATORS]

    def run(beam: int, generator: str, out: Path, limit: int) -> tuple[float, list[str]]:
        options = PseudolabelOptions(teacher=teacher, data=data, limit=limit, num_beams=beam,
                                     max_length=args.max_length, no_repeat_ngram_size=3 if beam > 1 else None,
                                     batch_size=args.batch_size, max_source_length=args.max_source_length,
                                     device="cpu", generator=generator)
        folder = pseudolabel(options, out)
        seconds = json.loads((folder / "modelshrink.json").read_text())["metrics"]["seconds_this_run"]
        return seconds, [json.loads(line)["summary"] for line in (folder / "data.jsonl").read_text().splitlines()]

    for i, (beam, generator) in enumerate(settings):  # untimed: the first calls pay for allocation and setup
        run(beam, generator, work / f"warmup-{i}", args.batch_size)
    seconds: dict[tuple[int, str], list[float]] = {s: [] for s in settings}
    summaries: dict[tuple[int, str], list[str]] = {}
    for r in range(args.rounds):
        for beam, generator in settings[r % len(settings):] + settings[:r % len(settings)]:
            took, written = run(beam, generator, work / f"r{r}-{beam}-{generator}", args.docs)
            seconds[(beam, generator)].append(took)
            summaries[(beam, generator)] = written
            print(f"round {r + 1} beam {beam} {generator}: {args.docs / took:.2f} docs/s", file=sys.stderr)
    for beam in beams:
        if summaries[(beam, "static")] != summaries[(beam, "transformers")]:
            sys.exit(f"beam {beam}: the static search wrote other summaries than generate")
    publish("cpu_generation", "Generation on a CPU: the static search against transformers' generate",
            report(args, teacher, data, beams, seconds), write=not args.no_write)


def minilm_teacher(work: Path) -> Path:
    from modelshrink.models.warmstart import packaged_minilm
    from modelshrink.quickstart import warmstart_artifact

    return warmstart_artifact(packaged_minilm(), work / "teacher")


def report(args: argparse.Namespace, teacher: str, data: str, beams: list[int],
           seconds: dict[tuple[int, str], list[float]]) -> str:
    lines = [
        f"Teacher: {args.teacher or 'bert2bert warm-started from the packaged MiniLM-L6'}; the first {args.docs} "
        f"documents of {args.data or 'the bundled sample (train)'}, batch {args.batch_size}, sources ≤ "
        f"{args.max_source_length} tokens, summaries ≤ {args.max_length} (trigram blocking at beam > 1); "
        f"`pseudolabel --generator transformers` against `--generator static`, the same summaries (checked); "
        f"{args.rounds} interleaved rounds after an untimed warm-up, median reported. Machine: {cpu()}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}. Command: `python benchmarks/cpu_generation.py "
        f"{' '.join(sys.argv[1:])}` ({time.strftime('%Y-%m-%d')}).", "",
        "| beams | generate docs/s | static docs/s | static / generate |", "|---|---|---|---|"]
    for beam in beams:
        plain = args.docs / statistics.median(seconds[(beam, "transformers")])
        static = args.docs / statistics.median(seconds[(beam, "static")])
        lines.append(f"| {beam} | {plain:.2f} | {static:.2f} | {static / plain:.2f}× |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
