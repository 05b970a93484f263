"""Weights kept in low bits inside an ONNX graph, run by onnxruntime's `com.microsoft` ops:
MatMulNBits for matmuls with a constant weight, GatherBlockQuantized for embedding lookups.

A matmul Y = A·B with B [K, N] is stored by output column: each column is cut along K into blocks of
`block_size` codes, each block with one float scale and (optionally) one zero point; the weight is
(code - zero point) · scale, with zero point 2^(bits-1) where none is stored (the ops' default).
The layout is the ops' (onnxruntime's docs/ContribOperators.md):
- codes uint8 [N, n_blocks, block_size · bits / 8], 8 / bits codes a byte, the first in the lowest bits;
- scales float [N, n_blocks];
- zero points uint8 [N · ceil(n_blocks · bits / 8)], packed the same way, each column starting on a byte.
K that is not a multiple of the block size is padded with the zero point (a weight of 0).

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
  of the input (`modelshrink.onnx.compress.integer_activations`) and computes exactly the quantized product;
  elsewhere DynamicQuantizeMatMul (the kernel of `--int8`) rounds the input to uint8 per tensor;
- `float`: a plain MatMul on the float weight.
For `int8` and `float` the graph unpacks the codes with constant ops (BitShift, Sub, Cast, Mul, Reshape, Slice,
Transpose) that onnxruntime folds into one initializer when the session loads: the file keeps the low bits,
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
    padded = np.full((blocks * block_size, n), zero, dtype=np.int16)
    padded[:k] = b.astype(np.int16) + zero
    codes = padded.T.reshape(n, blocks, block_size).astype(np.uint8)
    scales = np.broadcast_to(np.asarray(scale, dtype=np.float32).reshape(-1, 1) if np.ndim(scale) else
                             np.float32(scale), (n, blocks)).astype(np.float32)
    return Blocks(codes, np.ascontiguousarray(scales), None, bits, k)


class LowBitGraph:
    """An ONNX model being rewritten: float initializers replaced by packed codes and the ops that read them."""

    def __init__(self, model: Any):
        self.model, self.graph = model, model.graph
        self.consumers = consumers_of(self.graph)
        self.removed: set[str] = set()
        self.added: list[Any] = []
        self.after: list[tuple[Any, list[Any]]] = []  # (node, nodes to insert right after it)
        self.bytes_before = self.bytes_after = 0
        self.constants: set[str] = set()
        self.before: list[Any] = []  # constant nodes that unpack codes, folded when a session loads the graph
        self.unpacked: dict[tuple[str, str], tuple[str, ...]] = {}
        self.kernels: dict[str, int] = {}  # kernel -> matmul nodes computing with it
        self.widths: set[int] = set()  # bits of the codes stored
        self.integer_nodes: list[Any] = []  # the nodes whose kernel rounds its activations to integers itself
        self.values = self.stored_values = 0  # weights the packed tensors represent, and the elements they hold

    # ------------------------------------------------------------ which initializers qualify

    def matmul_weight(self, init: Any) -> bool:
        """A 2-D float initializer read only as B of plain MatMuls."""
        import onnx

        users = self.consumers.get(init.name, [])
        return bool(users) and init.data_type == onnx.TensorProto.FLOAT and len(init.dims) == 2 and all(
            n.op_type == "MatMul" and n.domain in ("", "ai.onnx") and list(n.input).index(init.name) == 1
            and n.input[0] != init.name for n in users)

    def gather_table(self, init: Any) -> bool:
        """A 2-D float initializer read only by Gather on axis 0 (an embedding table)."""
        import onnx

        users = self.consumers.get(init.name, [])
        return bool(users) and init.data_type == onnx.TensorProto.FLOAT and len(init.dims) == 2 and all(
            n.op_type == "Gather" and n.input[0] == init.name and all(a.i == 0 for a in n.attribute if a.name == "axis")
            for n in users)

    # ------------------------------------------------------------ rewrites

    def _store(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.added.append(numpy_helper.from_array(value, name))
        self.bytes_after += value.nbytes
        self.stored_values += value.size
        return name

    def _remove(self, init: Any) -> None:
        self.removed.add(init.name)
        self.bytes_before += int(np.prod(init.dims)) * 4

    def _packed(self, name: str, blocks: Blocks) -> tuple[str, str, str | None]:
        self.values += blocks.k * blocks.n
        self.widths.add(blocks.bits)
        codes = self._store(name + "_q", pack(blocks.codes, blocks.bits))
        scales = self._store(name + "_scales", blocks.scales)
        zero = None
        if blocks.zero_points is not None:
            zero = self._store(name + "_zero_points", pack(blocks.zero_points, blocks.bits).reshape(-1))
        return codes, scales, zero

    def _load_time(self, name: str, value: np.ndarray) -> str:
        """A constant the unpacking nodes read, stored once under `name` (not a weight: the parameter count
        leaves it out)."""
        from onnx import numpy_helper

        if name not in self.constants:
            self.constants.add(name)
            self.added.append(numpy_helper.from_array(value, name))
            self.bytes_after += value.nbytes
            self.stored_values += value.size
        return name

    def _codes_by_row(self, packed: str, bits: int, rows: int, count: int, nodes: list[Any]) -> str:
        """Nodes for the first `count` codes of each row of a tensor packed `bits` a code row by row (`pack`'s
        layout), as [rows, count] uint8; code j of a byte is (byte >> bits·j) - ((byte >> bits·(j+1)) << bits),
        BitShift alone (opset 11)."""
        from onnx import helper

        flat = self._load_time(f"lowbit_rows_{rows}", np.array([rows, -1], dtype=np.int64))
        split, per = f"{packed}_by_row", 8 // bits
        nodes.append(helper.make_node("Reshape", [packed, flat], [split]))
        if per > 1:
            last = self._load_time("lowbit_last_axis", np.array([-1], dtype=np.int64))
            for j in range(per):
                low = f"{packed}_s{j}"
                nodes.append(helper.make_node("BitShift", [split, self._load_time(
                    f"lowbit_shift_{bits * j}", np.array(bits * j, dtype=np.uint8))], [low], direction="RIGHT"))
                if j + 1 < per:
                    high, width = (self._load_time(f"lowbit_shift_{v}", np.array(v, dtype=np.uint8))
                                   for v in (bits * (j + 1), bits))
                    nodes += [helper.make_node("BitShift", [split, high], [f"{packed}_h{j}"], direction="RIGHT"),
                              helper.make_node("BitShift", [f"{packed}_h{j}", width], [f"{packed}_hl{j}"],
                                               direction="LEFT"),
                              helper.make_node("Sub", [low, f"{packed}_hl{j}"], [f"{packed}_c{j}"])]
                    low = f"{packed}_c{j}"
                nodes.append(helper.make_node("Unsqueeze", [low, last], [f"{packed}_u{j}"]))
            nodes += [helper.make_node("Concat", [f"{packed}_u{j}" for j in range(per)], [f"{packed}_pairs"], axis=-1),
                      helper.make_node("Reshape", [f"{packed}_pairs", flat], [f"{packed}_unpacked"])]
            split = f"{packed}_unpacked"
        return self._slice(split, count, nodes)

    def _slice(self, name: str, count: int, nodes: list[Any]) -> str:
        """Nodes for name[:, :count]."""
        from onnx import helper

        start, end, axis = (self._load_time(f"lowbit_{w}_{v}", np.array([v], dtype=np.int64))
                            for w, v in (("start", 0), ("end", count), ("axis", 1)))
        nodes.append(helper.make_node("Slice", [name, start, end, axis], [f"{name}_{count}"]))
        return f"{name}_{count}"

    def _widened(self, packed: tuple[str, str, str | None], stored: Blocks, bits: int) -> str:
        """Nodes that turn codes stored `stored.bits` wide into MatMulNBits' `bits`-wide codes [N, n_blocks,
        block_size · bits / 8], folded by onnxruntime when it loads the graph: each code moves up by the zero
        points' difference 2^(bits-1) - 2^(stored.bits-1), and 8 / bits codes share a byte, the first in the
        lowest bits (a ternary weight is stored in 2 bits and computes with the 4-bit kernel)."""
        from onnx import helper

        codes = packed[0]
        if (codes, f"{NBITS}/{bits}") in self.unpacked:
            return self.unpacked[(codes, f"{NBITS}/{bits}")][0]
        n, groups = stored.scales.shape
        per, nodes = 8 // bits, []
        by_row = self._codes_by_row(codes, stored.bits, n, groups * stored.block_size, nodes)
        offset = self._load_time(f"lowbit_widen_{stored.bits}_{bits}",
                                 np.array(2 ** (bits - 1) - 2 ** (stored.bits - 1), dtype=np.uint8))
        by_byte = self._load_time(f"lowbit_shape_{n}_-1_{per}", np.array([n, -1, per], dtype=np.int64))
        nodes += [helper.make_node("Add", [by_row, offset], [f"{codes}_w{bits}"]),
                  helper.make_node("Reshape", [f"{codes}_w{bits}", by_byte], [f"{codes}_w{bits}_by_byte"])]
        total = ""
        for j in range(per):  # code j of each byte, shifted to its place, summed (the places do not overlap)
            start, end, axis = (self._load_time(f"lowbit_{w}_{v}", np.array([v], dtype=np.int64))
                                for w, v in (("start", j), ("end", j + 1), ("axis", 2)))
            part = f"{codes}_w{bits}_{j}"
            nodes.append(helper.make_node("Slice", [f"{codes}_w{bits}_by_byte", start, end, axis], [part]))
            if j:
                shift = self._load_time(f"lowbit_shift_{bits * j}", np.array(bits * j, dtype=np.uint8))
                nodes.append(helper.make_node("BitShift", [part, shift], [part + "_placed"], direction="LEFT"))
                nodes.append(helper.make_node("Add", [total, part + "_placed"], [part + "_sum"]))
                part += "_sum"
            total = part
        layout = self._load_time(f"lowbit_shape_{n}_{groups}_{stored.block_size * bits // 8}",
                                 np.array([n, groups, stored.block_size * bits // 8], dtype=np.int64))
        nodes.append(helper.make_node("Reshape", [total, layout], [f"{codes}_as_{bits}_bits"]))
        for node in nodes:
            node.name = node.output[0]
        self.before += nodes
        self.unpacked[(codes, f"{NBITS}/{bits}")] = (f"{codes}_as_{bits}_bits",)
        return f"{codes}_as_{bits}_bits"

    def _unpacked(self, packed: tuple[str, str, str | None], blocks: Blocks, kernel: str) -> tuple[str, ...]:
        """Nodes that turn the stored codes into what `kernel` reads, folded by onnxruntime when it loads the graph:
        INT8: (uint8 b + 128 [K, N], scale per column [N], zero point 128 [N]); S8: (int8 b [K, N], scale per
        column [N], zero point 0 [N]); FLOAT: (weight [K, N],)."""
        from onnx import TensorProto, helper

        codes, scales, zero = packed
        if (codes, kernel) in self.unpacked:
            return self.unpacked[(codes, kernel)]
        if any(key[0] == codes for key in self.unpacked):
            raise ValueError(f"{codes} is already read by another kernel in this graph")
        n, groups, bits = blocks.n, blocks.scales.shape[1], blocks.bits
        nodes: list[Any] = []
        if kernel == S8:
            if not per_column(blocks) or zero is not None:
                raise ValueError("the s8 kernel takes symmetric codes with one scale per column")
            first = self._load_time("lowbit_first_block", np.array(0, dtype=np.int64))
            by_row = self._codes_by_row(codes, bits, n, blocks.k, nodes)
            # codes b + 2^(bits-1) as the signed b: widened to int16 to subtract, then narrowed (|b| <= 127)
            offset = self._load_time(f"lowbit_centre_{bits}", np.array(2 ** (bits - 1), dtype=np.int16))
            nodes += [helper.make_node("Cast", [by_row], [f"{codes}_i16_rows"], to=TensorProto.INT16),
                      helper.make_node("Sub", [f"{codes}_i16_rows", offset], [f"{codes}_i16_centred"]),
                      helper.make_node("Cast", [f"{codes}_i16_centred"], [f"{codes}_s8_rows"], to=TensorProto.INT8),
                      helper.make_node("Transpose", [f"{codes}_s8_rows"], [f"{codes}_s8"], perm=[1, 0]),
                      helper.make_node("Gather", [scales, first], [f"{codes}_column_scale"], axis=1)]
            column_zero = self._load_time(f"lowbit_zero_s8_{n}", np.zeros(n, dtype=np.int8))
            result = (f"{codes}_s8", f"{codes}_column_scale", column_zero)
        elif kernel == INT8:
            if not per_column(blocks):
                raise ValueError("the int8 kernel takes one scale per column, and zero points only with 8-bit codes "
                                 "and one per column")
            first = self._load_time("lowbit_first_block", np.array(0, dtype=np.int64))
            by_row = self._codes_by_row(codes, bits, n, blocks.k, nodes)
            if zero is None:  # symmetric codes b + 2^(bits-1) as uint8 b + 128 under the zero point 128
                offset = self._load_time(f"lowbit_to_u8_{bits}", np.array(128 - 2 ** (bits - 1), dtype=np.uint8))
                nodes.append(helper.make_node("Add", [by_row, offset], [f"{codes}_u8_rows"]))
                by_row = f"{codes}_u8_rows"
                column_zero = self._load_time(f"lowbit_zero_128_{n}", np.full(n, 128, dtype=np.uint8))
            else:  # 8-bit codes are uint8 already; each column's zero point is its first block's
                nodes += [helper.make_node("Reshape", [zero, self._load_time(f"lowbit_shape_{n}_{groups}", np.array(
                              [n, groups], dtype=np.int64))], [f"{codes}_zero_blocks"]),
                          helper.make_node("Gather", [f"{codes}_zero_blocks", first], [f"{codes}_column_zero"], axis=1)]
                column_zero = f"{codes}_column_zero"
            nodes += [helper.make_node("Transpose", [by_row], [f"{codes}_u8"], perm=[1, 0]),
                      helper.make_node("Gather", [scales, first], [f"{codes}_column_scale"], axis=1)]
            result = (f"{codes}_u8", f"{codes}_column_scale", column_zero)
        elif kernel == FLOAT:  # (code - zero point) · scale, block by block, padding cut off last
            shape3, scale3 = (self._load_time(f"lowbit_shape_{n}_{groups}_{last}",
                                              np.array([n, groups, last], dtype=np.int64)) for last in (-1, 1))
            by_row = self._codes_by_row(codes, bits, n, groups * blocks.block_size, nodes)
            if zero is not None:
                nodes += [helper.make_node("Cast", [self._codes_by_row(zero, bits, n, groups, nodes)],
                                           [f"{codes}_zero_float"], to=TensorProto.FLOAT),
                          helper.make_node("Reshape", [f"{codes}_zero_float", scale3], [f"{codes}_zero3"])]
                zeros = f"{codes}_zero3"
            else:
                zeros = self._load_time(f"lowbit_zero_{bits}", np.array(2 ** (bits - 1), dtype=np.float32))
            flat = self._load_time(f"lowbit_rows_{n}", np.array([n, -1], dtype=np.int64))
            nodes += [helper.make_node("Cast", [by_row], [f"{codes}_float_codes"], to=TensorProto.FLOAT),
                      helper.make_node("Reshape", [f"{codes}_float_codes", shape3], [f"{codes}_blocks"]),
                      helper.make_node("Sub", [f"{codes}_blocks", zeros], [f"{codes}_centred"]),
                      helper.make_node("Reshape", [scales, scale3], [f"{codes}_scales3"]),
                      helper.make_node("Mul", [f"{codes}_centred", f"{codes}_scales3"], [f"{codes}_values"]),
                      helper.make_node("Reshape", [f"{codes}_values", flat], [f"{codes}_value_rows"])]
            nodes.append(helper.make_node("Transpose", [self._slice(f"{codes}_value_rows", blocks.k, nodes)],
                                          [f"{codes}_float"], perm=[1, 0]))
            result = (f"{codes}_float",)
        else:
            raise ValueError(f"{kernel!r} reads the codes themselves")
        for node in nodes:
            node.name = node.output[0]
        self.before += nodes
        self.unpacked[(codes, kernel)] = result
        return result

    def as_matmul(self, init: Any, blocks: Blocks, packed: tuple[str, str, str | None] | None = None,
                  kernel: str = NBITS, stored_bits: int | None = None, stored: Blocks | None = None) -> int:
        """Every MatMul reading `init` computes on the packed blocks with `kernel` (NBITS, S8, INT8 or FLOAT, see the
        module's text); returns the nodes changed. `stored_bits` narrower than the blocks' bits stores their codes
        that wide (`Blocks.narrowed`), widened for MatMulNBits when the graph loads; `stored` is those narrowed
        blocks when the caller already has them (the codes `packed` holds)."""
        from onnx import helper

        self._remove(init)
        stored = stored or blocks.narrowed(stored_bits or blocks.bits)
        packed = packed or self._packed(init.name, stored)
        codes, scales, zero = packed
        if kernel == NBITS and stored.bits != blocks.bits:
            codes = self._widened(packed, stored, blocks.bits)
        users = self.consumers[init.name]
        for node in users:
            if kernel == NBITS:
                node.CopyFrom(helper.make_node(
                    "MatMulNBits", [node.input[0], codes, scales] + ([zero] if zero else []), [node.output[0]],
                    name=node.name + "_nbits", domain=DOMAIN, K=blocks.k, N=blocks.n, bits=blocks.bits,
                    block_size=blocks.block_size, accuracy_level=ACCURACY_INT8))
            elif kernel in INTEGER_WEIGHTS:
                node.CopyFrom(helper.make_node("DynamicQuantizeMatMul", [node.input[0], *self._unpacked(
                    packed, stored, kernel)], [node.output[0]], name=f"{node.name}_{kernel}", domain=DOMAIN))
            elif kernel == FLOAT:
                node.input[1] = self._unpacked(packed, stored, FLOAT)[0]
            else:
                raise ValueError(f"unknown kernel {kernel!r}; expected one of {KERNELS}")
            self.kernels[kernel] = self.kernels.get(kernel, 0) + 1
            if kernel != FLOAT:
                self.integer_nodes.append(node)
        return len(users)

    def as_gather(self, init: Any, blocks: Blocks, packed: tuple[str, str, str | None] | None = None) -> None:
        """Every Gather reading the table `init` [V, D] (blocks of its transpose: N = V, K = D, K a multiple of
        the block size) becomes GatherBlockQuantized on the packed codes, reshaped back to [..., D]."""
        from onnx import helper

        if blocks.k % blocks.block_size:
            raise ValueError("a table's width must be a multiple of its block size")
        self._remove(init)
        codes, scales, _ = packed or self._packed(init.name, blocks)
        n, groups = blocks.scales.shape
        scale_3d = self._store(init.name + "_gather_scale_shape", np.array([n, groups, 1], dtype=np.int64))
        width = self._store(init.name + "_width", np.array([blocks.k], dtype=np.int64))
        zero = None
        if blocks.zero_points is not None:
            zero = self._store(init.name + "_gather_zero_points", blocks.zero_points[..., None].astype(np.uint8))
        for node in self.consumers[init.name]:
            out, ids, tag = node.output[0], node.input[1], node.name or node.output[0]
            node.CopyFrom(helper.make_node("Reshape", [scales, scale_3d], [out + "_row_scales"], name=tag + "_scales"))
            self.after.append((node, [
                helper.make_node("GatherBlockQuantized", [codes, ids, out + "_row_scales"] + ([zero] if zero else []),
                                 [out + "_blocks"], name=tag + "_nbits", domain=DOMAIN, bits=blocks.bits,
                                 block_size=blocks.block_size, gather_axis=0, quantize_axis=2),
                helper.make_node("Shape", [ids], [out + "_ids_shape"], name=tag + "_ids_shape"),
                helper.make_node("Concat", [out + "_ids_shape", width], [out + "_shape"], name=tag + "_shape", axis=0),
                helper.make_node("Reshape", [out + "_blocks", out + "_shape"], [out], name=tag + "_rows")]))

    def as_tied(self, table: Any, projections: list[Any], blocks: Blocks, kernel: str = NBITS,
                stored_bits: int | None = None) -> int:
        """A table and the MatMul weights that are its transpose, stored once (`stored_bits` wide, the lookup
        reading those codes); returns the matmuls changed."""
        stored = blocks.narrowed(stored_bits or blocks.bits)
        packed = self._packed(table.name, stored)
        self.as_gather(table, stored, packed)
        return sum(self.as_matmul(init, blocks, packed, kernel, stored=stored) for init in projections)

    def summary(self, prefix: str) -> dict[str, int]:
        """What the rewrite stored, for the export report; `values - stored_values` corrects a parameter count
        made from the initializers' element counts (a byte holds two codes)."""
        return {f"{prefix}_bytes_before": int(self.bytes_before), f"{prefix}_bytes_after": int(self.bytes_after),
                f"{prefix}_values": int(self.values), f"{prefix}_stored_values": int(self.stored_values),
                f"{prefix}_kernels": dict(self.kernels), f"{prefix}_widths": sorted(self.widths)}

    def finish(self) -> None:
        """Swap the initializers and insert the new nodes (each right after the node it follows, so the order
        stays topological); adds the com.microsoft opset if anything was rewritten."""
        from onnx import helper

        kept = [i for i in self.graph.initializer if i.name not in self.removed]
        del self.graph.initializer[:]
        self.graph.initializer.extend(kept + self.added)
        for node, after in self.after:
            at = list(self.graph.node).index(node) + 1
            for offset, extra in enumerate(after):
                self.graph.node.insert(at + offset, extra)
        for offset, node in enumerate(self.before):
            self.graph.node.insert(offset, node)
        if self.removed and not any(o.domain == DOMAIN for o in self.model.opset_import):
            self.model.opset_import.append(helper.make_opsetid(DOMAIN, 1))


def transposed_pairs(graph: LowBitGraph) -> dict[str, list[str]]:
    """Embedding table name -> the MatMul weights that hold its transpose (tied output projections; the exporter
    constant-folds lm_head's weight.T beside the table it is tied to), found by value."""
    from onnx import numpy_helper

    from modelshrink.onnx.merge import _digest

    tables = {i.name: numpy_helper.to_array(i) for i in graph.graph.initializer if graph.gather_table(i)}
    by_value = {(value.shape[::-1], _digest(value.T)): name for name, value in tables.items()}
    pairs: dict[str, list[str]] = {}
    for init in graph.graph.initializer:
        if graph.matmul_weight(init):
            table = by_value.get((tuple(init.dims), _digest(numpy_helper.to_array(init))))
            if table is not None:
                pairs.setdefault(table, []).append(init.name)
    return pairs
