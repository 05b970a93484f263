"""benchmarks/_report.py: every benchmark's machine line names the CPU and the instruction sets that move its
ratios (two machines of this project, both 'x86_64', ran the same teacher 2.3x apart in PyTorch)."""

from __future__ import annotations

from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"

XEON = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480C
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 amx_tile amx_bf16
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480C
flags\t\t: fpu sse2 avx2 avx512f avx512_vnni avx512_bf16 amx_tile amx_bf16
"""


def _report(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import _report

    return _report


def test_cpu_names_the_model_and_its_instruction_sets(monkeypatch, tmp_path):
    report = _report(monkeypatch)
    info = tmp_path / "cpuinfo"
    info.write_text(XEON)
    monkeypatch.setattr(report.platform, "machine", lambda: "x86_64")
    assert report.cpu(info) == "Intel(R) Xeon(R) Platinum 8480C, x86_64, AVX2, AVX-512, VNNI, AVX-512 bf16, AMX"
    info.write_text("model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2\n")
    assert report.cpu(info) == "AMD EPYC, x86_64, AVX2"


def test_cpu_without_cpuinfo_falls_back_to_the_platform(monkeypatch, tmp_path):
    report = _report(monkeypatch)
    monkeypatch.setattr(report.platform, "processor", lambda: "")
    monkeypatch.setattr(report.platform, "machine", lambda: "arm64")
    assert report.cpu(tmp_path / "absent") == "CPU, arm64"
