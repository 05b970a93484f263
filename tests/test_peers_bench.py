"""benchmarks/peers.py runs end to end on a tiny model (--small): every system it can load gives a row."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "peers.py"


@pytest.mark.slow
def test_peers_small_run_measures_every_available_system(tmp_path, monkeypatch, capsys):
    has_ct2 = importlib.util.find_spec("ctranslate2") is not None
    systems = "torch,fp32,int8,int8-u8,int4" + (",ct2-fp32,ct2-int8" if has_ct2 else "")
    # the script's main() in this process (a process of its own would only import torch again); it sets torch's
    # threads for timings, which are not checked here: the intra-op count comes back after, and the inter-op
    # pool, which a process may size only once, is left as it is
    monkeypatch.syspath_prepend(str(BENCH.parent))
    import peers

    monkeypatch.setattr(sys, "argv", [str(BENCH), "--small", "--docs", "2", "--rounds", "1", "--no-write", "--systems",
                                      systems, "--output", str(tmp_path)])
    monkeypatch.setattr(torch, "set_num_interop_threads", lambda threads: None)
    threads = torch.get_num_threads()
    try:
        peers.main()
    finally:
        torch.set_num_threads(threads)
    result = capsys.readouterr()
    rows = {line.split(" | ")[0].strip("| ") for line in result.out.splitlines() if line.startswith("| ")}
    assert {"PyTorch eager fp32", "modelshrink runtime fp32", "modelshrink runtime int8",
            "modelshrink runtime int4", "modelshrink runtime int8, uint8 kernel"} <= rows
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
        assert "ctranslate2 is not installed" in result.err
    assert "weight-streaming bound, int8 weights" in result.out and report["bound"]["seconds"] > 0


def test_the_weight_streaming_bound_counts_what_a_decoder_step_reads(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH.parent))
    import peers

    bound = peers.streaming_bound(peers.BASE, 47, bandwidth=15e9)
    # per step 6 decoder layers x (6 x 768² + 2 x 768 x 3072) and the 50265 x 768 output projection, one byte each
    assert round(bound["step_mb"], 1) == 88.1
    assert 0.27 < bound["seconds"] < 0.29  # issue 29's estimate for BART-base's shape: about 0.28 s a document
    assert peers.memory_bandwidth(threads=1, megabytes=16, repeats=1) > 1e8
