"""Writing a benchmark's table into BENCHMARKS.md between its own markers (rerunning replaces it)."""

import platform
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"


def write_section(name: str, title: str, text: str, intro: str = "") -> None:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    current = BENCHMARKS.read_text() if BENCHMARKS.exists() else "# Benchmarks\n"
    block = f"{begin}\n{text}\n{end}"
    if begin in current:
        before, rest = current.split(begin, 1)
        current = before + block + rest.split(end, 1)[1]
    else:
        current = current.rstrip() + f"\n\n## {title}\n\n" + (intro + "\n\n" if intro else "") + block + "\n"
    BENCHMARKS.write_text(current)


def publish(name: str, title: str, text: str, write: bool = True, intro: str = "") -> None:
    """Print a benchmark's table, and put it into BENCHMARKS.md unless the run says not to."""
    print(text)
    if write:
        write_section(name, title, text, intro)


# The vector and matrix instructions that move these benchmarks' ratios most: PyTorch's fp32 and bf16 kernels and
# onnxruntime's integer ones take other paths with and without them (an AVX2-only AMD EPYC ran this project's
# teacher 2.3x slower in PyTorch than an Intel Xeon with AMX did, its ONNX exports 1.5x slower).
_FLAGS = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_vnni": "VNNI", "avx_vnni": "AVX-VNNI",
          "avx512_bf16": "AVX-512 bf16", "amx_tile": "AMX"}


def cpu(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU's model name and its instruction sets (`AMD EPYC, x86_64, AVX2`), from /proc/cpuinfo where there is
    one (flags read by the runtime's own `cpu_flags`): 'x86_64' alone does not tell apart the machines this
    project's runs have landed on."""
    from modelshrink.runtime.cpu import cpu_flags

    name = ""
    try:
        name = next((line.partition(":")[2].strip() for line in Path(cpuinfo).read_text().splitlines()
                     if line.partition(":")[0].strip() == "model name"), "")
    except OSError:
        pass
    flags = cpu_flags(cpuinfo) or frozenset()
    found = [label for flag, label in _FLAGS.items() if flag in flags]
    return ", ".join([name or platform.processor() or "CPU", platform.machine(), *found])
