"""Rewrites that keep a `quantize` artifact's integer weights.

A `quantize` artifact's weights are α·b with integer b (ternary, or |b| <= 2^(bits-1) - 1), found by value in
the traced graphs (the exporter renames and transposes linear weights, but it keeps their values exactly):
- `keep_low_bits`: matmul weights and embedding tables as codes of their own width (ternary in 2 bits, stored
  five a byte in base 3; a scale a column stored once, not once a block; 3-4-bit
  weights in 4, 5-8-bit weights in 8; `modelshrink.onnx.lowbit`), a tied output projection sharing its table's
  codes, each matmul computing with the kernel measured fastest for it (`modelshrink.onnx.kernels`): the uint8
  kernel on the model's own codes of its input (`modelshrink.onnx.rounding.integer_activations`), exactly the
  quantized product;
- `compact_quantized`: the rest (a weight no such op reads) as int8 with a Cast and a Mul by its scale (per
  tensor, row or column), which onnxruntime folds into a float weight on load; about 4x smaller than float32.
`--int8` (weights of a float model in 8 bits) is `modelshrink.onnx.int8`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from modelshrink.onnx import kernels, lowbit
from modelshrink.onnx.kernels import KernelChoice
from modelshrink.onnx.lowbit_graph import LowBitGraph, fuse_bias, transposed_pairs
from modelshrink.onnx.rounding import integer_activations, rounded, shorten_rounding, take_out_rounding
from modelshrink.onnx.saving import save_graph


ROUNDINGS = ("model", "none", "kernel")  # whose rounding of the activations a quantize export computes


def keep_low_bits(path: Path, thresholds: set[int], choice: KernelChoice, rounding: str = "model") -> dict[str, Any]:
    """Rewrite the graph at `path`: every matmul weight and embedding table that is α·b with integer b (one α per
    tensor, per output column of a matmul, or per row of a table) is stored as codes of its own width (ternary
    2 bits, held five a byte in base 3, 3-4-bit weights 4, 5-8-bit weights 8; a ternary weight computing with the
    4-bit kernel is widened when the graph loads; a table and its tied projection share one copy) and computes
    with the kernel `choice` measures fastest for it (`modelshrink.onnx.kernels`). `rounding` says whose rounding
    of the activations the graph computes:
    - "model" and "none": a matmul's input that the model rounds keeps the model's rounding: only kernels that
      compute with it are weighed (unless one is named), and the uint8 kernel multiplies the model's own codes
      of the input (`modelshrink.onnx.rounding.integer_activations`), exactly the quantized product. The other roundings (attention's
      queries, keys, values and probabilities) are shortened with "model", taken out with "none";
    - "kernel": every integer kernel rounds its input its own way (the uint8 kernel per tensor, asymmetric, as
      `--int8`'s; MatMulNBits at accuracy level 4 per block of K, a finer rounding than the model's per tensor),
      so MatMulNBits is weighed too, and no rounding of the model's is left in the graph.
    Where a kernel rounds the input itself, the graph's own rounding of it is taken out. Returns what was stored
    and how."""
    import onnx
    from onnx import numpy_helper

    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    model = onnx.load(str(path))
    graph = LowBitGraph(model)
    pairs = transposed_pairs(graph)
    inits = {i.name: i for i in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output}

    def exact(names: list[str], options: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Where the model rounds the input of every matmul reading these weights, the kernels that compute with
        its own codes (`int8`, `float`); MatMulNBits rounds per block of K, another rounding, only if named."""
        readers = [node for name in names for node in graph.consumers.get(name, [])]
        if rounding != "kernel" and readers and all(rounded(producers, node.input[0]) for node in readers):
            return [c for c in options if c[0] != lowbit.NBITS] if choice.kernel == kernels.AUTO else options
        return options
    matmuls = tables = 0
    done: set[str] = set()
    for init in [i for i in model.graph.initializer if graph.gather_table(i)]:
        found = _integer_form(numpy_helper.to_array(init), thresholds)
        size = lowbit.block_size_for(init.dims[1])
        if found is None or size is None or (found[1].ndim and found[2] != 0):
            continue  # one α per row of the table (or for all): the blocks of its transpose, one column a row
        b, scale, _ = found
        tied = [inits[name] for name in pairs.get(init.name, [])]
        threshold = _threshold(b, thresholds)
        options = exact([t.name for t in tied], kernels.candidates_for(threshold))
        kernel, bits = choice.choose(b.shape[1], b.shape[0], options, size) if tied else options[-1]
        size = lowbit.kernel_block(kernel, bits, size)
        matmuls += graph.as_tied(init, tied, lowbit.integer_blocks(b.T, scale, bits, size), kernel,
                                 kernels.stored_bits(threshold, bits))
        done.update(name for name in pairs.get(init.name, []))
        tables += 1
    for init in [i for i in model.graph.initializer if i.name not in done and graph.matmul_weight(i)]:
        found = _integer_form(numpy_helper.to_array(init), thresholds)
        if found is not None and (not found[1].ndim or found[2] == 1):  # one α per output column (or for all)
            b, scale, _ = found
            size = lowbit.block_size_for(b.shape[0]) or 16
            threshold = _threshold(b, thresholds)
            options = exact([init.name], kernels.candidates_for(threshold))
            kernel, bits = choice.choose(*b.shape, options, size)
            size = lowbit.kernel_block(kernel, bits, size)
            matmuls += graph.as_matmul(init, lowbit.integer_blocks(b, scale, bits, size), kernel=kernel,
                                       stored_bits=kernels.stored_bits(threshold, bits))
    graph.finish()
    codes = integer_activations(model.graph, graph.integer_nodes) if rounding != "kernel" else 0
    unrounded = take_out_rounding(model.graph, graph.integer_nodes)
    shortened = shorten_rounding(model.graph, drop=rounding != "model")
    biases = fuse_bias(model.graph, graph.integer_nodes)
    save_graph(model, path)
    return {"low_bit_matmuls": matmuls, "low_bit_tables": tables, "inputs_as_model_codes": codes,
            "inputs_unrounded": unrounded, "roundings_shortened": shortened, "biases_fused": biases,
            "kernels": choice.report(), **graph.summary("low_bit")}


