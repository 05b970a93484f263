"""The decoder's cross-attention with past as onnxruntime's GroupQueryAttention, over each document's own length.

After `modelshrink.onnx.fuse` a decoder step reads the cross-attention keys and values once per document, but
over the batch's longest source: at batch 16 x beam 4 on Debian documents (84 tokens on average, 267 at most)
two thirds of what a step read there was padding, and the two matmuls around the softmax, a few thousand small
products, ran at a third of the machine's memory bandwidth. `fuse_cross_attention` (on
decoder_with_past_model.onnx, after `fuse_decoder_with_past` and `fuse_self_attention`, before merging) puts
one `com.microsoft::GroupQueryAttention` in their place: a document's beams are its query heads (heads x beams
of them, `beams` of each sharing one key/value head), and each document is read up to its own length, taken
from `encoder_attention_mask` (right padding, as modelshrink.runtime pads). The op needs its past and present
in one buffer to read without copying, so it writes the last source position's key and value again (the same
numbers) and the runtime binds `present.{i}.encoder.key/value` to the cached keys and values it feeds.

That path is taken only where it applies: an `If` in each layer runs it when `past_sequence_length` is given
(only modelshrink.runtime gives it; Optimum and transformers.js leave the default of -1) and the rows are
`beams` per document, where `beams` is the generation config's num_beams, recorded in the model's metadata
(`CROSS_BEAMS`); otherwise the traced, per-document attention runs as before and the present outputs are empty.

Only the traced eager pattern is rewritten (scores scaled by constants, an additive mask computed from
`encoder_attention_mask` alone, Softmax, weighted sum), in every layer or none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from modelshrink.onnx.saving import save_graph
from modelshrink.onnx.self_attention import DOMAIN, OP, PAST_LENGTH, _before_heads, _Graph, _heads, _live, _passes, \
    _perm
from modelshrink.runtime.cache import CROSS_BEAMS  # the metadata the runtime reads: rows a document of the fast path
from modelshrink.runtime.search import DOCUMENTS
MASK = "encoder_attention_mask"


def _from_mask_only(g: _Graph, name: str) -> bool:
    """Whether `name` is computed from encoder_attention_mask, shapes and scalar constants alone."""
    return g.computed_from(name, frozenset({MASK})) == {MASK}


def _chain(g: _Graph, name: str, ops: tuple[str, ...]) -> str | None:
    """The value at the end of single-reader nodes of types `ops`, in that order, from `name`; else None."""
    for op in ops:
        node = g.only_user(name, op)
        if node is None:
            return None
        name = node.output[0]
    return name


def _product(g: _Graph, past: str) -> tuple[Any, str] | None:
    """The per-document MatMul that reads `past` (through layout ops) as its second operand and the value its
    block ends in, [rows, heads, target, y] (modelshrink.onnx.fuse._per_document); else None."""
    current = past
    while True:
        users = [u for u in g.users(current) if u.op_type != "Shape"]  # the block reads the number of documents
        if len(users) != 1:
            return None
        node = users[0]
        if node.op_type == "MatMul":
            if list(node.input).index(current) != 1:
                return None
            end = _chain(g, node.output[0], ("Reshape", "Transpose", "Reshape"))
            return (node, end) if end is not None else None
        if not (_passes(node) or (node.op_type == "Transpose" and _perm(node) == [0, 1, 3, 2])):
            return None
        current = node.output[0]


def _operand(g: _Graph, matmul: Any) -> str | None:
    """A, where the per-document MatMul's first operand is Reshape(Transpose(Reshape(A, ...)), ...)."""
    node = g.producer.get(matmul.input[0])
    for op in ("Reshape", "Transpose", "Reshape"):
        if node is None or node.op_type != op:
            return None
        source = node.input[0]
        node = g.producer.get(source)
    return source


def _forward(g: _Graph, sources: set[str]) -> set[str]:
    """Every value computed from `sources`, directly or not (the sources included)."""
    reached, todo = set(sources), list(sources)
    while todo:
        for node in g.users(todo.pop()):
            for out in node.output:
                if out not in reached:
                    reached.add(out)
                    todo.append(out)
    return reached


