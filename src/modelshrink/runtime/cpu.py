"""What the processor offers the integer kernels: whether uint8 x int8 products are exact here.

onnxruntime multiplies uint8 activations by int8 weights (the `s8` kernel of `modelshrink.onnx.lowbit`) with
one instruction on x86 processors with VNNI (AVX-512 VNNI, AVX-VNNI, AMX), which adds four byte products into
an int32, and on ARM with widening multiplies: exact. On x86 without VNNI it uses AVX2's vpmaddubsw, which adds
two products into a saturating int16 (2 x 255 x 127 > 32767), so a weight near +-127 against a large activation
clips the sum. An export holding such weights records that it needs VNNI; the runtime refuses it on an x86
processor without, rather than returning clipped sums.
"""

from __future__ import annotations

import platform
from pathlib import Path

VNNI = "vnni"
# /proc/cpuinfo's flags for the instructions that add byte products into int32 without an int16 step
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset[str] | None:
    """The first processor's flags from /proc/cpuinfo; None where there is no such file (not Linux)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def signed_products_exact(machine_x86: bool | None = None, flags: frozenset[str] | None = None) -> bool:
    """Whether onnxruntime's uint8 x int8 kernels add their products exactly on this processor: any ARM, or x86
    with VNNI. An x86 processor whose flags cannot be read counts as without (the safe side)."""
    if not (_x86() if machine_x86 is None else machine_x86):
        return True
    flags = cpu_flags() if flags is None else flags
    return bool(flags and flags & VNNI_FLAGS)


def missing_features(needed: list[str] | tuple[str, ...]) -> list[str]:
    """Of the processor features an export records that it needs (`VNNI`), those this processor lacks."""
    return [feature for feature in needed if feature == VNNI and not signed_products_exact()]
