"""Graph rewrites of the decoder with past for decoding speed; the weights and the products stay the same.

`fuse_decoder_with_past` (on decoder_with_past_model.onnx, before merging) makes three:
- cross-attention once per document: in beam search every beam of a document attends to the same encoder
  states, yet the decoder took their keys and values as one row per beam, and every step read them all
  (at beam 4, batch 16, sources up to 267 tokens, a quarter of a base-sized BART's step). The rewritten
  decoder takes them once per document and multiplies the queries of all of a document's beams in one
  matmul: rows [documents x beams] are reshaped to [documents, heads, beams x target, width] around the two
  attention products. Only the kernel's summation order may change (logits moved by 2e-6 on that model).
  The runtime sees the rewrite in the inputs' first axis, named `documents`;
- no zero tensors made only for their shape: the decoder with past is traced with zero "encoder states"
  whose only use is their shape, [rows, source, width] of zeros filled at every step;
- no copies by one-input Concat nodes, which the traced cache code puts in front of each past key and value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from modelshrink.onnx.saving import save_graph
from modelshrink.runtime.search import DOCUMENTS  # the rewritten inputs' first axis, which the runtime reads

_LAYOUT = ("Identity", "Concat", "Transpose")  # what the traced graphs put between a cache input and its matmul


def _matmul_of(name: str, consumers: dict[str, list[Any]]) -> Any | None:
    """The MatMul that reads graph input `name` as its second operand, through layout ops that keep the
    first two axes (rows, heads) where they are; None if anything else reads it on the way."""
    current = name
    while True:
        users = consumers.get(current, [])
        if len(users) != 1:
            return None
        node = users[0]
        if node.op_type == "MatMul":
            return node if list(node.input).index(current) == 1 else None
        if node.op_type not in _LAYOUT or (node.op_type == "Concat" and len(node.input) != 1):
            return None
        if node.op_type == "Transpose":
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [])
            if perm[:2] != [0, 1]:
                return None
        current = node.output[0]


def _per_document(node: Any, source: str, prefix: str) -> list[Any]:
    """Nodes computing MatMul(A [rows, heads, target, x], B [documents, heads, x, y]) -> [rows, heads, target, y]
    with rows = documents x beams, a document's beams next to each other. B's own shape is not read (the
    number of documents comes from the graph input `source`), so that onnxruntime can still fold a
    transpose in front of B into its matmul."""
    from onnx import helper

    a, b, out, p = node.input[0], node.input[1], node.output[0], prefix
    nodes = [helper.make_node("Shape", [a], [f"{p}/shape_a"]), helper.make_node("Shape", [source], [f"{p}/shape_s"])]
    for tag, shape, start, end in (("docs", "s", 0, 1), ("heads", "a", 1, 2), ("target", "a", 2, 3), ("x", "a", 3, 4),
                                   ("rows_heads_target", "a", 0, 3)):
        nodes.append(helper.make_node("Slice", [f"{p}/shape_{shape}", f"_pd/i{start}", f"_pd/i{end}"], [f"{p}/{tag}"]))

    def concat(tag: str, parts: list[str]) -> None:
        nodes.append(helper.make_node("Concat", [x if x.startswith("_") else f"{p}/{x}" for x in parts],
                                      [f"{p}/{tag}"], axis=0))

    concat("s5", ["docs", "_pd/minus1", "heads", "target", "x"])
    concat("s4", ["docs", "heads", "_pd/minus1", "x"])
    nodes += [helper.make_node("Reshape", [a, f"{p}/s5"], [f"{p}/a5"]),
              helper.make_node("Shape", [f"{p}/a5"], [f"{p}/shape_a5"]),
              helper.make_node("Slice", [f"{p}/shape_a5", "_pd/i1", "_pd/i2"], [f"{p}/beams"])]
    concat("c5", ["docs", "heads", "beams", "target", "_pd/minus1"])
    concat("out", ["rows_heads_target", "_pd/minus1"])
    nodes += [helper.make_node("Transpose", [f"{p}/a5"], [f"{p}/a5t"], perm=[0, 2, 1, 3, 4]),
              helper.make_node("Reshape", [f"{p}/a5t", f"{p}/s4"], [f"{p}/a4"]),
              helper.make_node("MatMul", [f"{p}/a4", b], [f"{p}/c4"], name=node.name),
              helper.make_node("Reshape", [f"{p}/c4", f"{p}/c5"], [f"{p}/c5t"]),
              helper.make_node("Transpose", [f"{p}/c5t"], [f"{p}/c5r"], perm=[0, 2, 1, 3, 4]),
              helper.make_node("Reshape", [f"{p}/c5r", f"{p}/out"], [out])]
    for made in nodes:
        made.name = made.name or f"{made.output[0]}/{made.op_type}"  # unique: merging prefixes every node's name
    return nodes


def _per_document_graph(graph: Any, consumers: dict[str, list[Any]]) -> int:
    """The cross-attention rewrite on `graph` (see the module's docstring); all or nothing: when any
    cross-attention input is read other than by its attention product (a family this does not know),
    nothing changes. Returns the matmuls rewritten."""
    from onnx import numpy_helper

    inputs = [i for i in graph.input if i.name.startswith("past_key_values.") and ".encoder." in i.name]
    found = {i.name: _matmul_of(i.name, consumers) for i in inputs}
    if not inputs or any(node is None for node in found.values()):
        return 0
    graph.initializer.extend(numpy_helper.from_array(np.array([v], dtype=np.int64), f"_pd/{tag}")
                             for tag, v in (("minus1", -1), *((f"i{k}", k) for k in range(5))))
    # by output name: the protobuf wrappers of graph.node are not the same Python objects on every access
    replaced = {node.output[0]: _per_document(node, source, f"/per_document/{index}")
                for index, (source, node) in enumerate(found.items())}
    nodes = []
    for node in graph.node:
        nodes += replaced.get(node.output[0], [node])
    del graph.node[:]
    graph.node.extend(nodes)
    for value in inputs:
        value.type.tensor_type.shape.dim[0].dim_param = DOCUMENTS
    return len(replaced)


def _shape_only_constants(graph: Any, consumers: dict[str, list[Any]]) -> int:
    """ConstantOfShape nodes read only by Shape: the Shape's output is the ConstantOfShape's input (the zero
    'encoder states' of the decoder with past: 52 MB filled at every step at batch 16 x beam 4, source 267,
    about 5% of a step's time in onnxruntime's profile). Returns the nodes removed."""
    outputs = {o.name for o in graph.output}
    rename: dict[str, str] = {}
    dropped: set[str] = set()  # by output name (see _per_document_graph)
    for node in graph.node:
        users = consumers.get(node.output[0], []) if node.op_type == "ConstantOfShape" else []
        if users and all(u.op_type == "Shape" and not u.attribute and u.output[0] not in outputs for u in users):
            rename.update({u.output[0]: node.input[0] for u in users})
            dropped.update(n.output[0] for n in (node, *users))
    kept = [n for n in graph.node if n.output[0] not in dropped]
    for node in kept:
        for k, name in enumerate(node.input):
            if name in rename:
                node.input[k] = rename[name]
    del graph.node[:]
    graph.node.extend(kept)
    return len(dropped) // 2


def _single_input_concats(graph: Any) -> int:
    """Concat nodes of one input, which copy it whole (the traced cache code wraps each past key and value in
    one: at batch 16 x beam 4 they copied the cross-attention keys and values at every step, 17% of a base-sized
    BART's int8 step). Their readers read the input instead; one whose output is a graph output stays. Returns
    the nodes removed."""
    outputs = {o.name for o in graph.output}
    rename = {n.output[0]: n.input[0] for n in graph.node
              if n.op_type == "Concat" and len(n.input) == 1 and n.output[0] not in outputs}
    if not rename:
        return 0

    def source(name: str) -> str:
        while name in rename:
            name = rename[name]
        return name

    kept = [n for n in graph.node if n.output[0] not in rename]
    for node in kept:
        node.input[:] = [source(name) for name in node.input]
    del graph.node[:]
    graph.node.extend(kept)
    return len(rename)


def fuse_decoder_with_past(path: Path) -> dict[str, int]:
    """Rewrite decoder_with_past_model.onnx (before merging) for decoding speed: cross-attention keys and
    values once per document (`documents` axis), and no zero tensors made only for their shape. Returns
    what changed: {"per_document_matmuls": n, "shape_only_constants": m}."""
    import onnx

    model = onnx.load(str(path))
    consumers: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    report = {"per_document_matmuls": _per_document_graph(model.graph, consumers),
              "shape_only_constants": _shape_only_constants(model.graph, consumers),
              "single_input_concats": _single_input_concats(model.graph)}
    if any(report.values()):
        save_graph(model, path, check=True)
    return report