def _layer(g: _Graph, layer: int) -> dict[str, Any] | None:
    """One layer's cross-attention with past: the query [rows, 1, width] before its heads, the scale, the
    attention output [rows, 1, width] and the nodes computing it from them; None where it is not the pattern."""
    past_k, past_v = f"past_key_values.{layer}.encoder.key", f"past_key_values.{layer}.encoder.value"
    found_k, found_v = _product(g, past_k), _product(g, past_v)
    if found_k is None or found_v is None:
        return None
    (scores_mm, scores), (weighted_mm, weighted) = found_k, found_v
    heads = _operand(g, scores_mm)
    query = _before_heads(g, heads) if heads is not None else None
    if query is None:
        return None
    scale, current = 1.0, scores
    while True:  # scores -> [scale] -> [mask] -> Softmax
        users = g.users(current)
        if len(users) != 1:
            return None
        node = users[0]
        other = [n for n in node.input if n != current]
        factor = g.constant(other[0]) if len(other) == 1 else None
        if node.op_type == "Softmax":
            if next((a.i for a in node.attribute if a.name == "axis"), -1) not in (-1, 3):
                return None
            break
        if _passes(node):
            pass
        elif node.op_type in ("Mul", "Div") and factor is not None and factor.size == 1 \
                and (node.op_type == "Mul" or node.input[0] == current):
            scale = scale * float(factor.reshape(())) if node.op_type == "Mul" else scale / float(factor.reshape(()))
        elif node.op_type == "Add" and len(other) == 1 and _from_mask_only(g, other[0]):
            pass  # the additive mask of the padded source positions, which the fused op reads as lengths
        else:
            return None
        current = node.output[0]
    probabilities = node.output[0]
    while (after := [u for u in g.users(probabilities) if u.op_type != "Shape"]) and len(after) == 1 \
            and _passes(after[0]):
        probabilities = after[0].output[0]
    if _operand(g, weighted_mm) != probabilities:
        return None
    output = _chain(g, weighted, ("Transpose", "Reshape"))
    if output is None or _perm(g.only_user(weighted, "Transpose")) != [0, 2, 1, 3]:
        return None
    # the nodes from the heads of the query and the cached keys and values to the output: these move into the
    # fallback branch; each value they make must be read by them alone (but the output)
    reached = _forward(g, {heads, past_k, past_v})
    nodes, seen, todo = [], set(), [output]
    while todo:
        node = g.producer.get(todo.pop())
        if node is None or node.output[0] not in reached or node.output[0] in seen:
            continue
        seen.add(node.output[0])
        nodes.append(node)
        todo.extend(node.input)
    made = {o for n in nodes for o in n.output}
    if any(u.output[0] not in made for n in nodes for o in n.output if o != output for u in g.users(o)) \
            or any(o in g.outputs for o in made):
        return None
    return {"query": query, "past": (past_k, past_v), "scale": scale, "output": output, "nodes": nodes}


def _layers(g: _Graph) -> list[int]:
    return sorted(int(name.split(".")[1]) for name in g.inputs
                  if name.startswith("past_key_values.") and name.endswith(".encoder.key"))


def _const(name: str, value: list[int]) -> Any:
    from onnx import numpy_helper

    return numpy_helper.from_array(np.array(value, dtype=np.int64), name)


