"""The decoder's self-attention with past as onnxruntime's GroupQueryAttention, its cache written in place.

A traced decoder step appends the new key and value to the cache with a `Concat`: every step copies the
whole past of every layer into a new tensor (a tenth of a base-sized BART's int8 step at batch 16 x beam 4),
and beam search then copies the rows of the beams that moved. `fuse_self_attention` (on
decoder_with_past_model.onnx, before merging) replaces each layer's Concat, scores, Softmax and weighted sum
by one `com.microsoft::GroupQueryAttention` (as many key/value heads as query heads), which writes the new
key and value into its past input when past and present are the same buffer. The graph gains one input,
`past_sequence_length` (int64 [1]), with a default of -1 in an initializer: left at its default the past
input is the past itself and the present grows by one position as before (what Optimum and transformers.js
feed); given, the past inputs are buffers [rows, heads, capacity, head size] of which the first
`past_sequence_length` positions are filled, and modelshrink.runtime binds each present to its past, so a
step copies nothing. The positions the decoder reads from the past's shape read `past_sequence_length` too.

Only the pattern of the traced eager attention is rewritten (query and key/value projections reshaped to
heads, scores scaled by constants, an additive mask computed from shapes alone, Softmax, weighted sum);
any other reading of the cache, a bias computed from weights (T5's relative positions) or an activation
rounding in between (a quantize artifact's `--activation-rounding model`) leaves the graph as it is: all
layers or none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from modelshrink.onnx.merge import subgraphs
from modelshrink.onnx.saving import save_graph

PAST_LENGTH = "past_sequence_length"
OP = "GroupQueryAttention"
DOMAIN = "com.microsoft"
_PASS = ("Identity",)  # between a cache input and its reader, besides a one-input Concat


class _Graph:
    """Producers and consumers of every value of an onnx graph, and its constants."""

    def __init__(self, graph: Any):
        self.graph = graph
        self.producer = {o: n for n in graph.node for o in n.output}
        self.consumers: dict[str, list[Any]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.inputs = {i.name for i in graph.input}
        self.outputs = {o.name for o in graph.output}
        self.initializers = {i.name: i for i in graph.initializer}  # read when asked: a copy of each is a graph

    def users(self, name: str) -> list[Any]:
        return self.consumers.get(name, [])

    def only_user(self, name: str, op: str) -> Any | None:
        users = self.users(name)
        return users[0] if len(users) == 1 and users[0].op_type == op else None

    def root(self, name: str) -> str:
        """The value `name` copies, through Identity and one-input Concat nodes."""
        node = self.producer.get(name)
        while node is not None and (node.op_type in _PASS or (node.op_type == "Concat" and len(node.input) == 1)):
            name = node.input[0]
            node = self.producer.get(name)
        return name

    def constant(self, name: str) -> np.ndarray | None:
        from onnx import numpy_helper

        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant":
            value = next((a for a in node.attribute if a.name == "value"), None)
            return numpy_helper.to_array(value.t) if value is not None else None
        return None

    def from_shapes_only(self, name: str) -> bool:
        """Whether `name` is computed from the shapes of graph inputs and scalar constants alone (a causal
        mask), not from their values or from a weight."""
        return self.computed_from(name, frozenset()) is not None

    def computed_from(self, name: str, allowed: frozenset[str]) -> set[str] | None:
        """The graph inputs among `allowed` whose values `name` is computed from, where the rest is shapes and
        scalar constants; None where it reads another input's values or a weight."""
        seen, todo, read = set(), [name], set()
        while todo:
            current = todo.pop()
            if current in seen or not current:
                continue
            seen.add(current)
            if current in allowed:
                read.add(current)
                continue
            if current in self.inputs:
                return None
            value = self.constant(current)
            if value is not None:
                if value.size > 1 and value.dtype.kind == "f":
                    return None
                continue
            node = self.producer.get(current)
            if node is None:
                return None
            if node.op_type != "Shape":
                todo.extend(node.input)
        return read


def _perm(node: Any) -> list[int]:
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), [])


def _passes(node: Any) -> bool:
    """An Identity, or a Cast to float32 (the graphs are float32 throughout): nothing to compute."""
    if node.op_type == "Identity":
        return True
    return node.op_type == "Cast" and next((a.i for a in node.attribute if a.name == "to"), None) == 1


