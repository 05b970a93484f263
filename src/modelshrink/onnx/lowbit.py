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

Measured on this project's 2-core machine (onnxruntime 1.32, CPU, K 768, N 3072, block 128, 2 threads,
medians of 30 interleaved runs): at 4 rows float MatMul 0.91 ms, 4-bit MatMulNBits 1.59 ms, 2-bit 15.8 ms,
8-bit 16.0 ms; at 64 rows 8.4, 9.2, 21.6 and 22.5 ms. Only the 4-bit kernel is fast here (the others
dequantize the whole weight at every call), so low bits are kept as 4-bit codes: ternary {-1, 0, 1} and
3-4-bit integers are held exactly, at half a byte a weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

DOMAIN = "com.microsoft"
MAX_BLOCK = 256  # onnxruntime's 2-bit kernel refuses larger blocks; the others are no faster with them


def require_support(what: str) -> None:
    """A one-line UserError where the installed onnxruntime lacks the ops (or their `bits` attribute) that
    hold 4-bit codes: the export could neither validate its graphs nor would they run."""
    import onnxruntime

    from modelshrink.errors import UserError

    try:
        from onnxruntime.capi.onnxruntime_pybind11_state import get_all_operator_schema

        schemas = {s.name: s for s in get_all_operator_schema() if s.domain == DOMAIN}
    except ImportError:  # a build without schema queries: its own load error will say what is missing
        return
    lacking = [op for op in ("MatMulNBits", "GatherBlockQuantized")
               if op not in schemas or "bits" not in schemas[op].attributes]
    if lacking:
        raise UserError(f"{what} needs onnxruntime's {' and '.join(lacking)} with 4-bit codes, which onnxruntime "
                        f"{onnxruntime.__version__} lacks; upgrade onnxruntime (1.32 is tested), or export with --int8")


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
        codes = self._store(name + "_q", pack(blocks.codes, blocks.bits))
        scales = self._store(name + "_scales", blocks.scales)
        zero = None
        if blocks.zero_points is not None:
            zero = self._store(name + "_zero_points", pack(blocks.zero_points, blocks.bits).reshape(-1))
        return codes, scales, zero

    def as_matmul(self, init: Any, blocks: Blocks, packed: tuple[str, str, str | None] | None = None) -> int:
        """Every MatMul reading `init` becomes MatMulNBits on the packed blocks; returns the nodes changed."""
        from onnx import helper

        self._remove(init)
        codes, scales, zero = packed or self._packed(init.name, blocks)
        users = self.consumers[init.name]
        for node in users:
            node.CopyFrom(helper.make_node(
                "MatMulNBits", [node.input[0], codes, scales] + ([zero] if zero else []), [node.output[0]],
                name=node.name + "_nbits", domain=DOMAIN, K=blocks.k, N=blocks.n, bits=blocks.bits,
                block_size=blocks.block_size))
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

    def as_tied(self, table: Any, projections: list[Any], blocks: Blocks) -> int:
        """A table and the MatMul weights that are its transpose, stored once; returns the matmuls changed."""
        packed = self._packed(table.name, blocks)
        self.as_gather(table, blocks, packed)
        return sum(self.as_matmul(init, blocks, packed) for init in projections)

    def summary(self, prefix: str) -> dict[str, int]:
        """What the rewrite stored, for the export report; `values - stored_values` corrects a parameter count
        made from the initializers' element counts (a byte holds two codes)."""
        return {f"{prefix}_bytes_before": int(self.bytes_before), f"{prefix}_bytes_after": int(self.bytes_after),
                f"{prefix}_values": int(self.values), f"{prefix}_stored_values": int(self.stored_values)}

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