def _threshold(b: np.ndarray, thresholds: set[int]) -> int:
    """The smallest threshold that holds b: what its quantization's bits allow."""
    peak = int(np.abs(b).max()) if b.size else 0
    return min(th for th in thresholds if th >= peak)


def compact_quantized(path: Path, thresholds: set[int]) -> dict[str, int]:
    """Store float initializers whose values are α·b (b integer, |b| <= a threshold) as int8, turned back into
    floats by Cast and Mul (α per tensor, or per row of the stored matrix, or per column).

    The values are recognised rather than looked up by name: the exporter renames and transposes
    linear weights, but it keeps their values exactly. Cast and Mul rather than DequantizeLinear: onnxruntime
    (1.32) rewrites DequantizeLinear + MatMul into its own 8-bit kernels, which fail to load these weights
    ("TransposeDQWeightsForMatMulNBits Missing required weight") and would quantize the activations too; Cast
    and Mul of constants are folded into a float weight when the graph loads, in any client (Optimum,
    transformers.js), so the matmul computes exactly α·b."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    # keep_low_bits' scales: read by its ops, or by the Reshape that shapes them for a lookup
    feeding = {name for node in graph.node if node.domain == lowbit.DOMAIN for name in node.input}
    packed = feeding | {name for node in graph.node if set(node.output) & feeding for name in node.input}
    replaced, saved = 0, 0
    kept = []
    new_nodes = []
    for init in graph.initializer:
        w = numpy_helper.to_array(init) if init.data_type == onnx.TensorProto.FLOAT else None
        found = (_integer_form(w, thresholds) if w is not None and w.ndim == 2 and w.size >= 256
                 and init.name not in packed else None)
        if found is None:
            kept.append(init)
            continue
        b, scale, axis = found
        if scale.ndim == 1:  # broadcast against [rows, columns]: per row [rows, 1], per column [columns]
            scale = scale.reshape(-1, 1) if axis == 0 else scale
        q_name, s_name = init.name + "_int8", init.name + "_scale"
        kept += [numpy_helper.from_array(b, q_name), numpy_helper.from_array(scale, s_name)]
        new_nodes += [helper.make_node("Cast", [q_name], [init.name + "_cast"], name=init.name + "_cast",
                                       to=onnx.TensorProto.FLOAT),
                      helper.make_node("Mul", [init.name + "_cast", s_name], [init.name], name=init.name + "_scaled")]
        replaced += 1
        saved += w.nbytes - b.nbytes - scale.nbytes
    del graph.initializer[:]
    graph.initializer.extend(kept)
    for node in reversed(new_nodes):
        graph.node.insert(0, node)
    save_graph(model, path)
    return {"int8_initializers": replaced, "bytes_saved": int(saved)}


def _integer_form(w: np.ndarray, thresholds: set[int]) -> tuple[np.ndarray, np.ndarray, int] | None:
    for th in sorted(thresholds):
        for axis in (None, 0, 1):  # per tensor, per row of the stored matrix, per row of a transposed weight
            max_abs = np.abs(w).max(axis=None if axis is None else 1 - axis, keepdims=axis is not None)
            alpha = np.where(max_abs > 0, max_abs / th, 1.0).astype(np.float32)
            b = np.round(w / alpha)
            if np.abs(b).max() > th or np.abs(b * alpha - w).max() > 1e-6 * max(float(np.abs(w).max()), 1e-30):
                continue
            scale = alpha.reshape(()) if axis is None else alpha.reshape(-1)
            return b.astype(np.int8), scale.astype(np.float32), (axis if axis is not None else 0)
    return None
