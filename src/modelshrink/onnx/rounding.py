"""The quantized model's activation roundings in a traced graph, and the rewrites that keep, shorten or drop them.

A quantize artifact rounds some activations straight-through: the forward value of `q + (x - x.detach())` with
q = clip(round(x / α), -th, th) · α (`modelshrink.quant.quantizers`, in the form it takes under the exporter's
tracing; training takes one straight-through node instead), which the tracing writes as 13 nodes
(`straight_through` finds them). An integer kernel that rounds its input itself reads x instead
(`take_out_rounding`), or reads the model's own codes of x (`integer_activations`); the other roundings are
written in the 7 nodes that compute the same values (`shorten_rounding`), or taken out.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def straight_through(producers: dict[str, Any], node: Any) -> tuple[str, Any] | None:
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


def rounded(producers: dict[str, Any], name: str) -> bool:
    """Whether tensor `name` is the quantized model's straight-through rounding of some x."""
    return name in producers and straight_through(producers, producers[name]) is not None


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
        found = node.op_type == "DynamicQuantizeMatMul" and producers.get(node.input[0]) and straight_through(
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


def take_out_rounding(graph: Any, nodes: list[Any]) -> int:
    """For each of `nodes` whose input A is the quantized model's straight-through rounding of x
    (`straight_through`), read x itself: the integer kernel rounds it. Nodes left unread are removed. Returns the
    inputs changed."""
    producers = {out: node for node in graph.node for out in node.output}
    changed = 0
    for node in nodes:
        found = producers.get(node.input[0]) and straight_through(producers, producers[node.input[0]])
        if found:
            node.input[0] = found[0]
            changed += 1
    remove_unread(graph)
    return changed


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
    initializers = {init.name: init for init in graph.initializer}  # only the clips' bounds are read
    tiny = "rounding_tiny"
    rewritten, new = 0, []
    for node in list(graph.node):
        found = straight_through(producers, node)
        if found is None or len(found[1].input) < 3 or not ({found[1].input[2]} & (constants.keys() | initializers)):
            continue
        x, clip = found
        if clip.input[2] not in constants:
            constants[clip.input[2]] = numpy_helper.to_array(initializers[clip.input[2]])
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
