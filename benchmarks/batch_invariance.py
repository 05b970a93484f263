"""Does a document's output depend on its batch mates? For each form the chain makes, the share of documents whose
summary at batch 1 equals its summary at larger batches, greedy and at beam 4 (issue 80, item 1: measure first).

    python benchmarks/batch_invariance.py --run modelshrink-quickstart --docs 200
    python benchmarks/batch_invariance.py --forms torch-float,export-int8 --docs 32 --no-write   # part of it

The forms (each where --run has what it needs; a quickstart run has all):
- torch-float: the λ = 2 student in PyTorch (`student-lambda2`);
- torch-8-8-8, torch-2-2-8: its `quantize` artifacts (DQ-BART's per-tensor activation scales);
- export-float, export-int8, export-int4: `modelshrink export` of the float student, run by the torch-free runtime;
- export-2-2-8: the 2-2-8 artifact exported on its low-bit kernels.

PyTorch forms generate through `modelshrink pseudolabel` (transformers' generate: `--generator transformers`, λ = 1);
exports through `modelshrink.runtime`. The documents (the bundled sample's validation descriptions, or --data) are
shuffled into another order for each batch size, so a document meets other batch mates at 16 than at 64; the
summaries are compared as strings, document by document, with those at batch 1. Exports are written under --work
(a temporary folder by default) and reused when they are there.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from _report import cpu, publish

FORMS = ("torch-float", "torch-8-8-8", "torch-2-2-8", "export-float", "export-int8", "export-int4", "export-2-2-8")
# the run's folder each form starts from, and for exports the flags
SOURCES = {"torch-float": "student-lambda2", "torch-8-8-8": "student-lambda2-8-8-8",
           "torch-2-2-8": "student-lambda2-2-2-8", "export-float": "student-lambda2",
           "export-int8": "student-lambda2", "export-int4": "student-lambda2", "export-2-2-8": "student-lambda2-2-2-8"}
FLAGS = {"export-int8": {"int8": True}, "export-int4": {"int4": True}}
TITLE = "Batch invariance: the same document, the same summary?"
INTRO = ("`benchmarks/batch_invariance.py` (issue 80): for each form the chain makes of the quickstart's λ = 2 "
         "student, the documents whose summary at batch 16 and at batch 64, shuffled among other batch mates, equals "
         "the one it gets alone (batch 1). A form whose activations are quantized with one scale for the whole "
         "tensor (DQ-BART's, and onnxruntime's dynamic int8) lets a batch mate change a document's rounding; float "
         "activations (the float forms, --int4's weight-only kernels) do not.")


def read_documents(data: Path | None, count: int) -> list[dict[str, str]]:
    from modelshrink.quickstart import sample_path

    path = data or sample_path("validation")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:count]
    return [{"id": str(row.get("id", i)), "document": row["document"]} for i, row in enumerate(rows)]


def shuffled(docs: list[dict[str, str]], batch: int) -> list[dict[str, str]]:
    """The documents in an order of their own for this batch size (batch 1: as read)."""
    order = list(docs)
    if batch > 1:
        random.Random(batch).shuffle(order)
    return order


def torch_summaries(model: Path, docs: list[dict[str, str]], batch: int, beams: int, args: argparse.Namespace,
                    work: Path) -> dict[str, str]:
    from modelshrink.steps.pseudolabel import PseudolabelOptions, pseudolabel

    data = work / f"docs-{batch}.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in shuffled(docs, batch)))
    options = PseudolabelOptions(teacher=str(model), data=str(data), batch_size=batch, num_beams=beams,
                                 max_length=args.max_length, lam=1.0, generator="transformers", device="cpu",
                                 max_source_length=args.max_source_length)
    out = pseudolabel(options, work / f"labels-{model.name}-{batch}-{beams}", overwrite=True)
    rows = [json.loads(line) for line in (out / "data.jsonl").read_text().splitlines()]
    return {row["id"]: row["summary"] for row in rows}


def exported(form: str, model: Path, work: Path) -> Path:
    from modelshrink.steps.export import ExportOptions, export_model

    folder = work / form
    if not (folder / "modelshrink.json").is_file():
        export_model(ExportOptions(model=str(model), samples=2, generation_docs=2, **FLAGS.get(form, {})), folder,
                     overwrite=True)
    return folder


def export_summaries(runtime: object, docs: list[dict[str, str]], batch: int, beams: int,
                     args: argparse.Namespace) -> dict[str, str]:
    order = shuffled(docs, batch)
    texts = runtime.summarize([d["document"] for d in order], batch_size=batch, num_beams=beams,
                              max_length=args.max_length, max_source_length=args.max_source_length)
    return {d["id"]: text for d, text in zip(order, texts)}


def measure(form: str, run: Path, docs: list[dict[str, str]], args: argparse.Namespace,
            work: Path) -> dict[str, dict[str, int]]:
    """{"beam K": {"batch B": documents equal to batch 1's}} for one form."""
    model = run / SOURCES[form]
    runtime = None
    if form.startswith("export"):
        from modelshrink.runtime.model import load

        runtime = load(exported(form, model, work))
    found: dict[str, dict[str, int]] = {}
    for beams in args.beams:
        summaries = {}
        for batch in [1, *args.batches]:
            started = time.perf_counter()
            summaries[batch] = (export_summaries(runtime, docs, batch, beams, args) if runtime is not None
                                else torch_summaries(model, docs, batch, beams, args, work))
            print(f"{form} beam {beams} batch {batch}: {time.perf_counter() - started:.0f} s", file=sys.stderr,
                  flush=True)
        found[f"beam {beams}"] = {f"batch {b}": sum(summaries[b][d["id"]] == summaries[1][d["id"]] for d in docs)
                                  for b in args.batches}
    return found


def table(results: dict[str, dict[str, dict[str, int]]], args: argparse.Namespace, count: int) -> str:
    columns = [f"beam {k} · batch {b}" for k in args.beams for b in args.batches]
    lines = [f"{count} documents; summaries equal to the same document's at batch 1, in other batch mates; "
             f"{cpu()}; `{' '.join(['python', *sys.argv])}` ({time.strftime('%Y-%m-%d')}).", "",
             "| form | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for form, found in results.items():
        cells = [found[f"beam {k}"][f"batch {b}"] for k in args.beams for b in args.batches]
        lines.append(f"| {form} | " + " | ".join(f"{c}/{count} ({100 * c / count:.0f}%)" for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", default="modelshrink-quickstart", help="a quickstart run's folder")
    parser.add_argument("--forms", default=",".join(FORMS), help=f"comma-separated, of: {', '.join(FORMS)}")
    parser.add_argument("--docs", type=int, default=200)
    parser.add_argument("--data", default=None, help="documents (jsonl with `document`) [the bundled validation]")
    parser.add_argument("--batches", default="16,64", help="batch sizes compared with batch 1")
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--max-length", type=int, default=24)
    parser.add_argument("--max-source-length", type=int, default=64)
    parser.add_argument("--work", default=None, help="where exports and labels go [a temporary folder]")
    parser.add_argument("--json", default=None, help="write the counts here too")
    parser.add_argument("--no-write", action="store_true", help="print the table; leave BENCHMARKS.md alone")
    args = parser.parse_args()
    forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    if not forms or set(forms) - set(FORMS):
        parser.error(f"--forms takes {', '.join(FORMS)}, got {args.forms!r}")
    args.batches = [int(b) for b in args.batches.split(",")]
    args.beams = [int(k) for k in args.beams.split(",")]
    run = Path(args.run)
    missing = sorted({SOURCES[f] for f in forms if not (run / SOURCES[f] / "config.json").is_file()})
    if missing:
        sys.exit(f"Error: {run} has no {', '.join(missing)}: point --run at a quickstart run "
                 "(modelshrink quickstart), or leave out the forms that need them with --forms")
    docs = read_documents(Path(args.data) if args.data else None, args.docs)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="batch-invariance-"))
    work.mkdir(parents=True, exist_ok=True)
    results = {}
    for form in forms:
        results[form] = measure(form, run, docs, args, work)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    publish("batch_invariance", TITLE, table(results, args, len(docs)), write=not args.no_write, intro=INTRO)


if __name__ == "__main__":
    main()
