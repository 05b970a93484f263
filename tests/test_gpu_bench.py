"""benchmarks/gpu_throughput.py runs end to end on a tiny BART on the CPU (--tiny): every setting of its three parts
is measured, and modelshrink's fp32 summaries are the plain generate loop's."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from modelshrink.options.pseudolabel import PseudolabelOptions

pytestmark = pytest.mark.slow  # end to end: see CONTRIBUTING.md, the fast loop

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_throughput.py"
# one thread: the test machine's cores are shared, and torch's spinning threads slow down tenfold under contention
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def test_gpu_throughput_tiny_run_measures_every_setting(tmp_path):
    report = tmp_path / "gpu.json"
    command = [sys.executable, str(BENCH), "--tiny", "--device", "cpu", "--no-write", "--json", str(report)]
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(report.read_text())
    assert got["parts"] == ["pseudolabel", "distill", "quantize"] and got["seconds"] > 0
    # each part's table travels in the JSON too (`--publish` writes a remote run's into BENCHMARKS.md)
    assert {name: table["failures"] for name, table in got["tables"].items()} == dict.fromkeys(got["parts"], 0)

    # pseudolabel: fp32 and bf16 at both token budgets, modelshrink (each generator where the option exists: auto
    # is the static search, on a CPU too) and the plain generate loop, each with its warm-up pass apart from the
    # timed round
    systems = ([f"modelshrink (generator {g})" for g in ("auto", "transformers")]
               if "generator" in PseudolabelOptions.__dataclass_fields__ else ["modelshrink"]) + ["plain generate"]
    pseudolabel = got["pseudolabel"]
    expected = {f"{dtype} · {budget} · {system}" for dtype in ("fp32", "bf16") for budget in (128, 512)
                for system in systems}
    assert set(pseudolabel["settings"]) == expected
    for name, entry in pseudolabel["settings"].items():
        assert entry["docs_per_s"] > 0 and entry["warmup"]["docs_per_s"] > 0 and len(entry["rounds"]) == 1, name
        if entry["system"] == "plain generate":
            assert entry["summary_tokens"] == [8], name  # min_length = max_length: every summary as long
        else:
            assert entry["same_as_generate"]["of"] == 8, name
    # fp32 parity (issue 54: token for token generate's on the CPU): the same batches give every summary equal
    parity = pseudolabel["parity"]
    assert set(parity) == {n for n in expected if n.startswith("fp32") and "plain" not in n}
    assert all(p["same"] == p["of"] == 8 and p["target_met"] for p in parity.values()), parity

    distill = got["distill"]
    assert set(distill["settings"]) == {f"{p} · {s}" for p in ("fp32", "bf16")
                                        for s in ("modelshrink distill", "plain PyTorch loop")}
    for name, entry in distill["settings"].items():
        # 4 pairs of exactly 64 + 8 tokens a step: one shape, no padding, the same in both loops
        assert entry["tokens_per_s"] > 0 and entry["tokens_per_step"] == 4 * 72, name
    assert math.isfinite(distill["settings"]["fp32 · plain PyTorch loop"]["first_loss"])
    assert distill["flops_per_step"] > 0 and distill["peak_table"] is None  # a CPU has no peak in the table

    quantize = got["quantize"]
    assert set(quantize["settings"]) == {"bf16 · distill, same KD losses", "bf16 · quantize 8-8-8",
                                         "bf16 · quantize 2-2-8"}
    assert all(e["tokens_per_s"] > 0 and e["vs_distill_kd"] > 0 for e in quantize["settings"].values())

    tables = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert len(tables) == 3 * 2 + len(expected) + 4 + 3  # a header and a rule a table, then its rows
    assert "pseudolabel round 1" in done.stderr and "done in" in done.stderr  # timestamped progress


def test_a_missing_package_is_one_line_before_anything_runs():
    """Issue 79: without accelerate the training parts stop at once, naming it, instead of failing mid-run."""
    hide = ("import runpy, sys; sys.modules['accelerate'] = None; "
            f"sys.argv = [{str(BENCH)!r}, '--tiny', '--device', 'cpu', '--no-write', '--only', 'pseudolabel,distill']; "
            f"runpy.run_path({str(BENCH)!r}, run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, env=ENV, timeout=120,
                          cwd=BENCH.parent)
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        "Error: pseudolabel, distill need accelerate, which this Python does not have: pip install accelerate "
        "(without a package index: carry their wheels)"], done.stderr[-2000:]


def test_quick_is_one_size_not_two():
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--tiny"], capture_output=True, text=True, env=ENV,
                          timeout=120)
    assert done.returncode == 2 and "--quick and --tiny are two sizes: give one" in done.stderr