def _before_heads(g: _Graph, name: str) -> str | None:
    """X for `name` = Transpose(Reshape(X, [rows, length, heads, size]), perm 0 2 1 3), else None."""
    node = g.producer.get(name)
    if node is None or node.op_type != "Transpose" or _perm(node) != [0, 2, 1, 3]:
        return None
    reshape = g.producer.get(node.input[0])
    return reshape.input[0] if reshape is not None and reshape.op_type == "Reshape" else None


def _layer(g: _Graph, layer: int) -> dict[str, Any] | None:
    """The nodes of one layer's self-attention with past, or None where they are not the known pattern."""
    past_k, past_v = f"past_key_values.{layer}.decoder.key", f"past_key_values.{layer}.decoder.value"
    present_k, present_v = f"present.{layer}.decoder.key", f"present.{layer}.decoder.value"
    concats = [g.producer.get(present_k), g.producer.get(present_v)]
    for concat, past in zip(concats, (past_k, past_v)):
        axis = next((a.i for a in concat.attribute if a.name == "axis"), None) if concat is not None else None
        if concat is None or concat.op_type != "Concat" or len(concat.input) != 2 or axis not in (2, -2) \
                or g.root(concat.input[0]) != past:
            return None
    key, value = (_before_heads(g, c.input[1]) for c in concats)
    transpose = g.only_user(present_k, "Transpose")
    scores = g.only_user(transpose.output[0], "MatMul") if transpose is not None and _perm(transpose) == [0, 1, 3, 2] \
        else None
    if key is None or value is None or scores is None or list(scores.input).index(transpose.output[0]) != 1:
        return None
    query = _before_heads(g, scores.input[0])
    removed, scale, current = [concats[0], concats[1], transpose, scores], 1.0, scores.output[0]
    while True:
        users = g.users(current)
        if len(users) != 1 or query is None:
            return None
        node = users[0]
        removed.append(node)
        if node.op_type == "Softmax":
            if next((a.i for a in node.attribute if a.name == "axis"), -1) not in (-1, 3):
                return None
            break
        other = [n for n in node.input if n != current]
        factor = g.constant(other[0]) if len(other) == 1 else None
        if _passes(node):
            pass  # float32 stays float32 (the quantized attention's softmax in float; a removed rounding)
        elif node.op_type in ("Mul", "Div") and factor is not None and factor.size == 1:
            scale = scale * float(factor.reshape(())) if node.op_type == "Mul" else scale / float(factor.reshape(()))
        elif node.op_type == "Add" and len(other) == 1 and g.from_shapes_only(other[0]):
            pass  # the causal mask: nothing to hide from the one new query, which may read every cached position
        else:
            return None
        current = node.output[0]
    probabilities = node.output[0]
    while (after := g.users(probabilities)) and len(after) == 1 and _passes(after[0]):
        removed.append(after[0])
        probabilities = after[0].output[0]
    weighted = g.only_user(probabilities, "MatMul")
    if weighted is None or list(weighted.input) != [probabilities, present_v] \
            or [u for u in g.users(present_v) if u is not weighted]:
        return None
    back = g.only_user(weighted.output[0], "Transpose")
    merge = g.only_user(back.output[0], "Reshape") if back is not None and _perm(back) == [0, 2, 1, 3] else None
    if merge is None:
        return None
    removed += [weighted, back, merge]
    return {"query": query, "key": key, "value": value, "past": (past_k, past_v), "present": (present_k, present_v),
            "output": merge.output[0], "scale": scale, "removed": removed}


def _layers(g: _Graph) -> list[int]:
    found = sorted(int(name.split(".")[1]) for name in g.inputs
                   if name.startswith("past_key_values.") and name.endswith(".decoder.key"))
    return found


def _heads(graph: Any, name: str) -> int | None:
    value = next((i for i in graph.input if i.name == name), None)
    dims = value.type.tensor_type.shape.dim if value is not None else []
    return dims[1].dim_value if len(dims) == 4 and dims[1].dim_value > 0 else None


