"""Rewrites that store a weight once: the two decoders merged into one graph, a tied output projection
kept as a Transpose of the embedding table.

Both find equal initializers by value, not by name: the exporter names and constant-folds each graph
separately, so the same weight can carry two names (and a tied projection is folded to its own transpose).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from modelshrink.onnx.saving import remove_graph, save_graph
from modelshrink.runtime.files import DECODER, DECODER_MERGED, DECODER_WITH_PAST


def _digest(value: np.ndarray) -> str:
    """What two initializers share when they hold the same values (names differ between exported graphs)."""
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest()


def merge_decoders(folder: Path) -> dict[str, int]:
    """decoder_model.onnx + decoder_with_past_model.onnx -> decoder_model_merged.onnx, weights stored once.

    The merged graph takes every input of both (and `use_cache_branch`, a bool [1]) and holds one If
    node: its then-branch is the decoder with past, its else-branch the first step; both read the
    initializers of the outer graph, found equal by value (the exporter names and constant-folds the
    two graphs separately, so the same weight can carry two names). In the with-past branch the
    cross-attention outputs, which never change after the first step, are empty tensors: the caller
    keeps the first step's. The two graphs are removed afterwards. Works on float and on int8 graphs
    (dynamic quantization of a weight is deterministic, so both graphs hold the same int8 copy).

    The first step's model becomes the merged one in place, its weights never copied: the peak holds the two
    graphs as loaded (a BART of distilbart-cnn's shape: 6.6 GB with copies at each step, issue 78)."""
    import onnx
    from onnx import helper

    models = {"first": onnx.load(str(folder / DECODER)), "past": onnx.load(str(folder / DECODER_WITH_PAST))}
    renamed, total, kept = _share_initializers(models)
    outer = {i.name: _copy(i) for tag in ("past", "first") for i in models[tag].graph.input}  # first's: any length
    first_outputs = [o.name for o in models["first"].graph.output]
    past_outputs = {o.name for o in models["past"].graph.output}
    then_branch = _branch(models, renamed["past"], outer, "past", [n for n in first_outputs if n not in past_outputs])
    else_branch = _branch(models, renamed["first"], outer, "first", [])
    constants = _hoist_constants([then_branch, else_branch], kept)
    inputs = [outer[name] for name in dict.fromkeys(
        [i.name for i in models["first"].graph.input] + [i.name for i in models["past"].graph.input])]
    outputs = []
    for o in models["first"].graph.output:
        info = onnx.ValueInfoProto()
        info.name = o.name
        info.type.tensor_type.elem_type = o.type.tensor_type.elem_type
        outputs.append(info)
    node = helper.make_node("If", ["use_cache_branch"], first_outputs, name="use_cache_branch_if",
                            then_branch=then_branch, else_branch=else_branch)
    # what a rewrite of the decoder with past recorded for the runtime (modelshrink.onnx.cross_attention)
    metadata = [_copy(p) for p in models["past"].metadata_props if p.key.startswith("modelshrink.")]
    merged = models.pop("first")
    del models  # the decoder with past's weights: those it shares are the first step's, the rest were moved
    graph = merged.graph
    for field in ("node", "input", "output", "value_info", "sparse_initializer", "quantization_annotation"):
        del getattr(graph, field)[:]
    graph.node.extend([*constants, node])
    graph.input.extend([*inputs, helper.make_tensor_value_info("use_cache_branch", onnx.TensorProto.BOOL, [1])])
    graph.output.extend(outputs)
    graph.name, graph.doc_string = "decoder_merged", ""
    merged.producer_name, merged.producer_version, merged.doc_string = "modelshrink", "", ""
    del merged.metadata_props[:]
    merged.metadata_props.extend(metadata)
    save_graph(merged, folder / DECODER_MERGED)
    remove_graph(folder / DECODER)
    remove_graph(folder / DECODER_WITH_PAST)
    return {"initializers": total, "shared": total - len(kept), "constant_nodes_hoisted": len(constants)}


def _copy(message: Any) -> Any:
    new = type(message)()
    new.CopyFrom(message)
    return new


def _share_initializers(models: dict[str, Any]) -> tuple[dict[str, dict[str, str]], int, set[str]]:
    """Each value once, in the first step's graph: its duplicates removed, the decoder with past's own values moved
    into it (the shared ones are not copied). Returns (for each graph its names -> the kept names, how many
    initializers the graphs held, the kept names). An overridable input's default (onnx/self_attention.py) keeps
    its own name."""
    from onnx import numpy_helper

    kept: set[str] = set()
    by_value: dict[tuple, str] = {}
    total = 0
    renamed: dict[str, dict[str, str]] = {}
    target = models["first"].graph.initializer
    for tag, model in models.items():
        mapping = renamed[tag] = {}
        overridable = {i.name for i in model.graph.input}
        dropped, moved = [], []
        for index, init in enumerate(model.graph.initializer):
            total += 1
            key = (init.data_type, tuple(init.dims), _digest(numpy_helper.to_array(init)))
            name = by_value.get(key) if init.name not in overridable else None
            if name is None:
                name = init.name if init.name not in kept else f"{tag}/{init.name}"
                kept.add(name)
                if init.name not in overridable:
                    by_value[key] = name
                if tag != "first" or name != init.name:
                    moved.append((index, name))
            elif tag == "first":
                dropped.append(index)
            mapping[init.name] = name
        for index, name in moved:
            if tag == "first":
                target[index].name = name
            else:
                copy = target.add()
                copy.CopyFrom(model.graph.initializer[index])
                copy.name = name
        for index in reversed(dropped):
            del target[index]
        if tag != "first":
            del model.graph.initializer[:]
    return renamed, total, kept


def _branch(models: dict[str, Any], mapping: dict[str, str], outer: dict[str, Any], tag: str,
            extra_outputs: list[str]) -> Any:
    """Graph `tag` as a branch of the merged If: its names prefixed with the tag but for the outer graph's inputs
    and the shared initializers (`mapping`), the first step's outputs in its order, `extra_outputs` as empty
    tensors."""
    import onnx
    from onnx import helper, numpy_helper

    graph = models[tag].graph

    def rename(name: str) -> str:
        return name if not name or name in outer else mapping.get(name, f"{tag}/{name}")

    def copied(node: Any) -> Any:
        new = onnx.NodeProto()
        new.CopyFrom(node)
        _rename_within(new, tag, rename)
        return new

    nodes = [copied(node) for node in graph.node]
    outputs = {o.name: o for o in graph.output}
    for name in extra_outputs:  # an empty float tensor of the output's rank
        reference = next(o for o in models["first"].graph.output if o.name == name)
        rank = len(reference.type.tensor_type.shape.dim)
        empty = numpy_helper.from_array(np.zeros((0,) * rank, dtype=np.float32), f"{tag}/{name}")
        nodes.append(helper.make_node("Constant", [], [f"{tag}/{name}"], name=f"{tag}/{name}/empty", value=empty))
        outputs[name] = reference
    order = [o.name for o in models["first"].graph.output]
    values = []
    for name in order:
        source = outputs[name]
        info = onnx.ValueInfoProto()
        info.name = rename(name) if name in {o.name for o in graph.output} else f"{tag}/{name}"
        info.type.tensor_type.elem_type = source.type.tensor_type.elem_type
        values.append(info)
    return helper.make_graph(nodes, f"decoder_{tag}", [], values)


def subgraphs(node: Any) -> list[Any]:
    """The graphs `node` holds in its attributes (an If's branches, a Loop's body)."""
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else list(a.graphs))]