def _fast_branch(plan: dict[str, Any], layer: int, heads: int, size: int, beams: int) -> Any:
    """The then-branch: GroupQueryAttention over each document's own length, the beams as query heads."""
    from onnx import TensorProto, helper

    p, c = f"/cross_attention/layers.{layer}", "/cross_attention"
    (past_k, past_v), query = plan["past"], plan["query"]
    nodes = [
        # queries [rows, 1, width] -> [documents, 1, heads x beams x size], a head's beams side by side
        helper.make_node("Reshape", [query, f"{c}/beams_heads_size"], [f"{p}/q4"]),
        helper.make_node("Transpose", [f"{p}/q4"], [f"{p}/q4t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", [f"{p}/q4t", f"{c}/one_query"], [f"{p}/q"]),
    ]
    for tag, past in (("k", past_k), ("v", past_v)):  # the last source position, written again in place
        nodes += [helper.make_node("GatherElements", [past, f"{c}/last_index"], [f"{p}/{tag}_last"], axis=2),
                  helper.make_node("Transpose", [f"{p}/{tag}_last"], [f"{p}/{tag}_last_t"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [f"{p}/{tag}_last_t", f"{c}/one_key"], [f"{p}/{tag}_new"])]
    nodes += [
        helper.make_node(OP, [f"{p}/q", f"{p}/k_new", f"{p}/v_new", past_k, past_v, f"{c}/seqlens_k", f"{c}/total"],
                         [f"{p}/o", f"{p}/present_k", f"{p}/present_v"], domain=DOMAIN, num_heads=heads * beams,
                         kv_num_heads=heads, scale=float(plan["scale"])),
        helper.make_node("Reshape", [f"{p}/o", f"{c}/heads_beams_size"], [f"{p}/o4"]),
        helper.make_node("Transpose", [f"{p}/o4"], [f"{p}/o4t"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", [f"{p}/o4t", f"{c}/rows_one_width"], [f"{p}/out"]),
    ]
    for node in nodes:
        node.name = f"{node.output[0]}/{node.op_type}"
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * rank)
               for n, rank in ((f"{p}/out", 3), (f"{p}/present_k", 4), (f"{p}/present_v", 4))]
    return helper.make_graph(nodes, f"cross_attention_{layer}_fused", [], outputs)


def _traced_branch(plan: dict[str, Any], layer: int) -> Any:
    """The else-branch: the per-document attention as it was, with empty presents."""
    from onnx import TensorProto, helper, numpy_helper

    p = f"/cross_attention/layers.{layer}"
    nodes = []
    for node in reversed(plan["nodes"]):  # found from the output back
        copy = type(node)()
        copy.CopyFrom(node)
        copy.output[:] = [f"{p}/traced_out" if o == plan["output"] else o for o in node.output]
        nodes.append(copy)
    empty = numpy_helper.from_array(np.zeros((0, 0, 0, 0), dtype=np.float32))
    for tag in ("k", "v"):
        nodes.append(helper.make_node("Constant", [], [f"{p}/no_present_{tag}"], name=f"{p}/no_present_{tag}",
                                      value=empty))
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * rank)
               for n, rank in ((f"{p}/traced_out", 3), (f"{p}/no_present_k", 4), (f"{p}/no_present_v", 4))]
    return helper.make_graph(_ordered(nodes), f"cross_attention_{layer}_traced", [], outputs)


def _ordered(nodes: list[Any]) -> list[Any]:
    made = {o for n in nodes for o in n.output}
    done: set[str] = set()
    ordered, pending = [], nodes
    while pending:
        rest = [n for n in pending if not all(i in done or i not in made for i in n.input)]
        for node in pending:
            if node not in rest:
                ordered.append(node)
                done.update(node.output)
        if len(rest) == len(pending):
            raise ValueError("cycle in the cross-attention's nodes")
        pending = rest
    return ordered


