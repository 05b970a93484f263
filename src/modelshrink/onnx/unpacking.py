"""Constant nodes that turn packed low-bit codes (`modelshrink.onnx.lowbit`) into what a kernel reads.

They read initializers alone, so onnxruntime folds them into one initializer when it loads the graph: the file
keeps the low bits (a ternary weight's in base 3, a column's one scale once), memory holds what the kernel
reads. `LowBitGraph` (`modelshrink.onnx.lowbit_graph`) puts
them at the head of the graph; each is written once per (codes, kernel), and each constant they read once.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from modelshrink.onnx.lowbit import FLOAT, INT8, NBITS, S8, Blocks, per_column, trit_table

Packed = tuple[str, str, "str | None"]  # the stored tensors' names: codes, scales, zero points (or None)


class LoadTimeUnpacking:
    """The unpacking nodes of one graph; `store(name, value)` adds an initializer to it (and counts its bytes)."""

    def __init__(self, store: Callable[[str, np.ndarray], str]):
        self.store = store
        self.constants: set[str] = set()
        self.nodes: list[Any] = []  # in order, for the head of the graph
        self.unpacked: dict[tuple[str, str], tuple[str, ...]] = {}
        self.trits: dict[str, tuple[int, int]] = {}  # codes stored in base 3 -> (rows, codes a row)
        self.column_scales: dict[str, tuple[str, int, int]] = {}  # block scales -> (a scale a column [N], N, blocks)
        self.made: set[str] = set()  # what nodes already make (a decoding read by more than one kernel)

    def in_base_three(self, codes: str, rows: int, per_row: int) -> None:
        """`codes` is stored by `pack_trits`: `rows` rows of `per_row` codes."""
        self.trits[codes] = (rows, per_row)

    def scales_by_column(self, scales: str, column: str, n: int, groups: int) -> None:
        """The block scales `scales` [N, groups] are stored as `column` [N] (every block of a column the same):
        `block_scales` expands them for the ops that read a scale a block."""
        self.column_scales[scales] = (column, n, groups)

    def block_scales(self, scales: str) -> str:
        """The name of the [N, n_blocks] scales MatMulNBits and GatherBlockQuantized read: `scales` itself, or
        nodes that expand its one scale a column."""
        if scales not in self.column_scales or scales in self.made:
            return scales
        from onnx import helper

        column, n, groups = self.column_scales[scales]
        rows = self.constant("lowbit_one_column", np.array([-1, 1], dtype=np.int64))
        shape = self.constant(f"lowbit_shape_{n}_{groups}", np.array([n, groups], dtype=np.int64))
        self._keep([helper.make_node("Reshape", [column, rows], [f"{column}_as_column"]),
                    helper.make_node("Expand", [f"{column}_as_column", shape], [scales])])
        return scales

    def scale_per_column(self, scales: str, nodes: list[Any]) -> str:
        """[N]: each column's scale (its first block's), as the integer kernels read it."""
        from onnx import helper

        if scales in self.column_scales:
            return self.column_scales[scales][0]
        first = self.constant("lowbit_first_block", np.array(0, dtype=np.int64))
        self.add(nodes, helper.make_node("Gather", [scales, first], [f"{scales}_first_block"], axis=1))
        return f"{scales}_first_block"

    def add(self, nodes: list[Any], node: Any) -> None:
        """`node` into `nodes`, unless a node kept already (or waiting in `nodes`) makes its output."""
        if node.output[0] not in self.made and all(node.output[0] not in n.output for n in nodes):
            nodes.append(node)

    def constant(self, name: str, value: np.ndarray) -> str:
        """A constant the unpacking nodes read, stored once under `name` (not a weight: the parameter count
        leaves it out)."""
        if name not in self.constants:
            self.constants.add(name)
            self.store(name, value)
        return name

    def codes_by_row(self, packed: str, bits: int, rows: int, count: int, nodes: list[Any]) -> str:
        """Nodes for the first `count` codes of each row of a tensor packed `bits` a code row by row (`pack`'s
        layout), as [rows, count] uint8; code j of a byte is (byte >> bits·j) - ((byte >> bits·(j+1)) << bits),
        BitShift alone (opset 11)."""
        from onnx import helper

        if packed in self.trits:  # [rows, codes a row]: cut only where a row holds more than `count`
            decoded = self._decoded_trits(packed, nodes)
            return decoded if self.trits[packed][1] == count else self.slice(decoded, count, nodes)
        flat = self.constant(f"lowbit_rows_{rows}", np.array([rows, -1], dtype=np.int64))
        split, per = f"{packed}_by_row", 8 // bits
        nodes.append(helper.make_node("Reshape", [packed, flat], [split]))
        if per > 1:
            last = self.constant("lowbit_last_axis", np.array([-1], dtype=np.int64))
            for j in range(per):
                low = f"{packed}_s{j}"
                nodes.append(helper.make_node("BitShift", [split, self.constant(
                    f"lowbit_shift_{bits * j}", np.array(bits * j, dtype=np.uint8))], [low], direction="RIGHT"))
                if j + 1 < per:
                    high, width = (self.constant(f"lowbit_shift_{v}", np.array(v, dtype=np.uint8))
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
        return self.slice(split, count, nodes)

    def _decoded_trits(self, packed: str, nodes: list[Any]) -> str:
        """Nodes for the codes `pack_trits` stored in `packed`, [rows, codes a row] uint8: each byte looks up its
        five codes (`trit_table`), the tail's padding cut off. Made once, whichever kernels read them."""
        from onnx import TensorProto, helper

        rows, per_row = self.trits[packed]
        table = self.constant("lowbit_trit_codes", trit_table())
        flat, first, end, axis = (self.constant(f"lowbit_{w}_{v}", np.array([v], dtype=np.int64))
                                  for w, v in (("flat", -1), ("start", 0), ("end", rows * per_row), ("axis", 0)))
        shape = self.constant(f"lowbit_rows_{rows}", np.array([rows, -1], dtype=np.int64))
        for node in (helper.make_node("Cast", [packed], [f"{packed}_index"], to=TensorProto.INT32),
                     helper.make_node("Gather", [table, f"{packed}_index"], [f"{packed}_trits"], axis=0),
                     helper.make_node("Reshape", [f"{packed}_trits", flat], [f"{packed}_codes"]),
                     helper.make_node("Slice", [f"{packed}_codes", first, end, axis], [f"{packed}_codes_cut"]),
                     helper.make_node("Reshape", [f"{packed}_codes_cut", shape], [f"{packed}_by_row"])):
            self.add(nodes, node)
        return f"{packed}_by_row"

    def slice(self, name: str, count: int, nodes: list[Any]) -> str:
        """Nodes for name[:, :count]."""
        from onnx import helper

        start, end, axis = (self.constant(f"lowbit_{w}_{v}", np.array([v], dtype=np.int64))
                            for w, v in (("start", 0), ("end", count), ("axis", 1)))
        self.add(nodes, helper.make_node("Slice", [name, start, end, axis], [f"{name}_{count}"]))
        return f"{name}_{count}"

    def _keep(self, nodes: list[Any], key: tuple[str, str] | None = None,
              result: tuple[str, ...] = ()) -> tuple[str, ...]:
        for node in nodes:
            node.name = node.output[0]
            self.made.update(node.output)
        self.nodes += nodes
        if key is not None:
            self.unpacked[key] = result
        return result

    def widened(self, packed: Packed, stored: Blocks, bits: int) -> str:
        """Nodes that turn codes stored `stored.bits` wide into MatMulNBits' `bits`-wide codes [N, n_blocks,
        block_size · bits / 8]: each code moves up by the zero points' difference 2^(bits-1) - 2^(stored.bits-1),
        and 8 / bits codes share a byte, the first in the lowest bits (a ternary weight is stored in 2 bits and
        computes with the 4-bit kernel; codes stored in base 3 are decoded first, and packed at their own width
        where `bits` is it)."""
        from onnx import helper

        codes = packed[0]
        if (codes, f"{NBITS}/{bits}") in self.unpacked:
            return self.unpacked[(codes, f"{NBITS}/{bits}")][0]
        n, groups = stored.scales.shape
        per, nodes = 8 // bits, []
        by_row = self.codes_by_row(codes, stored.bits, n, groups * stored.block_size, nodes)
        if bits != stored.bits:
            offset = self.constant(f"lowbit_widen_{stored.bits}_{bits}",
                                   np.array(2 ** (bits - 1) - 2 ** (stored.bits - 1), dtype=np.uint8))
            nodes.append(helper.make_node("Add", [by_row, offset], [f"{codes}_w{bits}"]))
            by_row = f"{codes}_w{bits}"
        by_byte = self.constant(f"lowbit_shape_{n}_-1_{per}", np.array([n, -1, per], dtype=np.int64))
        nodes.append(helper.make_node("Reshape", [by_row, by_byte], [f"{codes}_w{bits}_by_byte"]))
        total = ""
        for j in range(per):  # code j of each byte, shifted to its place, summed (the places do not overlap)
            start, end, axis = (self.constant(f"lowbit_{w}_{v}", np.array([v], dtype=np.int64))
                                for w, v in (("start", j), ("end", j + 1), ("axis", 2)))
            part = f"{codes}_w{bits}_{j}"
            nodes.append(helper.make_node("Slice", [f"{codes}_w{bits}_by_byte", start, end, axis], [part]))
            if j:
                shift = self.constant(f"lowbit_shift_{bits * j}", np.array(bits * j, dtype=np.uint8))
                nodes.append(helper.make_node("BitShift", [part, shift], [part + "_placed"], direction="LEFT"))
                nodes.append(helper.make_node("Add", [total, part + "_placed"], [part + "_sum"]))
                part += "_sum"
            total = part
        layout = self.constant(f"lowbit_shape_{n}_{groups}_{stored.block_size * bits // 8}",
                               np.array([n, groups, stored.block_size * bits // 8], dtype=np.int64))
        nodes.append(helper.make_node("Reshape", [total, layout], [f"{codes}_as_{bits}_bits"]))
        return self._keep(nodes, (codes, f"{NBITS}/{bits}"), (f"{codes}_as_{bits}_bits",))[0]

    def for_kernel(self, packed: Packed, blocks: Blocks, kernel: str) -> tuple[str, ...]:
        """Nodes that turn the stored codes into what `kernel` reads: INT8: (uint8 b + 128 [K, N], scale per
        column [N], zero point 128 [N]); S8: (int8 b [K, N], scale per column [N], zero point 0 [N]); FLOAT:
        (weight [K, N],)."""
        codes = packed[0]
        if (codes, kernel) in self.unpacked:
            return self.unpacked[(codes, kernel)]
        if codes not in self.trits and any(key[0] == codes for key in self.unpacked):
            raise ValueError(f"{codes} is already read by another kernel in this graph")
        nodes: list[Any] = []
        if kernel == S8:
            result = self._signed(packed, blocks, nodes)
        elif kernel == INT8:
            result = self._unsigned(packed, blocks, nodes)
        elif kernel == FLOAT:
            result = self._float(packed, blocks, nodes)
        else:
            raise ValueError(f"{kernel!r} reads the codes themselves")
        return self._keep(nodes, (codes, kernel), result)

    def _signed(self, packed: Packed, blocks: Blocks, nodes: list[Any]) -> tuple[str, ...]:
        """S8's (int8 b [K, N], scale per column [N], zero point 0 [N])."""
        from onnx import TensorProto, helper

        codes, scales, zero = packed
        n, bits = blocks.n, blocks.bits
        if not per_column(blocks) or zero is not None:
            raise ValueError("the s8 kernel takes symmetric codes with one scale per column")
        by_row = self.codes_by_row(codes, bits, n, blocks.k, nodes)
        # codes b + 2^(bits-1) as the signed b: widened to int16 to subtract, then narrowed (|b| <= 127)
        offset = self.constant(f"lowbit_centre_{bits}", np.array(2 ** (bits - 1), dtype=np.int16))
        nodes += [helper.make_node("Cast", [by_row], [f"{codes}_i16_rows"], to=TensorProto.INT16),
                  helper.make_node("Sub", [f"{codes}_i16_rows", offset], [f"{codes}_i16_centred"]),
                  helper.make_node("Cast", [f"{codes}_i16_centred"], [f"{codes}_s8_rows"], to=TensorProto.INT8),
                  helper.make_node("Transpose", [f"{codes}_s8_rows"], [f"{codes}_s8"], perm=[1, 0])]
        column_zero = self.constant(f"lowbit_zero_s8_{n}", np.zeros(n, dtype=np.int8))
        return (f"{codes}_s8", self.scale_per_column(scales, nodes), column_zero)

    def _unsigned(self, packed: Packed, blocks: Blocks, nodes: list[Any]) -> tuple[str, ...]:
        """INT8's (uint8 b + 128 [K, N], scale per column [N], zero point [N])."""
        from onnx import helper

        codes, scales, zero = packed
        n, groups, bits = blocks.n, blocks.scales.shape[1], blocks.bits
        if not per_column(blocks):
            raise ValueError("the int8 kernel takes one scale per column, and zero points only with 8-bit codes "
                             "and one per column")
        first = self.constant("lowbit_first_block", np.array(0, dtype=np.int64))
        by_row = self.codes_by_row(codes, bits, n, blocks.k, nodes)
        if zero is None:  # symmetric codes b + 2^(bits-1) as uint8 b + 128 under the zero point 128
            offset = self.constant(f"lowbit_to_u8_{bits}", np.array(128 - 2 ** (bits - 1), dtype=np.uint8))
            nodes.append(helper.make_node("Add", [by_row, offset], [f"{codes}_u8_rows"]))
            by_row = f"{codes}_u8_rows"
            column_zero = self.constant(f"lowbit_zero_128_{n}", np.full(n, 128, dtype=np.uint8))
        else:  # 8-bit codes are uint8 already; each column's zero point is its first block's
            nodes += [helper.make_node("Reshape", [zero, self.constant(f"lowbit_shape_{n}_{groups}", np.array(
                          [n, groups], dtype=np.int64))], [f"{codes}_zero_blocks"]),
                      helper.make_node("Gather", [f"{codes}_zero_blocks", first], [f"{codes}_column_zero"], axis=1)]
            column_zero = f"{codes}_column_zero"
        nodes.append(helper.make_node("Transpose", [by_row], [f"{codes}_u8"], perm=[1, 0]))
        return (f"{codes}_u8", self.scale_per_column(scales, nodes), column_zero)

    def _float(self, packed: Packed, blocks: Blocks, nodes: list[Any]) -> tuple[str, ...]:
        """FLOAT's (weight [K, N],): (code - zero point) · scale, block by block, padding cut off last."""
        from onnx import TensorProto, helper

        codes, scales, zero = packed
        n, groups, bits = blocks.n, blocks.scales.shape[1], blocks.bits
        shape3, scale3 = (self.constant(f"lowbit_shape_{n}_{groups}_{last}",
                                        np.array([n, groups, last], dtype=np.int64)) for last in (-1, 1))
        scales_shape = scale3
        if scales in self.column_scales:  # one scale a column [N], broadcast over its blocks as [N, 1, 1]
            scales, scales_shape = self.column_scales[scales][0], self.constant(
                f"lowbit_shape_{n}_1_1", np.array([n, 1, 1], dtype=np.int64))
        by_row = self.codes_by_row(codes, bits, n, groups * blocks.block_size, nodes)
        if zero is not None:
            nodes += [helper.make_node("Cast", [self.codes_by_row(zero, bits, n, groups, nodes)],
                                       [f"{codes}_zero_float"], to=TensorProto.FLOAT),
                      helper.make_node("Reshape", [f"{codes}_zero_float", scale3], [f"{codes}_zero3"])]
            zeros = f"{codes}_zero3"
        else:
            zeros = self.constant(f"lowbit_zero_{bits}", np.array(2 ** (bits - 1), dtype=np.float32))
        flat = self.constant(f"lowbit_rows_{n}", np.array([n, -1], dtype=np.int64))
        nodes += [helper.make_node("Cast", [by_row], [f"{codes}_float_codes"], to=TensorProto.FLOAT),
                  helper.make_node("Reshape", [f"{codes}_float_codes", shape3], [f"{codes}_blocks"]),
                  helper.make_node("Sub", [f"{codes}_blocks", zeros], [f"{codes}_centred"]),
                  helper.make_node("Reshape", [scales, scales_shape], [f"{codes}_scales3"]),
                  helper.make_node("Mul", [f"{codes}_centred", f"{codes}_scales3"], [f"{codes}_values"]),
                  helper.make_node("Reshape", [f"{codes}_values", flat], [f"{codes}_value_rows"])]
        nodes.append(helper.make_node("Transpose", [self.slice(f"{codes}_value_rows", blocks.k, nodes)],
                                      [f"{codes}_float"], perm=[1, 0]))
        return (f"{codes}_float",)
