"""Rewrites that keep a `quantize` artifact's integer weights, or store weights in 8 bits.

A `quantize` artifact's weights are α·b with integer b (ternary, or |b| <= 2^(bits-1) - 1), found by value in
the traced graphs (the exporter renames and transposes linear weights, but it keeps their values exactly):
- `keep_low_bits`: matmul weights and embedding tables as codes of their own width (ternary in 2 bits, 3-4-bit
  weights in 4, 5-8-bit weights in 8; `modelshrink.onnx.lowbit`), a tied output projection sharing its table's
  codes, each matmul computing with the kernel measured fastest for it (`modelshrink.onnx.kernels`): the uint8
  kernel on the model's own codes of its input (`integer_activations`), exactly the quantized product;
- `compact_quantized`: the rest (a weight no such op reads) as int8 with a Cast and a Mul by its scale (per
  tensor, row or column), which onnxruntime folds into a float weight on load; about 4x smaller than float32.
- `quantize_int8` (`--int8`): 8-bit weights with one scale and zero point per output column, each matmul on the
  integer kernel measured fastest for it (onnxruntime's uint8 kernel, as its dynamic quantization gives, or
  MatMulNBits at 8 bits), activations quantized on the fly; then `quantize_embeddings`: embedding tables in int8
  with a scale per row. See `quantize_int8` for the choices and what they measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from modelshrink.onnx import kernels, lowbit
from modelshrink.onnx.kernels import KernelChoice


ROUNDINGS = ("model", "none", "kernel")  # whose rounding of the activations a quantize export computes


def keep_low_bits(path: Path, thresholds: set[int], choice: KernelChoice, rounding: str = "model") -> dict[str, Any]:
    """Rewrite the graph at `path`: every matmul weight and embedding table that is α·b with integer b (one α per
    tensor, per output column of a matmul, or per row of a table) is stored as codes of its own width (ternary
    2 bits, 3-4-bit weights 4, 5-8-bit weights 8; a ternary weight computing with the 4-bit kernel is widened when
    the graph loads; a table and its tied projection share one copy) and computes
    with the kernel `choice` measures fastest for it (`modelshrink.onnx.kernels`). `rounding` says whose rounding
    of the activations the graph computes:
    - "model" and "none": a matmul's input that the model rounds keeps the model's rounding: only kernels that
      compute with it are weighed (unless one is named), and the uint8 kernel multiplies the model's own codes
      of the input (`integer_activations`), exactly the quantized product. The other roundings (attention's
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
    graph = lowbit.LowBitGraph(model)
    pairs = lowbit.transposed_pairs(graph)
    inits = {i.name: i for i in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output}

    def exact(names: list[str], options: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Where the model rounds the input of every matmul reading these weights, the kernels that compute with
        its own codes (`int8`, `float`); MatMulNBits rounds per block of K, another rounding, only if named."""
        readers = [node for name in names for node in graph.consumers.get(name, [])]
        if rounding != "kernel" and readers and all(_rounded(producers, node.input[0]) for node in readers):
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
    onnx.save(model, str(path))
    return {"low_bit_matmuls": matmuls, "low_bit_tables": tables, "inputs_as_model_codes": codes,
            "inputs_unrounded": unrounded, "roundings_shortened": shortened, "biases_fused": biases,
            "kernels": choice.report(), **graph.summary("low_bit")}


def _threshold(b: np.ndarray, thresholds: set[int]) -> int:
    """The smallest threshold that holds b: what its quantization's bits allow."""
    peak = int(np.abs(b).max()) if b.size else 0
    return min(th for th in thresholds if th >= peak)


def _rounded(producers: dict[str, Any], name: str) -> bool:
    """Whether tensor `name` is the quantized model's straight-through rounding of some x."""
    return name in producers and _straight_through(producers, producers[name]) is not None


def _division_of(producers: dict[str, Any], clip: Any) -> Any | None:
    """Div(x, α) under a rounding's Round (Casts of float to float in between)."""
    name = clip.input[0]
    for _ in range(4):
        node = producers.get(name)
        if node is None:
            return None
        if node.op_type == "Div":
            return node
        name = node.input[0]
    return None


def integer_activations(graph: Any, nodes: list[Any]) -> int:
    """Each of `nodes` that is the uint8 kernel (DynamicQuantizeMatMul, which would round its input once more, per
    tensor and asymmetrically) and reads the model's straight-through rounding of x becomes MatMulIntegerToFloat on
    the model's own codes: k = round(x / α), with the rounding's own α, as uint8 k + 128 (QuantizeLinear with zero
    point 128: one node for the Div, Round, Clip, Add and Cast it stands for, the same codes, since |x / α| <= th
    <= 127 whether α is max|x| / th or a fixed range that x was clamped to). The product is then the quantized
    model's, in integers, up to float summation of the scales. Returns the nodes changed."""
    from onnx import helper, numpy_helper

    producers = {out: node for node in graph.node for out in node.output}
    codes: dict[str, tuple[str, str]] = {}  # rounded tensor -> (uint8 codes, α), one per input read by several
    new: list[tuple[Any, list[Any]]] = []
    changed = 0
    for node in nodes:
        found = node.op_type == "DynamicQuantizeMatMul" and producers.get(node.input[0]) and _straight_through(
            producers, producers[node.input[0]])
        division = found and _division_of(producers, found[1])
        if not division:
            continue
        rounded = node.input[0]
        if rounded not in codes:
            tag = rounded + "_codes"
            x, alpha = division.input[0], division.input[1]
            new.append((division, [helper.make_node("QuantizeLinear", [x, alpha, "codes_zero_128"], [tag], name=tag)]))
            codes[rounded] = (tag, alpha)
        a, alpha = codes[rounded]
        b, b_scale, b_zero = node.input[1:4]
        node.CopyFrom(helper.make_node("MatMulIntegerToFloat", [a, b, alpha, b_scale, "codes_zero_128", b_zero],
                                       list(node.output), name=node.name + "_codes", domain=node.domain))
        changed += 1
    if changed:
        graph.initializer.append(numpy_helper.from_array(np.array(128, dtype=np.uint8), "codes_zero_128"))
    for after, extra in new:
        at = list(graph.node).index(after) + 1
        for offset, added in enumerate(extra):
            graph.node.insert(at + offset, added)
    return changed


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


def take_out_rounding(graph: Any, nodes: list[Any]) -> int:
    """For each of `nodes` whose input A is the quantized model's straight-through rounding of x
    (`_straight_through`), read x itself: the integer kernel rounds it. Nodes left unread are removed. Returns the
    inputs changed."""
    producers = {out: node for node in graph.node for out in node.output}
    changed = 0
    for node in nodes:
        found = producers.get(node.input[0]) and _straight_through(producers, producers[node.input[0]])
        if found:
            node.input[0] = found[0]
            changed += 1
    remove_unread(graph)
    return changed


def _straight_through(producers: dict[str, Any], node: Any) -> tuple[str, Any] | None:
    """(x, the Clip node) where `node` is Add(rounded x, Sub(x, x)), the forward value of the quantized model's
    `q + (x - x.detach())` with q = clip(round(x / α), -th, th) · α (`modelshrink.quant.quantizers`)."""
    if node.op_type != "Add":
        return None
    for position, other in enumerate(node.input):
        sub = producers.get(other)
        if sub is None or sub.op_type != "Sub" or sub.input[0] != sub.input[1]:
            continue
        seen, name = 0, node.input[1 - position]
        while seen < 4 and name in producers:  # Cast (float to float), then Mul(Clip(...), α)
            step = producers[name]
            clip = next((producers[i] for i in step.input if i in producers and producers[i].op_type == "Clip"), None)
            if clip is not None:
                return sub.input[0], clip
            name, seen = step.input[0], seen + 1
    return None


def shorten_rounding(graph: Any, drop: bool = False) -> int:
    """Each straight-through rounding the tracing wrote (13 nodes: casts of a float to float, a Where for an
    all-zero tensor, a Clip that round(x / α) never exceeds, Sub(x, x) and an Add of its zero) as the 7 that
    compute the same values: α = max(max|x|, tiny) / th, round(x / α) · α. A decoder step of a BART-base-shaped
    model holds about 80 of them, whose every node costs onnxruntime a few microseconds. With `drop`, x itself
    (an Identity, which onnxruntime removes). Returns those rewritten."""
    from onnx import helper, numpy_helper

    producers = {out: node for node in graph.node for out in node.output}
    constants = {node.output[0]: numpy_helper.to_array(next(a.t for a in node.attribute if a.name == "value"))
                 for node in graph.node if node.op_type == "Constant" and any(a.name == "value" for a in node.attribute)}
    constants.update({init.name: numpy_helper.to_array(init) for init in graph.initializer})
    tiny = "rounding_tiny"
    rewritten, new = 0, []
    for node in list(graph.node):
        found = _straight_through(producers, node)
        if found is None or len(found[1].input) < 3 or found[1].input[2] not in constants:
            continue
        x, clip = found
        out, tag = node.output[0], node.output[0] + "_rounding"
        if drop:
            new.append((node, [helper.make_node("Identity", [x], [out], name=tag)]))
            rewritten += 1
            continue
        top = f"rounding_th_{int(constants[clip.input[2]])}"
        if top not in {i.name for i in graph.initializer}:
            graph.initializer.append(numpy_helper.from_array(np.array(constants[clip.input[2]], dtype=np.float32), top))
        new.append((node, [helper.make_node("Abs", [x], [tag + "_abs"], name=tag + "_abs"),
                           helper.make_node("ReduceMax", [tag + "_abs"], [tag + "_max"], name=tag + "_max", keepdims=0),
                           helper.make_node("Max", [tag + "_max", tiny], [tag + "_safe"], name=tag + "_safe"),
                           helper.make_node("Div", [tag + "_safe", top], [tag + "_step"], name=tag + "_step"),
                           helper.make_node("Div", [x, tag + "_step"], [tag + "_steps"], name=tag + "_steps"),
                           helper.make_node("Round", [tag + "_steps"], [tag + "_round"], name=tag + "_round"),
                           helper.make_node("Mul", [tag + "_round", tag + "_step"], [out], name=tag)]))
        rewritten += 1
    if rewritten and not drop:
        graph.initializer.append(numpy_helper.from_array(np.array(np.finfo(np.float32).tiny, dtype=np.float32), tiny))
    for node, replacement in new:
        at = list(graph.node).index(node)
        graph.node.remove(node)
        for offset, extra in enumerate(replacement):
            graph.node.insert(at + offset, extra)
    remove_unread(graph)
    return rewritten


def remove_unread(graph: Any) -> None:
    """Remove the nodes none of whose outputs is read (by a node, a subgraph or the graph's outputs)."""
    while True:
        read = {o.name for o in graph.output}
        for node in graph.node:
            read.update(node.input)
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    read.update(name for inner in sub.node for name in inner.input)
        dead = [node for node in graph.node if not any(out in read for out in node.output)]
        if not dead:
            return
        for node in dead:
            graph.node.remove(node)


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
    onnx.save(model, str(path))
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
    onnx.save(model, str(path))
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
    codes = np.clip(np.round(weight / scale) + zero, 0, 255)
    scale, zero = np.broadcast_to(scale, (n,)), np.broadcast_to(zero, (n,))
    groups = -(-k // block_size)
    padded = np.broadcast_to(zero, (groups * block_size, n)).copy()
    padded[:k] = codes
    return lowbit.Blocks(padded.T.reshape(n, groups, block_size).astype(np.uint8),
                         np.ascontiguousarray(np.repeat(scale[:, None], groups, axis=1), dtype=np.float32),
                         np.repeat(zero[:, None], groups, axis=1).astype(np.uint8), 8, k)


def int8_blocks(weight: np.ndarray, block_size: int, per_channel: bool = True) -> lowbit.Blocks:
    """A [K, N] weight as symmetric int8 codes b = round(w / s), |b| <= 127, with s = max |w| / 127 per output
    column (`per_channel`) or for the whole tensor, as onnxruntime's dynamic quantization rounds a QInt8 weight:
    the codes the `s8` kernel multiplies (stored as b + 128 under the default zero point, `integer_blocks`)."""
    peak = np.abs(weight).max(axis=0 if per_channel else None).astype(np.float32)
    scale = np.where(peak > 0, peak / 127, np.float32(1.0)).astype(np.float32)
    b = np.clip(np.round(weight / scale), -127, 127)
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
    graph = lowbit.LowBitGraph(model)
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
    onnx.save(model, str(path))
    floats = {i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
    if any(node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in floats
           for node in model.graph.node):
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
    tables = quantize_embeddings(path)
    return {"int8_matmuls": nodes, "int8_weights": weights, "int8_tables": tables, "biases_fused": biases,
            "kernels": choice.report(),
            **graph.summary("int8")}