def _rename_within(node: Any, tag: str, rename: Any) -> None:
    """Prefix `node`'s name with `tag` and rename what it reads and makes, inside its subgraphs too (an If in a
    layer: modelshrink.onnx.cross_attention), whose values read from outside keep the outer graph's names."""
    node.name = f"{tag}/{node.name}"
    node.input[:] = [rename(n) for n in node.input]
    node.output[:] = [rename(n) for n in node.output]
    for graph in subgraphs(node):
        for inner in graph.node:
            _rename_within(inner, tag, rename)
        for value in graph.output:
            value.name = rename(value.name)


def _alias_within(node: Any, alias: dict[str, str]) -> None:
    """Replace the names in `alias` wherever `node` or its subgraphs read them."""
    node.input[:] = [alias.get(n, n) for n in node.input]
    for graph in subgraphs(node):
        for inner in graph.node:
            _alias_within(inner, alias)


def _hoist_constants(branches: list[Any], initializers: set[str]) -> list[Any]:
    """Move the nodes that compute from initializers alone (a tied projection's Transpose, the unpacking of
    low-bit codes: `modelshrink.onnx.lowbit`) out of the branches into the outer graph, each once: onnxruntime
    folds them into one constant when it loads the graph, where two branches would fold, and hold, a copy each.
    Returns the outer graph's nodes, in order."""
    known, outer = set(initializers), []
    done: dict[tuple, list[str]] = {}
    for graph in branches:
        alias: dict[str, str] = {}
        kept = []
        for node in graph.node:
            _alias_within(node, alias)
            inputs = list(node.input)
            if not inputs or not all(name in known for name in inputs) or subgraphs(node):
                kept.append(node)
                continue
            key = (node.domain, node.op_type, tuple(inputs), tuple(a.SerializeToString() for a in node.attribute))
            if key in done:
                alias.update(zip(node.output, done[key]))
                continue
            done[key] = list(node.output)
            known.update(node.output)
            outer.append(node)
        for output in graph.output:
            if output.name in alias:  # a branch output computed from weights alone: keep it in the branch
                raise ValueError(f"branch output {output.name} is a constant")
        del graph.node[:]
        graph.node.extend(kept)
    return outer


def store_tied_once(path: Path) -> dict[str, int]:
    """A float matrix that is the transpose of another initializer (a tied output projection: the exporter
    constant-folds lm_head's weight.T next to the embedding table it is tied to) becomes a Transpose node
    of that initializer, which onnxruntime folds back into a constant when it loads the graph: the file
    holds the table once. Float graphs only: `--int8` needs the matmul weight as an initializer."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    by_value, transposed = {}, {}  # digests only: one matrix in memory at a time beside the graph
    for init in graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT and len(init.dims) == 2 and init.dims[0] * init.dims[1] >= 256:
            value = numpy_helper.to_array(init)
            by_value[(value.shape, _digest(value))] = init.name
            transposed[init.name] = (value.shape[::-1], _digest(value.T))
    found = {}
    for name, key in transposed.items():
        source = by_value.get(key)
        if source is not None and source != name and source not in found:
            found[name] = source
    if not found:
        return {"tied": 0, "bytes_saved": 0}
    saved = 0
    kept = []
    for init in graph.initializer:
        if init.name in found:
            saved += int(np.prod(init.dims)) * 4
        else:
            kept.append(init)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    for name, source in found.items():
        graph.node.insert(0, helper.make_node("Transpose", [source], [name], name=f"{name}/tied", perm=[1, 0]))
    save_graph(model, path)
    return {"tied": len(found), "bytes_saved": saved}