def fuse_cross_attention(path: Path, beams: int) -> dict[str, Any]:
    """Rewrite decoder_with_past_model.onnx's cross-attention (see the module's docstring) for `beams` beams
    per document. Returns {"cross_attention_layers": n}: all layers, or 0 with "cross_attention_traced": why
    (the file is then left alone)."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(path))
    g = _Graph(model.graph)
    layers = _layers(g)
    why = None
    if not layers:
        why = "no cross-attention cache inputs"
    elif PAST_LENGTH not in g.inputs:
        why = "the self-attention is not fused (no past_sequence_length to tell the runtime's calls)"
    elif any(p.key == CROSS_BEAMS for p in model.metadata_props):
        why = "already rewritten"
    plans = [] if why else [_layer(g, layer) for layer in layers]
    heads = _heads(model.graph, f"past_key_values.{layers[0]}.encoder.key") if layers else None
    size = _size(model.graph, f"past_key_values.{layers[0]}.encoder.key") if layers else None
    if why is None and (heads is None or size is None):
        why = "no static head count or head size"
    if why is None and any(p is None for p in plans):
        unknown = next(layer for layer, plan in zip(layers, plans) if plan is None)
        why = f"layer {unknown}'s cross-attention is not the plain pattern (a bias computed from weights, an " \
              "activation rounding, another reading of the cache)"
    if why is not None:
        return {"cross_attention_layers": 0, "cross_attention_traced": why}
    c = "/cross_attention"
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    shared = _shared_nodes(f"past_key_values.{layers[0]}.encoder.key", opset)
    constants = _shared_constants(beams, heads, size)
    moved = {n.output[0] for plan in plans for n in plan["nodes"]}
    ifs = []
    for layer, plan in zip(layers, plans):
        present = [f"present.{layer}.encoder.key", f"present.{layer}.encoder.value"]
        ifs.append(helper.make_node("If", [f"{c}/fused"], [plan["output"], *present], name=f"{c}/layers.{layer}",
                                    then_branch=_fast_branch(plan, layer, heads, size, beams),
                                    else_branch=_traced_branch(plan, layer)))
        model.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, [DOCUMENTS, heads, None, size])
                                  for n in present)
    kept = [n for n in model.graph.node if n.output[0] not in moved]
    graph = model.graph
    del graph.node[:]
    graph.node.extend(_live(kept + shared + ifs, {o.name for o in graph.output}))
    graph.initializer.extend(constants)
    entry = model.metadata_props.add()
    entry.key, entry.value = CROSS_BEAMS, str(beams)
    save_graph(model, path, check=True)
    return {"cross_attention_layers": len(layers), "cross_attention_beams": beams}


def _shared_nodes(first_past: str, opset: int) -> list[Any]:
    """The nodes every layer's If reads: whether the fused branch runs, each document's source length."""
    from onnx import TensorProto, helper

    c = "/cross_attention"
    sum_node = helper.make_node("ReduceSum", [f"{c}/doc_mask", f"{c}/axis1"], [f"{c}/lengths"], keepdims=0) \
        if opset >= 13 else helper.make_node("ReduceSum", [f"{c}/doc_mask"], [f"{c}/lengths"], axes=[1], keepdims=0)
    shared = [
        # the fused branch runs where the runtime calls (past_sequence_length given) with `beams` rows a document
        helper.make_node("Shape", ["input_ids"], [f"{c}/ids_shape"]),
        helper.make_node("Slice", [f"{c}/ids_shape", f"{c}/i0", f"{c}/i1"], [f"{c}/rows"]),
        helper.make_node("Shape", [first_past], [f"{c}/past_shape"]),
        helper.make_node("Slice", [f"{c}/past_shape", f"{c}/i0", f"{c}/i1"], [f"{c}/docs"]),
        helper.make_node("Mul", [f"{c}/docs", f"{c}/beams"], [f"{c}/docs_beams"]),
        helper.make_node("Equal", [f"{c}/rows", f"{c}/docs_beams"], [f"{c}/beams_match"]),
        helper.make_node("Less", [PAST_LENGTH, f"{c}/i0"], [f"{c}/not_given"]),
        helper.make_node("Not", [f"{c}/not_given"], [f"{c}/given"]),
        helper.make_node("And", [f"{c}/given", f"{c}/beams_match"], [f"{c}/fused"]),
        # each document's source length from its first beam's mask row (right padding)
        helper.make_node("Slice", [MASK, f"{c}/i0", f"{c}/end", f"{c}/i0", f"{c}/beams"], [f"{c}/doc_mask"]),
        sum_node,
        helper.make_node("Sub", [f"{c}/lengths", f"{c}/i1"], [f"{c}/last"]),
        helper.make_node("Cast", [f"{c}/last"], [f"{c}/seqlens_k"], to=TensorProto.INT32),
        helper.make_node("ReduceMax", [f"{c}/lengths"], [f"{c}/longest"], keepdims=0),
        helper.make_node("Cast", [f"{c}/longest"], [f"{c}/total"], to=TensorProto.INT32),
        helper.make_node("Reshape", [f"{c}/last", f"{c}/column"], [f"{c}/last4"]),
        helper.make_node("Expand", [f"{c}/last4", f"{c}/index_shape"], [f"{c}/last_index"]),
    ]
    for node in shared:
        node.name = f"{node.output[0]}/{node.op_type}"
    return shared


def _shared_constants(beams: int, heads: int, size: int) -> list[Any]:
    """The constants the shared nodes and the fused branches read."""
    c = "/cross_attention"
    return [_const(f"{c}/axis1", [1]),
            _const(f"{c}/i0", [0]), _const(f"{c}/i1", [1]), _const(f"{c}/beams", [beams]),
            _const(f"{c}/end", [np.iinfo(np.int64).max]), _const(f"{c}/column", [-1, 1, 1, 1]),
            _const(f"{c}/index_shape", [1, heads, 1, size]),
            _const(f"{c}/beams_heads_size", [-1, beams, heads, size]),
            _const(f"{c}/one_query", [-1, 1, heads * beams * size]),
            _const(f"{c}/one_key", [-1, 1, heads * size]), _const(f"{c}/heads_beams_size", [-1, heads, beams, size]),
            _const(f"{c}/rows_one_width", [-1, 1, heads * size])]


def _size(graph: Any, name: str) -> int | None:
    value = next((i for i in graph.input if i.name == name), None)
    dims = value.type.tensor_type.shape.dim if value is not None else []
    return dims[3].dim_value if len(dims) == 4 and dims[3].dim_value > 0 else None