def runtime_lacks() -> str | None:
    """What the installed onnxruntime lacks of GroupQueryAttention as this rewrite writes it, or None."""
    try:
        from onnxruntime.capi.onnxruntime_pybind11_state import get_all_operator_schema

        schemas = {s.name: s for s in get_all_operator_schema() if s.domain == DOMAIN}
    except ImportError:  # a build without schema queries: assume the op is there, its load error would say not
        return None
    if OP not in schemas:
        return OP
    missing = [a for a in ("num_heads", "kv_num_heads", "scale") if a not in schemas[OP].attributes]
    return f"{OP}'s {missing[0]}" if missing else None


def fuse_self_attention(path: Path) -> dict[str, Any]:
    """Rewrite decoder_with_past_model.onnx's self-attention (see the module's docstring). Returns
    {"self_attention_layers": n}: all layers, or 0 with "self_attention_traced": why (the file is then left
    alone: a layer that is not the known pattern, or an onnxruntime without the op)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    lacking = runtime_lacks()
    if lacking:
        import onnxruntime

        return {"self_attention_layers": 0,
                "self_attention_traced": f"onnxruntime {onnxruntime.__version__} lacks {lacking}"}
    model = onnx.load(str(path))
    g = _Graph(model.graph)
    layers = _layers(g)
    plans = [_layer(g, layer) for layer in layers]
    heads = _heads(model.graph, f"past_key_values.{layers[0]}.decoder.key") if layers else None
    why = _kept_as_traced(g, layers, plans, heads)
    if why is not None:
        return {"self_attention_layers": 0, "self_attention_traced": why}
    p = "/self_attention"
    nodes, constants = _past_length_nodes(plans[0]["past"][0], p)
    rename = _filled_shapes(model.graph, g, {name for plan in plans for name in plan["past"]}, p, nodes, constants)
    removed = {n.output[0] for plan in plans for n in plan["removed"]}
    for layer, plan in zip(layers, plans):
        nodes.append(helper.make_node(
            OP, [plan["query"], plan["key"], plan["value"], *plan["past"], f"{p}/seqlens_k", f"{p}/total"],
            [plan["output"], *plan["present"]], name=f"{p}/layers.{layer}", domain=DOMAIN,
            num_heads=heads, kv_num_heads=heads, scale=float(plan["scale"])))
    for node in nodes:  # unique names: merging prefixes every node's name
        node.name = node.name or f"{node.output[0]}/{node.op_type}"
    kept = [n for n in model.graph.node if n.output[0] not in removed]
    for node in kept:
        node.input[:] = [rename.get(n, n) for n in node.input]
    graph = model.graph
    del graph.node[:]
    graph.node.extend(_live(kept + nodes, {o.name for o in graph.output}))
    graph.initializer.extend(constants)
    graph.initializer.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), PAST_LENGTH))
    graph.input.append(helper.make_tensor_value_info(PAST_LENGTH, TensorProto.INT64, [1]))
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    save_graph(model, path, check=True)
    return {"self_attention_layers": len(layers)}


def _kept_as_traced(g: _Graph, layers: list[int], plans: list[dict[str, Any] | None], heads: int | None) -> str | None:
    """Why the graph is left as traced, or None where every layer can be rewritten."""
    if layers and heads is not None and all(p is not None for p in plans) and PAST_LENGTH not in g.inputs:
        return None
    unknown = next((layer for layer, plan in zip(layers, plans) if plan is None), None)
    return "no self-attention cache inputs" if not layers else "already rewritten" if PAST_LENGTH in g.inputs \
        else f"layer {unknown}'s attention is not the plain pattern (a bias computed from weights, an " \
             "activation rounding, another reading of the cache)" if unknown is not None else "no static head count"


def _past_length_nodes(first_past: str, p: str) -> tuple[list[Any], list[Any]]:
    """(nodes, their constants) for the past length: the input where given, else the past's own length (axis 2);
    GroupQueryAttention's seqlens_k and total length, and the past's shape as filled."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Shape", [first_past], [f"{p}/past_shape"]),
        helper.make_node("Slice", [f"{p}/past_shape", f"{p}/i0", f"{p}/i2"], [f"{p}/rows_heads"]),
        helper.make_node("Slice", [f"{p}/past_shape", f"{p}/i2", f"{p}/i3"], [f"{p}/capacity"]),
        helper.make_node("Slice", [f"{p}/past_shape", f"{p}/i3", f"{p}/i4"], [f"{p}/size"]),
        helper.make_node("Less", [PAST_LENGTH, f"{p}/i0"], [f"{p}/not_given"]),
        helper.make_node("Where", [f"{p}/not_given", f"{p}/capacity", PAST_LENGTH], [f"{p}/length"]),
        helper.make_node("Concat", [f"{p}/rows_heads", f"{p}/length", f"{p}/size"], [f"{p}/past_shape_filled"], axis=0),
        helper.make_node("Slice", [f"{p}/past_shape", f"{p}/i0", f"{p}/i1"], [f"{p}/rows"]),
        helper.make_node("Expand", [f"{p}/length", f"{p}/rows"], [f"{p}/lengths"]),
        helper.make_node("Cast", [f"{p}/lengths"], [f"{p}/seqlens_k"], to=TensorProto.INT32),
        helper.make_node("Add", [f"{p}/length", f"{p}/i1"], [f"{p}/total_1d"]),
        helper.make_node("Reshape", [f"{p}/total_1d", f"{p}/scalar"], [f"{p}/total_64"]),
        helper.make_node("Cast", [f"{p}/total_64"], [f"{p}/total"], to=TensorProto.INT32),
    ]
    constants = [numpy_helper.from_array(np.array([k], dtype=np.int64), f"{p}/i{k}") for k in range(5)]
    constants.append(numpy_helper.from_array(np.zeros(0, dtype=np.int64), f"{p}/scalar"))
    return nodes, constants


