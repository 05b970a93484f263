"""benchmarks/frontier.py runs end to end on a tiny random BART (--tiny): every deployable form of the chain is
made, scored against the teacher and measured; a rerun keeps what the first made."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from transformers.utils import logging as hf_logging

pytestmark = pytest.mark.slow  # end to end: see CONTRIBUTING.md, the fast loop

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "frontier.py"
# a few small training batches (--max-tokens): the run's plumbing is tested here, not what training buys
SMALL = ["--tiny", "--no-write", "--student-steps", "1", "--quantize-steps", "1", "--max-tokens", "256", "--docs", "2",
         "--latency-docs", "1", "--throughput-docs", "2", "--rounds", "1", "--no-export-check",
         "--uniform", "", "--budgets", "4x"]  # the tiny teacher at 2 bits is ~5x smaller: a 4x budget mixes


def test_frontier_tiny_run_makes_scores_and_measures_every_form(tmp_path, monkeypatch, capsys):
    # the script's main() in this process (a process of its own would only import torch again); each form's peak
    # RSS is still measured in a fresh process of its own, as the script does
    monkeypatch.syspath_prepend(str(BENCH.parent))
    import frontier

    work = tmp_path / "frontier"
    monkeypatch.setattr(sys, "argv", [str(BENCH), *SMALL, "--work", str(work)])
    threads, bars = torch.get_num_threads(), hf_logging.is_progress_bar_enabled()
    try:
        frontier.main()
    finally:  # main() sets both for the whole process
        torch.set_num_threads(threads)
        if bars:
            hf_logging.enable_progress_bar()
    stdout = capsys.readouterr().out
    report = json.loads((work / "frontier.json").read_text())
    forms, results = report["forms"], report["results"]
    assert list(forms) == ["teacher, PyTorch", "teacher, ONNX float32", "student (D 1), ONNX float32",
                           "student (D 1), ONNX --int8", "student (D 1), ONNX --int4", "8-8-8 distillation-aware, ONNX",
                           "2-2-8 distillation-aware, ONNX", "2-2-8 (D 1) distillation-aware, ONNX",
                           "budget 4x distillation-aware, ONNX"]
    for name, got in results.items():
        assert set(got["rouge"]) == {"rouge1", "rouge2", "rougeL"} and len(got["ci95"]["rougeL"]) == 2, name
        assert got["mb"] > 0 and got["rss_mb"] > 0 and got["p50_ms"] > 0 and got["docs_s"] > 0, name
        assert (got["against_teacher"] is None) == (name == "teacher, PyTorch"), name
    # each export against the PyTorch model it came from (students' three exports share one evaluation)
    pytorch = {name: got["pytorch"] for name, got in results.items() if "pytorch" in got}
    assert set(pytorch) == set(forms) - {"teacher, PyTorch"}
    assert pytorch["teacher, ONNX float32"]["within"] and len({t["path"] for t in pytorch.values() if "path" in t}) == 5
    # the teacher exported to float32 summarizes as the teacher does: a paired test of identical scores gives p = 1
    assert results["teacher, ONNX float32"]["against_teacher"]["rougeL"] == 1.0
    # each form's own process: the runtime's (no torch) holds far less than PyTorch's
    assert results["teacher, ONNX float32"]["rss_mb"] < 0.5 * results["teacher, PyTorch"]["rss_mb"]
    mb = {name: got["mb"] for name, got in results.items()}
    assert mb["2-2-8 distillation-aware, ONNX"] < mb["8-8-8 distillation-aware, ONNX"] < mb["teacher, ONNX float32"]
    assert mb["2-2-8 (D 1) distillation-aware, ONNX"] < mb["2-2-8 distillation-aware, ONNX"]
    # the budget form: its quantize artifact within the budget, compared with the uniform form nearest its size
    budget, = report["budgets"]
    teacher_mb = sum(p.stat().st_size for p in (work / "teacher").glob("*.safetensors")) / 1e6
    assert budget["budget"] == "budget 4x distillation-aware, ONNX" and budget["budget_mb"] <= teacher_mb / 4
    assert budget["uniform"] in {"2-2-8 distillation-aware, ONNX", "8-8-8 distillation-aware, ONNX"}
    assert 0 <= budget["p"]["rougeL"] <= 1
    rows = [line for line in stdout.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(forms) + 1 + len(pytorch) + 1 + 1
    assert ("Target met" in stdout or "Target not met" in stdout) and "Issue 55's target" in stdout
    # a rerun keeps every artifact the first run finished (nothing is trained or exported again)
    made = {p: p.stat().st_mtime for p in work.glob("*/modelshrink.json")}
    args = frontier.arguments().parse_args([*SMALL, "--work", str(work)])
    args.teacher, data = (str(p) for p in frontier.tiny_setup(work))
    again = frontier.make_forms(args, Path(data) / "train.jsonl.gz", log=lambda message: None)
    assert {name: str(path) for name, (_, path) in again.items()} == {name: path for name, (_, path) in forms.items()}
    assert {p: p.stat().st_mtime for p in work.glob("*/modelshrink.json")} == made
