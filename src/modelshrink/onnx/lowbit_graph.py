"""A graph being rewritten to keep its weights in low bits (`modelshrink.onnx.lowbit` holds the format and the
kernels): float initializers replaced by packed codes and the ops that read them, a table and its tied
projection stored once (`transposed_pairs`), and the integer kernels' biases taken in (`fuse_bias`).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from modelshrink.onnx.lowbit import ACCURACY_INT8, DOMAIN, FLOAT, INTEGER_WEIGHTS, KERNELS, NBITS, Blocks, \
    consumers_of, pack, pack_trits, ternary
from modelshrink.onnx.unpacking import LoadTimeUnpacking


class LowBitGraph:
    """An ONNX model being rewritten: float initializers replaced by packed codes and the ops that read them."""

    def __init__(self, model: Any):
        self.model, self.graph = model, model.graph
        self.consumers = consumers_of(self.graph)
        self.removed: set[str] = set()
        self.added: list[Any] = []
        self.after: list[tuple[Any, list[Any]]] = []  # (node, nodes to insert right after it)
        self.bytes_before = self.bytes_after = 0
        # constant nodes that unpack codes, folded when a session loads the graph; they store through a weak
        # reference: a bound method would make a cycle that keeps the whole model in memory until the collector
        # runs (the --int8 export of distilbart-cnn's shape held each graph rewritten before: 5.5 GB, issue 78)
        this = weakref.proxy(self)
        self.unpacking = LoadTimeUnpacking(lambda name, value: this._store(name, value))
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
        """Store the blocks' codes and scales (and zero points) as small as they go: a ternary weight's codes in
        base 3, a scale a column where all its blocks have the same one (`modelshrink.onnx.lowbit`'s text; the
        unpacking nodes give the ops what they read). Returns the names the ops read them by."""
        self.values += blocks.k * blocks.n
        self.widths.add(blocks.bits)
        n, groups = blocks.scales.shape
        if ternary(blocks):
            codes = self._store(name + "_q3", pack_trits(blocks.codes))
            self.unpacking.in_base_three(codes, n, groups * blocks.block_size)
        else:
            codes = self._store(name + "_q", pack(blocks.codes, blocks.bits))
        if groups > 1 and bool(np.all(blocks.scales == blocks.scales[:, :1])):
            scales = name + "_scales"
            column = self._store(name + "_column_scales", np.ascontiguousarray(blocks.scales[:, 0]))
            self.unpacking.scales_by_column(scales, column, n, groups)
        else:
            scales = self._store(name + "_scales", blocks.scales)
        zero = None
        if blocks.zero_points is not None:
            zero = self._store(name + "_zero_points", pack(blocks.zero_points, blocks.bits).reshape(-1))
        return codes, scales, zero

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
        if kernel == NBITS and (stored.bits != blocks.bits or codes in self.unpacking.trits):
            codes = self.unpacking.widened(packed, stored, blocks.bits)
        if kernel == NBITS:
            scales = self.unpacking.block_scales(scales)
        users = self.consumers[init.name]
        for node in users:
            if kernel == NBITS:
                node.CopyFrom(helper.make_node(
                    "MatMulNBits", [node.input[0], codes, scales] + ([zero] if zero else []), [node.output[0]],
                    name=node.name + "_nbits", domain=DOMAIN, K=blocks.k, N=blocks.n, bits=blocks.bits,
                    block_size=blocks.block_size, accuracy_level=ACCURACY_INT8))
            elif kernel in INTEGER_WEIGHTS:
                node.CopyFrom(helper.make_node("DynamicQuantizeMatMul", [node.input[0], *self.unpacking.for_kernel(
                    packed, stored, kernel)], [node.output[0]], name=f"{node.name}_{kernel}", domain=DOMAIN))
            elif kernel == FLOAT:
                node.input[1] = self.unpacking.for_kernel(packed, stored, FLOAT)[0]
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
        packed = packed or self._packed(init.name, blocks)
        codes, scales, _ = packed
        if codes in self.unpacking.trits:  # the lookup reads the codes' bytes at their own width
            codes = self.unpacking.widened(packed, blocks, blocks.bits)
        scales = self.unpacking.block_scales(scales)
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
        stays topological); adds the com.microsoft opset if anything was rewritten. An initializer it stored that
        nothing reads (a table's packed zero points where no matmul shares them) is left out."""
        from onnx import helper, numpy_helper

        read = {name for node in [*_all_nodes(self.graph), *self.unpacking.nodes,
                                  *(n for _, after in self.after for n in after)] for name in node.input}
        unread = [i for i in self.added if i.name not in read]  # a lookup's packed zero points no matmul reads
        for init in unread:
            value = numpy_helper.to_array(init)
            self.bytes_after -= value.nbytes
            self.stored_values -= value.size
        # the replaced ones deleted in place: rebuilding the list would copy every weight kept (a real-size
        # vocabulary's table and projection, 400 MB, at the peak of the --int8 export: issue 78)
        for index in reversed([at for at, i in enumerate(self.graph.initializer) if i.name in self.removed]):
            del self.graph.initializer[index]
        self.graph.initializer.extend(i for i in self.added if i.name in read)
        self.added = []
        for node, after in self.after:
            at = list(self.graph.node).index(node) + 1
            for offset, extra in enumerate(after):
                self.graph.node.insert(at + offset, extra)
        for offset, node in enumerate(self.unpacking.nodes):
            self.graph.node.insert(offset, node)
        if self.removed and not any(o.domain == DOMAIN for o in self.model.opset_import):
            self.model.opset_import.append(helper.make_opsetid(DOMAIN, 1))


