"""Keep README's quickstart table equal to what the main command printed.

    python recipes/quickstart_table.py modelshrink-quickstart          # a run's table and its export folder
    python recipes/quickstart_table.py modelshrink-quickstart --write  # record the run, rewrite README's table
    python recipes/quickstart_table.py --check                         # README's table is the recorded run's

A run of `modelshrink quickstart` writes `summary.json` (its comparison of the five systems) and prints this
table. Without --write this script only prints it, with the folder of the run's export. With --write it keeps the
numbers README shows in `reproduction/quickstart.json` (with the date) and renders README's table from that
record between the `<!-- quickstart-table -->` markers; `tests/test_tables.py` checks the table is the record's,
and that a quickstart run's summary renders. ROUGE is the same on every run of the same versions; latency is
the machine's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

from modelshrink.quickstart import render_table, table_rows

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RECORD = ROOT / "reproduction" / "quickstart.json"
START, END = "<!-- quickstart-table -->", "<!-- /quickstart-table -->"


def record_of(summary: dict) -> dict:
    """What README's table keeps of a quickstart run's summary.json."""
    return {"date": dt.date.today().isoformat(), "source": "summary.json of `modelshrink quickstart`",
            "systems": table_rows(summary["comparison"])}


def render(record: dict) -> str:
    """The markdown table, as `modelshrink quickstart` prints it."""
    return render_table(record["systems"])


def readme_table(text: str) -> str:
    if START not in text or END not in text:
        raise SystemExit(f"README.md has no {START} ... {END} block")
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n")


def rewrite(text: str, table: str) -> str:
    head, rest = text.split(START, 1)
    return f"{head}{START}\n{table}\n{END}{rest.split(END, 1)[1]}"


def export_line(summary: dict) -> str:
    """Where the run's exported model is, and how to serve it."""
    export = summary.get("export") or {}
    if not export.get("folder"):
        return "this run has no export"
    return (f"the export ({export.get('check', 'not checked')} its check against PyTorch): {export['folder']}\n"
            f"  modelshrink run {export['folder']} --input documents.jsonl")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="?", help="a quickstart output folder (with summary.json): print its table")
    parser.add_argument("--write", action="store_true", help="record the run in reproduction/quickstart.json and "
                        "rewrite README's table from the record (without a run: from the record as it is)")
    parser.add_argument("--check", action="store_true", help="only check README's table against the record")
    args = parser.parse_args(argv)
    if args.check and (args.run or args.write):
        parser.error("--check reads the record and README only: give neither a run nor --write")
    summary = json.loads((Path(args.run) / "summary.json").read_text()) if args.run else None
    if summary is not None and not args.write:  # look only: README and the record stay as they are
        print(render_table(table_rows(summary["comparison"])))
        print(export_line(summary))
        return 0
    if summary is not None:
        RECORD.write_text(json.dumps(record_of(summary), indent=2, ensure_ascii=False) + "\n")
    table = render(json.loads(RECORD.read_text()))
    text = README.read_text()
    if args.check:
        if readme_table(text) != table:
            print("README.md's quickstart table is not reproduction/quickstart.json's:\n" + table, file=sys.stderr)
            return 1
        return 0
    if args.write:
        README.write_text(rewrite(text, table))
    print(table)
    if summary is not None:
        print(export_line(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