def _filled_shapes(graph: Any, g: _Graph, pasts: set[str], p: str, nodes: list[Any], constants: list[Any]) -> dict[str, str]:
    """Every other reader of a cache input's shape (the positions, the causal mask) reads the filled length: the
    outputs of those Shape nodes -> what replaces them (adding the slices it needs to `nodes` and `constants`)."""
    from onnx import helper, numpy_helper

    rename: dict[str, str] = {}
    for node in graph.node:
        if node.op_type == "Shape" and g.root(node.input[0]) in pasts:
            if node.attribute:  # Shape's start/end (opset 15): the same slice of the filled shape
                start = next((a.i for a in node.attribute if a.name == "start"), 0)
                end = next((a.i for a in node.attribute if a.name == "end"), 4)
                name = f"{p}/{node.output[0]}/sliced"
                constants += [numpy_helper.from_array(np.array([start], dtype=np.int64), f"{name}/start"),
                              numpy_helper.from_array(np.array([end], dtype=np.int64), f"{name}/end")]
                nodes.append(helper.make_node("Slice", [f"{p}/past_shape_filled", f"{name}/start", f"{name}/end"],
                                              [name]))
                rename[node.output[0]] = name
            else:
                rename[node.output[0]] = f"{p}/past_shape_filled"
    return rename


def _live(nodes: list[Any], outputs: set[str]) -> list[Any]:
    """`nodes` in a valid order without those nothing reads (what the rewrite left behind), in topological order."""
    producer = {o: node for node in nodes for o in node.output}
    needed, todo = set(), list(outputs)
    while todo:
        name = todo.pop()
        node = producer.get(name)
        if node is not None and id(node) not in needed:
            needed.add(id(node))
            todo.extend(reads(node))
    keep = [node for node in nodes if id(node) in needed]
    made = {o for node in keep for o in node.output}
    produced: set[str] = set()
    ordered, pending = [], keep
    while pending:  # the new nodes were appended at the end: move each after what it reads
        rest = []
        for node in pending:
            if all(n in produced or n not in made for n in reads(node)):
                ordered.append(node)
                produced.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):
            raise ValueError("cycle in the rewritten graph")
        pending = rest
    return ordered


def reads(node: Any) -> list[str]:
    """The values `node` reads: its inputs and those its subgraphs (an If's branches) read from outside."""
    names = list(node.input)
    for graph in subgraphs(node):
        inner = {o for n in graph.node for o in n.output} | {i.name for i in graph.initializer}
        names += [name for n in graph.node for name in reads(n) if name not in inner]
    return names
