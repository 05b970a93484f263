"""Weights kept in low bits inside an ONNX graph, run by onnxruntime's `com.microsoft` ops:
MatMulNBits for matmuls with a constant weight, GatherBlockQuantized for embedding lookups.
This module holds the format, the kernels and the checks of onnxruntime's support for them; the rewrite of a
graph into it is `modelshrink.onnx.lowbit_graph`.

A matmul Y = A·B with B [K, N] is stored by output column: each column is cut along K into blocks of
`block_size` codes, each block with one float scale and (optionally) one zero point; the weight is
(code - zero point) · scale, with zero point 2^(bits-1) where none is stored (the ops' default).
The layout is the ops' (onnxruntime's docs/ContribOperators.md):
- codes uint8 [N, n_blocks, block_size · bits / 8], 8 / bits codes a byte, the first in the lowest bits;
- scales float [N, n_blocks];
- zero points uint8 [N · ceil(n_blocks · bits / 8)], packed the same way, each column starting on a byte.
K that is not a multiple of the block size is padded with the zero point (a weight of 0).

Two layouts are smaller on disk than what the ops read, and constant nodes (`modelshrink.onnx.unpacking`) turn
them into it when a session loads the graph:
- a ternary weight's 2-bit codes (1, 2, 3 under the zero point 2) in base 3, five a byte (`pack_trits`):
  the codes of [N, n_blocks, block_size] in row-major order, byte = sum_j (code_{5i+j} - 1) · 3^j, the tail
  padded with code 2 (a weight of 0); 1.6 bits a weight, as a `quantize` artifact stores them, against 2;
- one scale a column, where every block of a column has the same one (a `quantize` artifact's per-row
  scales): float [N], expanded to [N, n_blocks].

An embedding table E [V, D] is that same object with N = V and K = D: its row v is column v of E^T, the
tied output projection. GatherBlockQuantized reads the very bytes of the codes as data [V, n_blocks,
block_size · bits / 8] quantized along axis 2 (one block each), so a table and its tied projection share
one packed copy; the lookup's [..., n_blocks, block_size] is reshaped to [..., D]. Its scales are the same
[V, n_blocks] through a Reshape to [V, n_blocks, 1] (MatMulNBits accepts only [N · n_blocks] or
[N, n_blocks]); its zero points, where there are any, are stored once more, one a byte (a small tensor).

How a matmul computes on those codes is chosen per weight (`modelshrink.onnx.kernels` measures the choice):
- `nbits`: MatMulNBits on the codes, `accuracy_level` 4: the activations are rounded to int8 per block of K
  and multiplied in integers. Codes may be stored narrower than the kernel reads them (a ternary weight in 2 bits
  for the 4-bit kernel, the faster one): constant nodes widen them when the session loads (`Blocks.narrowed`);
- `s8`: onnxruntime's integer kernel on the codes as int8 b, one scale per output column: uint8 activations
  times int8 weights, one VNNI instruction per four products (on x86 it is exact only with VNNI, which
  `modelshrink.runtime.cpu` checks, so it is offered only there; an export holding it records that it needs
  VNNI and the runtime refuses it elsewhere). Only for symmetric weights with one scale per column (a `quantize`
  artifact's, `--int8`'s symmetric codes). Its inputs are rounded as the `int8` kernel's are;
- `int8`: onnxruntime's uint8 kernel on the codes as uint8 b + 128, one scale per output column; only for
  symmetric weights with one scale per column (a `quantize` artifact's), which it then holds exactly. Where the
  model rounds the matmul's input itself (its activation bits), MatMulIntegerToFloat reads the model's own codes
  of the input (`modelshrink.onnx.rounding.integer_activations`) and computes exactly the quantized product;
  elsewhere DynamicQuantizeMatMul (the kernel of `--int8`) rounds the input to uint8 per tensor;
- `float`: a plain MatMul on the float weight.
For `int8` and `float` the graph unpacks the codes with constant ops (BitShift, Sub, Cast, Mul, Reshape, Slice,
Transpose; `modelshrink.onnx.unpacking`) that onnxruntime folds into one initializer when the session loads: the file keeps the low bits,
memory holds the weight the kernel reads.

Measured on this project's 2-core machine (onnxruntime 1.32, CPU, AVX2 without VNNI, K 768, N 3072, 1 thread,
ms, medians of 15 interleaved runs; block 128):

| rows | float MatMul | 2-bit acc 0 | 2-bit acc 4 | 4-bit acc 0 | 4-bit acc 4 | 8-bit acc 4 | int8 (u8 x u8) |
|---|---|---|---|---|---|---|---|
| 4 | 1.07 | 11.1 | 0.66 | 1.51 | 0.45 | 0.84 | 0.46 |
| 64 | 4.41 | 11.1 | 4.57 | 4.55 | 3.74 | 5.63 | 2.76 |
| 256 | 15.1 | 22.7 | 17.7 | 15.5 | 14.0 | 21.1 | 10.2 |

At accuracy level 0 (activations float) the 2- and 8-bit kernels dequantize the whole weight at every call;
level 4 makes every width fast, and the uint8 kernel is the fastest from a few rows on.

On a 2-core AMD EPYC with AVX-512 VNNI (the same onnxruntime, 2 threads, medians of 15 interleaved runs, ms):

| K x N | rows | 8-bit acc 4 | int8 (u8 x u8) | s8 (u8 x s8) |
|---|---|---|---|---|
| 768 x 3072 | 4 | 0.099 | 0.114 | 0.084 |
| 768 x 3072 | 64 | 1.16 | 1.01 | 0.456 |
| 768 x 3072 | 1024 | 16.6 | 15.0 | 6.34 |
| 768 x 50265 | 64 | 18.0 | 16.5 | 7.80 |

VNNI multiplies bytes only as unsigned by signed: the uint8 kernel widens to int16 and MatMulNBits rounds its
activations per block, while `s8` runs the instruction as it is, 2-2.4x faster from 64 rows on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

DOMAIN = "com.microsoft"
MAX_BLOCK = 256  # the 4- and 8-bit kernels are no faster with larger blocks; fewer scales to store
# onnxruntime 1.32's 2-bit MatMulNBits at accuracy level 4 takes a slow path at block 256: at 4 rows, 1 thread,
# 768x768 1.45 against 0.084 ms at block 128, 3072x768 7.0 against 0.28 (this machine, 2026-11-26)
MAX_BLOCK_2BIT = 128
NBITS, S8, INT8, FLOAT = "nbits", "s8", "int8", "float"  # how a matmul computes on stored codes (the module's text)
KERNELS = (NBITS, S8, INT8, FLOAT)
INTEGER_WEIGHTS = (S8, INT8)  # the kernels that read one code a byte, one scale a column, from unpacked codes
ACCURACY_INT8 = 4  # MatMulNBits' accuracy_level: activations rounded to int8 per block, integer products


def missing_ops(kernels: set[str] | frozenset[str] = frozenset(KERNELS)) -> list[str]:
    """The com.microsoft ops (or attributes) that the low-bit graphs computing with `kernels` need and the
    installed onnxruntime lacks; [] where it has them all, or where the build cannot be asked."""
    try:
        from onnxruntime.capi.onnxruntime_pybind11_state import get_all_operator_schema

        schemas = {s.name: s for s in get_all_operator_schema() if s.domain == DOMAIN}
    except ImportError:  # a build without schema queries: its own load error will say what is missing
        return []
    needed = {"GatherBlockQuantized": ("bits",)}
    if NBITS in kernels:
        needed["MatMulNBits"] = ("bits", "accuracy_level")
    if INT8 in kernels or S8 in kernels:
        needed["DynamicQuantizeMatMul"] = ()
        needed["MatMulIntegerToFloat"] = ()
    return [op if op not in schemas else f"{op}'s {attr}" for op, attrs in needed.items()
            for attr in (attrs if op in schemas else ("",)) if op not in schemas or attr not in schemas[op].attributes]


def available_kernels() -> tuple[str, ...]:
    """The kernels whose ops the installed onnxruntime has and that are exact on this processor (`s8` needs VNNI
    on x86, `modelshrink.runtime.cpu`)."""
    from modelshrink.runtime.cpu import signed_products_exact

    return tuple(kernel for kernel in KERNELS
                 if not missing_ops({kernel}) and (kernel != S8 or signed_products_exact()))


def require_support(what: str, kernels: set[str] | frozenset[str] = frozenset(KERNELS), avoid: str = "--int8") -> None:
    """A one-line UserError where the installed onnxruntime lacks an op (or attribute) that `what` would write:
    the export could neither validate its graphs nor would they run. `avoid` names the option that does without."""
    import onnxruntime

    from modelshrink.errors import UserError

    lacking = missing_ops(kernels)
    if lacking:
        raise UserError(f"{what} needs onnxruntime's {' and '.join(lacking)}, which onnxruntime "
                        f"{onnxruntime.__version__} lacks; upgrade onnxruntime (1.32 is tested), or export with {avoid}")


def consumers_of(graph: Any) -> dict[str, list[Any]]:
    """Tensor name -> the nodes of `graph` that read it."""
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return consumers


@dataclass
class Blocks:
    """A [K, N] weight as MatMulNBits holds it."""

    codes: np.ndarray  # uint8 [N, n_blocks, block_size], each in 0 .. 2^bits - 1
    scales: np.ndarray  # float32 [N, n_blocks]
    zero_points: np.ndarray | None  # uint8 [N, n_blocks]; None: the ops' default 2^(bits-1)
    bits: int
    k: int

    @property
    def n(self) -> int:
        return self.codes.shape[0]

    @property
    def block_size(self) -> int:
        return self.codes.shape[2]

    def weight(self) -> np.ndarray:
        """The [K, N] float weight the ops multiply by."""
        zero = self.zero_points if self.zero_points is not None else np.full(self.scales.shape, 2 ** (self.bits - 1))
        values = (self.codes.astype(np.float32) - zero[..., None].astype(np.float32)) * self.scales[..., None]
        return values.reshape(self.n, -1)[:, :self.k].T

    def narrowed(self, bits: int) -> Blocks:
        """The same weight in `bits`-wide codes under that width's default zero point: each code moves down by
        2^(self.bits-1) - 2^(bits-1). Only for codes that fit (a ternary weight's 4-bit codes 7, 8, 9 are the
        2-bit codes 1, 2, 3)."""
        if bits == self.bits:
            return self
        if self.zero_points is not None or bits > self.bits:
            raise ValueError("only codes under the default zero point narrow, and only to fewer bits")
        codes = self.codes.astype(np.int16) - (2 ** (self.bits - 1) - 2 ** (bits - 1))
        if codes.min() < 0 or codes.max() >= 2 ** bits:
            raise ValueError(f"these {self.bits}-bit codes do not fit in {bits} bits")
        return Blocks(codes.astype(np.uint8), self.scales, None, bits, self.k)


def per_column(blocks: Blocks) -> bool:
    """Whether the uint8 kernel holds `blocks` exactly: one scale a column, and either the default zero point or
    8-bit codes with one zero point a column."""
    same_scale = bool(np.all(blocks.scales == blocks.scales[:, :1]))
    if blocks.zero_points is None:
        return same_scale
    return same_scale and blocks.bits == 8 and bool(np.all(blocks.zero_points == blocks.zero_points[:, :1]))


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """8 / bits codes a byte along the last axis (padded with zeros), the first in the lowest bits."""
    per = 8 // bits
    if codes.shape[-1] % per:
        pad = per - codes.shape[-1] % per
        codes = np.concatenate([codes, np.zeros((*codes.shape[:-1], pad), dtype=codes.dtype)], axis=-1)
    packed = np.zeros((*codes.shape[:-1], codes.shape[-1] // per), dtype=np.uint8)
    for j in range(per):
        packed |= (codes[..., j::per].astype(np.uint8) << (bits * j)).astype(np.uint8)
    return packed


TRITS_PER_BYTE = 5  # 3^5 = 243 <= 256


def ternary(blocks: Blocks) -> bool:
    """Whether `blocks` are a ternary weight's 2-bit codes (1, 2, 3 under the default zero point), which
    `pack_trits` stores five a byte."""
    return (blocks.bits == 2 and blocks.zero_points is None and blocks.codes.size > 0
            and int(blocks.codes.min()) >= 1)


def pack_trits(codes: np.ndarray) -> np.ndarray:
    """2-bit codes in 1..3 (any shape) as 1-D uint8, five a byte in base 3 (the module's text)."""
    digits = codes.reshape(-1).astype(np.int16) - 1
    if digits.size and (digits.min() < 0 or digits.max() > 2):
        raise ValueError("only a ternary weight's codes (1, 2, 3) pack in base 3")
    digits = np.concatenate([digits, np.ones(-digits.size % TRITS_PER_BYTE, dtype=np.int16)])
    return (digits.reshape(-1, TRITS_PER_BYTE) * 3 ** np.arange(TRITS_PER_BYTE)).sum(axis=1).astype(np.uint8)


def trit_table() -> np.ndarray:
    """uint8 [243, 5]: the five 2-bit codes each base-3 byte holds (a lookup the graph decodes with)."""
    values = np.arange(3 ** TRITS_PER_BYTE)
    return np.stack([values // 3 ** j % 3 + 1 for j in range(TRITS_PER_BYTE)], axis=1).astype(np.uint8)


def unpack_trits(packed: np.ndarray, count: int) -> np.ndarray:
    """The first `count` codes `pack_trits` stored, 1-D uint8."""
    return trit_table()[packed.astype(np.int64)].reshape(-1)[:count]


def unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    per, mask = 8 // bits, (1 << bits) - 1
    codes = np.stack([(packed >> (bits * j)) & mask for j in range(per)], axis=-1)
    return codes.reshape(*packed.shape[:-1], -1)[..., :count].astype(np.uint8)


def kernel_block(kernel: str, bits: int, block_size: int) -> int:
    """The block size a weight blocked by `block_size` (a power of two) is stored with for `kernel` at `bits`:
    at most MAX_BLOCK_2BIT for 2-bit MatMulNBits, else `block_size` itself."""
    return min(block_size, MAX_BLOCK_2BIT) if kernel == NBITS and bits == 2 else block_size


def block_size_for(k: int, most: int = MAX_BLOCK) -> int | None:
    """The largest power of two in [16, most] that divides k (fewest scales; no padding), else None."""
    size = most
    while size >= 16:
        if k % size == 0:
            return size
        size //= 2
    return None


def integer_blocks(b: np.ndarray, scale: np.ndarray, bits: int, block_size: int) -> Blocks:
    """Blocks of an integer weight b [K, N] (|b| < 2^(bits-1)) with one scale per column [N] or for all [],
    stored as codes b + 2^(bits-1) under the default zero point: exactly the values scale · b."""
    k, n = b.shape
    blocks = -(-k // block_size)
    zero = 2 ** (bits - 1)
    padded = np.full((blocks * block_size, n), zero, dtype=np.uint8)  # b + zero is in [1, 2^bits - 1]
    np.add(b, np.int16(zero), out=padded[:k], casting="unsafe")  # no copy of b: a real-size vocabulary's is 200 MB
    codes = np.ascontiguousarray(padded.T).reshape(n, blocks, block_size)
    scales = np.broadcast_to(np.asarray(scale, dtype=np.float32).reshape(-1, 1) if np.ndim(scale) else
                             np.float32(scale), (n, blocks)).astype(np.float32)
    return Blocks(codes, np.ascontiguousarray(scales), None, bits, k)
