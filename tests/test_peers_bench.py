"""benchmarks/peers.py runs end to end on a tiny model (--small): every system it can load gives a row."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "peers.py"


def test_peers_small_run_measures_every_available_system(tmp_path):
    has_ct2 = importlib.util.find_spec("ctranslate2") is not None
    systems = "torch,fp32,int8,int4" + (",ct2-fp32,ct2-int8" if has_ct2 else "")
    result = subprocess.run([sys.executable, str(BENCH), "--small", "--docs", "2", "--rounds", "1", "--no-write",
                             "--systems", systems, "--output", str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {line.split(" | ")[0].strip("| ") for line in result.stdout.splitlines() if line.startswith("| ")}
    assert {"PyTorch eager fp32", "modelshrink runtime fp32", "modelshrink runtime int8",
            "modelshrink runtime int4"} <= rows
    report = json.loads((tmp_path / "peers.json").read_text())
    assert set(report["results"]) == set(systems.split(","))
    for name, got in report["results"].items():
        assert got["lengths"] == [8], name  # every system generated exactly --length tokens
    assert report["results"]["fp32"]["same"] == 2  # float32 ONNX gives PyTorch's tokens
    assert report["exports"]["fp32"]["check"] == "passed"
    if has_ct2:
        assert {"CTranslate2 fp32", "CTranslate2 int8"} <= rows
        assert report["student_ct2"].startswith("No conversion is registered")  # no bert2bert converter
    else:
        assert "ctranslate2 is not installed" in result.stderr
