"""`--int8`: a float model's weights in 8 bits.

`quantize_int8`: 8-bit weights with one scale and zero point per output column, each matmul on the integer
kernel measured fastest for it (onnxruntime's uint8 kernel, as its dynamic quantization gives, or MatMulNBits at
8 bits, or where the processor has VNNI the s8 kernel), activations quantized on the fly; then
`quantize_embeddings`: embedding tables in int8 with a scale per row. See `quantize_int8` for the choices and
what they measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from modelshrink.onnx import kernels, lowbit
from modelshrink.onnx.kernels import KernelChoice
from modelshrink.onnx.lowbit_graph import LowBitGraph, fuse_bias
from modelshrink.onnx.saving import data_file, save_graph


def quantize_embeddings(path: Path) -> int:
    """Embedding tables (float matrices read only by Gather on axis 0) as int8 with one scale per row: the
    lookup gathers the int8 rows and their scales, and multiplies. Per row rather than onnxruntime's one
    scale per table, because a few large rows then set every row's step. Returns the tables changed."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    consumers = lowbit.consumers_of(graph)
    changed, kept, new_nodes = 0, [], []
    for init in graph.initializer:
        users = consumers.get(init.name, [])
        gathers = users and all(n.op_type == "Gather" and n.input[0] == init.name and
                                all(a.i == 0 for a in n.attribute if a.name == "axis") for n in users)
        if not (gathers and init.data_type == onnx.TensorProto.FLOAT and len(init.dims) == 2
                and init.dims[0] * init.dims[1] >= 256):
            kept.append(init)
            continue
        table = numpy_helper.to_array(init)
        peak = np.abs(table).max(axis=1)
        scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        q_name, s_name, axis_name = init.name + "_int8", init.name + "_row_scale", init.name + "_last_axis"
        kept += [numpy_helper.from_array(np.round(table / scale[:, None]).astype(np.int8), q_name),
                 numpy_helper.from_array(scale, s_name), numpy_helper.from_array(np.array([-1], dtype=np.int64),
                                                                                 axis_name)]
        for node in users:
            out, ids = node.output[0], node.input[1]
            node.input[0] = q_name
            node.output[0] = out + "_int8"
            new_nodes.append((node, [
                helper.make_node("Cast", [out + "_int8"], [out + "_float"], name=out + "_cast",
                                 to=onnx.TensorProto.FLOAT),
                helper.make_node("Gather", [s_name, ids], [out + "_scale"], name=out + "_gather_scale", axis=0),
                helper.make_node("Unsqueeze", [out + "_scale", axis_name], [out + "_scale_col"],
                                 name=out + "_unsqueeze_scale"),
                helper.make_node("Mul", [out + "_float", out + "_scale_col"], [out], name=out + "_dequantize")]))
        changed += 1
    del graph.initializer[:]
    graph.initializer.extend(kept)
    for node, after in new_nodes:  # right after each lookup, so the node order stays topological
        at = list(graph.node).index(node) + 1
        for offset, extra in enumerate(after):
            graph.node.insert(at + offset, extra)
    save_graph(model, path)
    return changed


