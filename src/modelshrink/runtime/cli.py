"""The runtime's command line, torch-free: `python -m modelshrink.runtime DIR --input docs.jsonl`.

`modelshrink run` is this same command line (it forwards its arguments to `main`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from .columns import ID_COLUMNS, pick_columns, text_problem
from .errors import UserError
from .jsonl import read_jsonl

DESCRIPTION = ('Summarize or classify JSON lines with an export folder (from modelshrink export); one '
               '{"id", "prediction"} per line on stdout. Imports no torch.')
EPILOG = """\
examples:
  %(prog)s runs/student-onnx --input docs.jsonl > summaries.jsonl
  %(prog)s runs/student-onnx --input docs.jsonl --num-beams 1 --limit 5

Exit codes: 1 for a bad input (one line `Error: ...` on stderr), 2 for a bad command line.
"""


def read_rows(path: str, column: str | None) -> tuple[list[dict[str, Any]], str]:
    """The rows of a JSON-lines file (.gz too) and its text column (named, or found as every step finds it)."""
    if not Path(path).is_file():
        raise UserError(f"input {path} does not exist")
    rows = list(read_jsonl(path))
    if not rows:
        raise UserError(f"{path} has no rows")
    column, _ = pick_columns(list(rows[0]), column, source=path, text_option="--column")
    for number, row in enumerate(rows, start=1):
        problem = text_problem(row, column)
        if problem:
            raise UserError(f"{path}: row {number} has no text: {problem}")
    return rows, column


# The numbers the command line takes, each >= 1 (as every modelshrink command takes them)
POSITIVE = ("limit", "batch_size", "num_beams", "max_length", "threads")


def number_problem(**values: int | None) -> str | None:
    """The first of POSITIVE given below 1, as one line naming its option (None: all are fine)."""
    for name in POSITIVE:
        value = values.get(name)
        if value is not None and value < 1:
            return f"--{name.replace('_', '-')} must be >= 1, got {value}"
    return None


def run_file(folder: str, input_path: str, column: str | None = None, limit: int | None = None,
             batch_size: int = 16, threads: int | None = None, **overrides: Any) -> Iterable[dict[str, Any]]:
    """Rows {id, prediction} for a JSON-lines file, in input order, on `threads` threads (all cores by default)."""
    from .model import load

    problem = number_problem(limit=limit, batch_size=batch_size, threads=threads, **overrides)
    if problem:
        raise UserError(problem)
    model = load(folder, threads=threads)
    rows, column = read_rows(input_path, column)
    rows = rows[:limit] if limit else rows
    texts = [str(r[column]) for r in rows]
    predictions = model.summarize(texts, batch_size, **overrides) if model.task == "summarization" \
        else model.classify(texts, batch_size=batch_size)
    for index, (row, prediction) in enumerate(zip(rows, predictions)):
        ident = next((row[c] for c in ID_COLUMNS if c in row), index)
        yield {"id": str(ident), "prediction": prediction}


def main(argv: list[str] | None = None, prog: str = "python -m modelshrink.runtime") -> int:
    import argparse
    import sys

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> None:  # one line, as every modelshrink command's usage errors
            print(f"Error: {message} (see '{prog} --help')", file=sys.stderr)
            raise SystemExit(2)

    parser = Parser(prog=prog, description=DESCRIPTION, epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="An export folder (from modelshrink export).")
    parser.add_argument("--input", "-i", required=True, help="JSON lines with a document (or text) column; .gz too.")
    parser.add_argument("--column", default=None, help="The text column. [default: found by name: document, "
                                                        "article, dialogue, text, sentence, ...]")
    parser.add_argument("--limit", type=int, default=None, help="Only the first N rows.")
    parser.add_argument("--batch-size", type=int, default=16, help="Documents per batch.")
    parser.add_argument("--num-beams", type=int, default=None, help="Beam size. [default: the generation config's]")
    parser.add_argument("--max-length", type=int, default=None, help="Maximum summary length in tokens.")
    parser.add_argument("--threads", type=int, default=None,
                        help="Threads of each onnxruntime session. [default: every core] One is faster for a small "
                             "model at --batch-size 1 (a 6+3 MiniLM student: 1.15x on 2 cores), every core at 16.")
    if argv is None:
        argv = sys.argv[1:]
    if not argv:
        parser.print_help()
        return 2
    args = parser.parse_args(argv)
    problem = number_problem(limit=args.limit, batch_size=args.batch_size, num_beams=args.num_beams,
                             max_length=args.max_length, threads=args.threads)
    if problem:
        print(f"Error: {problem}", file=sys.stderr)
        return 2
    try:
        for row in run_file(args.folder, args.input, args.column, args.limit, args.batch_size, args.threads,
                            num_beams=args.num_beams, max_length=args.max_length):
            print(json.dumps(row, ensure_ascii=False))
    except (UserError, OSError, UnicodeDecodeError) as e:
        print("Error: " + " ".join(str(e).split()), file=sys.stderr)
        return 1
    return 0