def _all_nodes(graph: Any) -> list[Any]:
    """The nodes of `graph` and of the graphs its nodes hold (an If's branches)."""
    from modelshrink.onnx.merge import subgraphs

    return [found for node in graph.node for found in [node, *(n for g in subgraphs(node) for n in _all_nodes(g))]]


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


BIAS_INPUT = {"DynamicQuantizeMatMul": 4, "MatMulIntegerToFloat": 6}  # where each kernel takes an optional bias


def fuse_bias(graph: Any, nodes: list[Any]) -> int:
    """Each of `nodes` on an integer kernel that takes a bias (`BIAS_INPUT`) and whose only reader is an Add of a
    1-D float initializer (a linear layer's bias) takes that bias itself, and the Add goes: one node fewer a
    layer, which at a decoder step's 4 rows costs about what the matmul does (onnxruntime fuses the bias into
    MatMulNBits itself, not into these). Returns the Adds removed."""
    floats = {i.name for i in graph.initializer if i.data_type == 1 and len(i.dims) == 1}
    for node in graph.node:  # the exporter reads a bias equal to another one through an Identity of it
        if node.op_type == "Identity" and node.input[0] in floats:
            floats.add(node.output[0])
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    fused: dict[str, Any] = {}  # the Add's output -> the kernel with its bias, which takes the Add's place
    gone: set[str] = set()  # the kernels' own outputs, no longer computed
    for node in nodes:
        at = BIAS_INPUT.get(node.op_type)
        if at is None or len(node.input) > at or node.output[0] in outputs:
            continue
        users = readers.get(node.output[0], [])
        if len(users) != 1 or users[0].op_type != "Add" or len(users[0].input) != 2:
            continue
        add = users[0]
        bias = add.input[1] if add.input[0] == node.output[0] else add.input[0]
        if bias not in floats or bias == node.output[0]:
            continue
        kernel = type(node)()
        kernel.CopyFrom(node)
        kernel.input.extend([""] * (at - len(node.input)) + [bias])
        kernel.output[0] = add.output[0]
        fused[add.output[0]] = kernel
        gone.add(node.output[0])
    if fused:  # in the Add's place, after its bias is computed; the kernel's own place left empty
        order = [fused.get(node.output[0], node) for node in graph.node if node.output[0] not in gone]
        kept = [type(node)() for node in order]
        for copy, node in zip(kept, order):
            copy.CopyFrom(node)
        del graph.node[:]
        graph.node.extend(kept)
    return len(fused)