def uint8_blocks(weight: np.ndarray, block_size: int, per_channel: bool = True) -> lowbit.Blocks:
    """A [K, N] weight as asymmetric uint8 codes with one scale and zero point per output column (`per_channel`)
    or for the whole tensor, as onnxruntime's dynamic quantization rounds a QUInt8 weight: the range
    [min(0, lowest), max(0, highest)] in 255 steps, so that 0 is a code. Blocked along K by `block_size` for
    MatMulNBits (every block of a column repeating the column's scale and zero point); K that is not a multiple
    of it is padded with the zero point."""
    k, n = weight.shape
    axis = 0 if per_channel else None
    low = np.minimum(weight.min(axis=axis), 0).astype(np.float32)
    high = np.maximum(weight.max(axis=axis), 0).astype(np.float32)
    scale = ((high - low) / 255).astype(np.float32)
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
    zero = np.clip(np.round(-low / scale), 0, 255)
    codes = weight / scale  # rounded and shifted in place: one copy of the weight, not four
    np.clip(np.add(np.round(codes, out=codes), zero, out=codes), 0, 255, out=codes)
    scale, zero = np.broadcast_to(scale, (n,)), np.broadcast_to(zero, (n,))
    groups = -(-k // block_size)
    padded = np.broadcast_to(zero, (groups * block_size, n)).astype(np.uint8)
    padded[:k] = codes
    return lowbit.Blocks(np.ascontiguousarray(padded.T).reshape(n, groups, block_size),
                         np.ascontiguousarray(np.repeat(scale[:, None], groups, axis=1), dtype=np.float32),
                         np.repeat(zero[:, None], groups, axis=1).astype(np.uint8), 8, k)


def int8_blocks(weight: np.ndarray, block_size: int, per_channel: bool = True) -> lowbit.Blocks:
    """A [K, N] weight as symmetric int8 codes b = round(w / s), |b| <= 127, with s = max |w| / 127 per output
    column (`per_channel`) or for the whole tensor, as onnxruntime's dynamic quantization rounds a QInt8 weight:
    the codes the `s8` kernel multiplies (stored as b + 128 under the default zero point, `integer_blocks`)."""
    axis = 0 if per_channel else None
    peak = np.maximum(weight.max(axis=axis), -weight.min(axis=axis)).astype(np.float32)
    scale = np.where(peak > 0, peak / 127, np.float32(1.0)).astype(np.float32)
    b = weight / scale  # rounded in place: one copy of the weight, not four
    np.clip(np.round(b, out=b), -127, 127, out=b)
    return lowbit.integer_blocks(b, scale, 8, block_size)


def quantize_int8(path: Path, per_channel: bool, choice: KernelChoice) -> dict[str, Any]:
    """`--int8`: 8-bit weights with one scale and zero point per output column (`per_channel`; else one per
    tensor), activations quantized per call, matmuls in integers, and embedding tables in int8 with one scale
    per row (`quantize_embeddings`). Only matmuls with a constant weight: attention's activation-by-activation
    products stay float. Returns what was stored and how.

    Every MatMul whose B is a 2-D float initializer computes with the kernel `choice` measures fastest for its
    shape and rows (`modelshrink.onnx.kernels`): onnxruntime's uint8 kernel (its dynamic quantization writes it:
    the input rounded to uint8 per tensor), MatMulNBits at 8 bits on the same codes (`uint8_blocks`; the input
    rounded to int8 per block of K, integer products), a float MatMul on those codes unpacked at load, or, where
    the processor has VNNI, the integer kernel on symmetric int8 codes (`s8`, `int8_blocks`; the input rounded as
    the uint8 kernel's). On an AVX2 machine without VNNI the uint8 kernel won nearly every weight of the quantize
    artifacts; on an AVX-512 VNNI one `s8` is 2-2.4x faster than either from 64 rows on (lowbit's table). The
    uint8 kernel's weights, and any other (Gemm's, or a MatMul weight that other ops read too), go through
    onnxruntime's dynamic quantization.

    Signed weights only with VNNI: without it onnxruntime multiplies u8 activations by s8 weights with AVX2's
    vpmaddubsw, which adds two products into a saturating int16 (2 x 255 x 127 > 32767); there per-channel
    scales push every column to +-127, so sums clip, and the tiny test models' logits moved by 31% (RMS)
    against 1-4% with u8 weights, whose u8 x u8 kernel widens to int16 before multiplying and is exact. VNNI
    adds four byte products into an int32: exact (`modelshrink.runtime.cpu`). On the MiniLM teacher u8 per
    channel was the most accurate (logits 10% RMS; s8 per channel 11%, s8 per channel 7-bit 11%, s8 per tensor
    26%; measured without VNNI, so the s8 figures include clipping). Per-row
    tables rather than onnxruntime's one scale per table: on a trained 6-2 MiniLM student (200 Debian documents)
    they kept ROUGE-1 at 22.6 (float32: 22.5) with 137 summaries equal to float32's, where onnxruntime's own
    Gather quantization gave 21.7 and 116, and float tables 22.3 and 127 at 2.4x the size."""
    import logging

    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(str(path))
    graph = LowBitGraph(model)
    nodes = weights = 0
    for init in [i for i in model.graph.initializer if graph.matmul_weight(i)]:
        k, n = init.dims
        block = lowbit.block_size_for(k) or 32
        kernel = choice.choose(k, n, kernels.INT8_CANDIDATES, block, zero_points=True)[0]
        weights += 1
        if kernel == lowbit.INT8:  # left to onnxruntime's quantization below: the same codes, its own graph form
            users = len(graph.consumers[init.name])
            graph.kernels[kernel] = graph.kernels.get(kernel, 0) + users
            nodes += users
            continue
        rounded = int8_blocks if kernel == lowbit.S8 else uint8_blocks
        nodes += graph.as_matmul(init, rounded(numpy_helper.to_array(init), block, per_channel), kernel=kernel)
    graph.finish()
    biases = fuse_bias(model.graph, graph.integer_nodes)
    save_graph(model, path)
    floats = {i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    left = any(node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in floats
               for node in model.graph.node)
    summary = graph.summary("int8")
    del model, graph  # onnxruntime's quantization below reads the file, with copies of its own
    if left:
        tmp = path.with_suffix(".int8.onnx")
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # its advice to run pre-processing is logged on the root logger, once a graph
        try:
            quantize_dynamic(str(path), str(tmp), per_channel=per_channel, weight_type=QuantType.QUInt8,
                             op_types_to_quantize=["MatMul", "Gemm"],
                             # onnx's shape inference has no types for the outputs of com.microsoft ops (s8's
                             # DynamicQuantizeMatMul), which the quantizer asks for: every activation here is float
                             extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT})
        finally:
            root.setLevel(level)
        tmp.replace(path)
        data_file(path).unlink(missing_ok=True)  # its weights are now in the quantizer's output
    tables = quantize_embeddings(path)
    return {"int8_matmuls": nodes, "int8_weights": weights, "int8_tables": tables, "biases_fused": biases,
            "kernels": choice.report(), **summary}
