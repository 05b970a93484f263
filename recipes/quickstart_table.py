"""Keep README's quickstart table equal to what the main command printed.

    python recipes/quickstart_table.py modelshrink-quickstart          # record a run, rewrite README's table
    python recipes/quickstart_table.py --check                         # README's table is the recorded run's

A run of `modelshrink quickstart` writes `summary.json` (its comparison of the five systems). This script keeps
the numbers README shows in `reproduction/quickstart.json` (with the date) and renders README's table from that
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

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RECORD = ROOT / "reproduction" / "quickstart.json"
START, END = "<!-- quickstart-table -->", "<!-- /quickstart-table -->"
LABELS = {"eval-teacher": "teacher (bert2bert 6-6)",
          "eval-student-lambda1": "student 6-2, λ = 1 pseudo labels",
          "eval-student-lambda2": "student 6-2, λ = 2 pseudo labels",
          "eval-student-lambda2-8-8-8": "λ = 2 student, 8-8-8",
          "eval-student-lambda2-2-2-8": "λ = 2 student, 2-2-8"}
QUALITY = (("rouge1", "ROUGE-1"), ("rouge2", "ROUGE-2"), ("rougeL", "ROUGE-L"))


def record_of(summary: dict) -> dict:
    """What the table shows of a quickstart run's summary.json."""
    systems = []
    for row in summary["comparison"]["systems"]:
        p = row.get("p_vs_first") or {}
        systems.append({"name": row["name"], **{k: row[k] for k, _ in QUALITY},
                        "significant": [k for k, _ in QUALITY if p.get(k) is not None and p[k] < 0.05],
                        "length_words": row["length_words"], "parameters": row["parameters"],
                        "bytes_on_disk": row["bytes_on_disk"], "latency_ms_p50": row["latency_ms_p50"]})
    return {"date": dt.date.today().isoformat(), "source": "summary.json of `modelshrink quickstart`",
            "systems": systems}


def render(record: dict) -> str:
    """The markdown table (* = significantly different from the first system, p < 0.05)."""
    lines = ["| system | ROUGE-1 | ROUGE-2 | ROUGE-L | words | parameters | MB on disk | p50 latency |",
             "|---|---|---|---|---|---|---|---|"]
    for s in record["systems"]:
        quality = [f"{s[k]:.2f}" + ("*" if k in s["significant"] else "") for k, _ in QUALITY]
        latency = f"{s['latency_ms_p50']:.0f} ms" if s.get("latency_ms_p50") is not None else "–"
        lines.append(f"| {LABELS.get(s['name'], s['name'])} | {' | '.join(quality)} | {s['length_words']:.1f} | "
                     f"{s['parameters'] / 1e6:.1f} M | {s['bytes_on_disk'] / 1e6:.1f} | {latency} |")
    return "\n".join(lines)


def readme_table(text: str) -> str:
    if START not in text or END not in text:
        raise SystemExit(f"README.md has no {START} ... {END} block")
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n")


def rewrite(text: str, table: str) -> str:
    head, rest = text.split(START, 1)
    return f"{head}{START}\n{table}\n{END}{rest.split(END, 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="?", help="a quickstart output folder (with summary.json) to record")
    parser.add_argument("--check", action="store_true", help="only check README's table against the record")
    args = parser.parse_args(argv)
    if args.run:
        summary = json.loads((Path(args.run) / "summary.json").read_text())
        RECORD.write_text(json.dumps(record_of(summary), indent=2, ensure_ascii=False) + "\n")
    table = render(json.loads(RECORD.read_text()))
    text = README.read_text()
    if args.check:
        if readme_table(text) != table:
            print("README.md's quickstart table is not reproduction/quickstart.json's:\n" + table, file=sys.stderr)
            return 1
        return 0
    README.write_text(rewrite(text, table))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
