"""benchmarks/batch_invariance.py runs end to end on a tiny float model (issue 80's measurement): PyTorch and its
export give each document the summary it gets at batch 1 in other batch mates; a run without a form's artifact is
one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "batch_invariance.py"


@pytest.mark.slow
def test_float_forms_are_batch_invariant_on_a_tiny_model(plain_models, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    shutil.copytree(plain_models["bart"], run / "student-lambda2")
    monkeypatch.syspath_prepend(str(BENCH.parent))
    import batch_invariance

    report = tmp_path / "counts.json"
    monkeypatch.setattr(sys, "argv", [str(BENCH), "--run", str(run), "--forms", "torch-float,export-float",
                                      "--docs", "5", "--batches", "2,5", "--beams", "1,2", "--max-length", "8",
                                      "--work", str(tmp_path / "work"), "--json", str(report), "--no-write"])
    batch_invariance.main()
    counts = json.loads(report.read_text())
    assert counts == {form: {f"beam {k}": {"batch 2": 5, "batch 5": 5} for k in (1, 2)}
                      for form in ("torch-float", "export-float")}
    out = capsys.readouterr().out
    assert "| torch-float | 5/5 (100%) | 5/5 (100%) | 5/5 (100%) | 5/5 (100%) |" in out


def test_a_run_without_a_forms_artifact_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH), "--run", str(tmp_path), "--forms", "torch-2-2-8",
                           "--no-write"], capture_output=True, text=True, timeout=120, cwd=BENCH.parent)
    assert done.returncode == 1 and done.stderr.strip() == (
        f"Error: {tmp_path} has no student-lambda2-2-2-8: point --run at a quickstart run (modelshrink quickstart), "
        "or leave out the forms that need them with --forms")
