"""`export`: a model artifact as ONNX graphs that a service runs with onnxruntime alone.

A seq2seq model becomes graphs under Optimum's names, so existing tooling (Optimum's
`ORTModelForSeq2SeqLM`, our `modelshrink.runtime`) recognizes them:

- encoder_model.onnx: input_ids, attention_mask -> last_hidden_state
- decoder_model_merged.onnx (the default): one If on `use_cache_branch` between the two decoders below,
  which share every weight (`merge_decoders`); with `merge=False` they are written as two files:
- decoder_model.onnx (the first step): input_ids, encoder_attention_mask, encoder_hidden_states ->
  logits, present.{i}.decoder.key/value, present.{i}.encoder.key/value
- decoder_with_past_model.onnx (every later step): input_ids, encoder_attention_mask,
  past_key_values.{i}.decoder.key/value, past_key_values.{i}.encoder.key/value -> logits,
  present.{i}.decoder.key/value (the cross-attention keys and values never change after step one)
- search_ops.onnx: log-softmax and top-k over the vocabulary, for the runtime's beam search.

A classifier becomes model.onnx (input_ids, attention_mask[, token_type_ids] -> logits). Batch and
sequence axes are dynamic. The decoders are exported through a small wrapper that takes and returns
flat tensors and builds transformers' cache object inside, because the exporter cannot trace
through a cache object passed in from outside.

Size: a float output projection tied to the embedding table is stored once (`store_tied_once`); a
`quantize` artifact's weights are α·b with integer b; `compact_quantized` finds those
initializers and stores them as int8 with a DequantizeLinear node (one scale per tensor or per row),
so a 2-2-8 or 8-8-8 model stays about 4× smaller than float32 in the export. `--int8` instead runs
onnxruntime's dynamic quantization (8-bit weights with one scale per output column, integer matmuls with
activations quantized on the fly; embedding tables in int8 with a scale per row); see `quantize_int8` for the choices and what
they measured.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from modelshrink.artifacts import ArtifactWriter, parent_ref, read_manifest
from modelshrink.errors import UserError
from modelshrink.options.export import ExportOptions
from modelshrink.runtime import (CLASSIFIER, DECODER, DECODER_MERGED, DECODER_WITH_PAST, DEQUANTIZED, ENCODER,
                                 SEARCH_OPS)

LogFn = Callable[[str], None]

CLASSIFIER_TYPES = ("bert", "roberta", "distilbert", "electra", "xlm-roberta")
FLOAT_ATOL = 1e-4
# Dynamic int8 rounds every activation with one scale per tensor, and BERT-like layers have a few channels
# 5-30x larger than the rest, so each matmul moves by 2-4% and the errors add up over the layers: on the
# MiniLM bert2bert teacher (6+6 layers, per-channel weights) the RMS difference is 10% of the logits' RMS
# and 18% of the encoder states' (its largest single differences: 12% and 9% of the largest magnitudes; 24%
# for one cross-attention key, a tail value that grows with the number of values compared). The check
# bounds each output's RMS difference by a quarter of its RMS: int8 noise passes, and a broken graph,
# whose differences are of the order of the output itself (RMS ratio near or above 1), does not.
INT8_RTOL = 0.25
# A `quantize` artifact fake-quantizes activations at 8 bits: where float32 sums in another order land on the
# other side of a rounding boundary, one value moves by a whole step (1/127 of its tensor's range) and
# carries on downstream; differences of a few percent are that, not a broken graph.
QUANTIZED_RTOL = 0.05


# ---------------------------------------------------------------- what a model is

def inspect(spec: str, trust_remote_code: bool = False) -> tuple[str, Any]:
    """('seq2seq' | 'classifier', config); one-line errors for anything without an export path."""
    from modelshrink.families import family_of
    from modelshrink.models import load_config

    path = Path(spec)
    if path.is_dir() and not (path / "config.json").is_file():
        manifest = read_manifest(path)
        what = f"a {manifest['kind']} artifact (step {manifest['step']})" if manifest else "a folder without config.json"
        raise UserError(f"{spec} is not a model: it is {what}; expected a model artifact or save_pretrained folder")
    config = load_config(spec, "model", trust_remote_code)
    if getattr(config, "is_encoder_decoder", False):
        family_of(config)  # a UserError naming the supported families
        return "seq2seq", config
    if config.model_type in CLASSIFIER_TYPES and any(a.endswith("ForSequenceClassification")
                                                     for a in (config.architectures or [])):
        return "classifier", config
    raise UserError(f"no export path for model type '{config.model_type}' "
                    f"({', '.join(config.architectures or []) or 'no architecture'}); supported: seq2seq families "
                    f"and sequence classifiers of type {', '.join(CLASSIFIER_TYPES)}")


def _decoder_layers(config: Any) -> int:
    for holder in (config, getattr(config, "decoder", None)):
        for name in ("decoder_layers", "num_decoder_layers", "num_hidden_layers"):
            value = getattr(holder, name, None) if holder is not None else None
            if value:
                return int(value)
    raise UserError(f"cannot tell the decoder depth of a {config.model_type} model")


def _eager(model: torch.nn.Module) -> None:
    # Eager attention traces into plain MatMul/Softmax; quantized artifacts keep their own attention function.
    if getattr(model.config, "_attn_implementation", None) in ("sdpa", "flash_attention_2", "flex_attention"):
        model.set_attn_implementation("eager")


# ---------------------------------------------------------------- wrappers with flat tensors

class EncoderGraph(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).last_hidden_state


class DecoderGraph(torch.nn.Module):
    """One decoder step of the whole model (so BART's final_logits_bias, T5's output scaling and
    bert2bert's encoder projection stay where the model applies them)."""

    def __init__(self, model: torch.nn.Module, layers: int, with_past: bool):
        super().__init__()
        self.model, self.layers, self.with_past = model, layers, with_past
        encoder_config = model.get_encoder().config
        self.width = getattr(encoder_config, "d_model", None) or encoder_config.hidden_size

    def forward(self, input_ids: torch.Tensor, encoder_attention_mask: torch.Tensor, *rest: torch.Tensor):
        from transformers.cache_utils import EncoderDecoderCache

        if self.with_past:
            past = rest
            cache = EncoderDecoderCache(tuple(tuple(past[4 * i:4 * i + 4]) for i in range(self.layers)))
            # cross-attention reads the cached keys and values; the hidden states only fix the shape
            batch, source = encoder_attention_mask.shape
            hidden = past[2].new_zeros(batch, source, self.width)
            encoder_outputs = (hidden,)
        else:
            cache, encoder_outputs = None, (rest[0],)
        out = self.model(encoder_outputs=encoder_outputs, attention_mask=encoder_attention_mask,
                         decoder_input_ids=input_ids, past_key_values=cache, use_cache=True, return_dict=True)
        flat = []
        for i in range(self.layers):
            own, cross = out.past_key_values.self_attention_cache.layers[i], \
                out.past_key_values.cross_attention_cache.layers[i]
            flat += [own.keys, own.values] + ([] if self.with_past else [cross.keys, cross.values])
        return (out.logits, *flat)


def present_names(layers: int, with_past: bool) -> list[str]:
    names = []
    for i in range(layers):
        names += [f"present.{i}.decoder.key", f"present.{i}.decoder.value"]
        if not with_past:
            names += [f"present.{i}.encoder.key", f"present.{i}.encoder.value"]
    return names


def _export(module: torch.nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str],
            axes: dict[str, dict[int, str]], opset: int) -> None:
    import warnings

    module.eval()  # the exporter restores the wrapper's mode afterwards, and a new Module is in training mode
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), dynamo=False, opset_version=opset, input_names=inputs,
                          output_names=outputs, dynamic_axes=axes, do_constant_folding=True)


def sample_decoder_ids(batch: int, length: int, vocab: int, start: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, length), generator=g)
    ids[:, 0] = start
    return ids


def export_seq2seq(model: torch.nn.Module, folder: Path, enc: dict[str, torch.Tensor], opset: int) -> list[str]:
    layers = _decoder_layers(model.config)
    vocab = model.get_output_embeddings().weight.shape[0]
    start = model.generation_config.decoder_start_token_id or 0
    encoder = EncoderGraph(model)
    _export(encoder, (enc["input_ids"], enc["attention_mask"]), folder / ENCODER,
            ["input_ids", "attention_mask"], ["last_hidden_state"],
            {"input_ids": {0: "batch", 1: "source"}, "attention_mask": {0: "batch", 1: "source"},
             "last_hidden_state": {0: "batch", 1: "source"}}, opset)
    with torch.no_grad():
        hidden = encoder.eval()(enc["input_ids"], enc["attention_mask"])
    batch = hidden.shape[0]
    dec_ids = sample_decoder_ids(batch, 3, vocab, start)
    first = DecoderGraph(model, layers, with_past=False)
    names = present_names(layers, False)
    axes = {"input_ids": {0: "batch", 1: "target"}, "encoder_attention_mask": {0: "batch", 1: "source"},
            "encoder_hidden_states": {0: "batch", 1: "source"}, "logits": {0: "batch", 1: "target"}}
    axes.update({n: {0: "batch", 2: "target" if ".decoder." in n else "source"} for n in names})
    _export(first, (dec_ids, enc["attention_mask"], hidden), folder / DECODER,
            ["input_ids", "encoder_attention_mask", "encoder_hidden_states"], ["logits", *names], axes, opset)
    with torch.no_grad():
        past = first.eval()(dec_ids, enc["attention_mask"], hidden)[1:]
    past_names = [n.replace("present", "past_key_values") for n in names]
    new_names = present_names(layers, True)
    axes = {"input_ids": {0: "batch"}, "encoder_attention_mask": {0: "batch", 1: "source"}, "logits": {0: "batch"}}
    axes.update({n: {0: "batch", 2: "past" if ".decoder." in n else "source"} for n in past_names})
    axes.update({n: {0: "batch", 2: "past_and_one"} for n in new_names})
    _export(DecoderGraph(model, layers, with_past=True), (dec_ids[:, -1:], enc["attention_mask"], *past),
            folder / DECODER_WITH_PAST, ["input_ids", "encoder_attention_mask", *past_names], ["logits", *new_names],
            axes, opset)
    write_search_ops(folder, opset)
    return [ENCODER, DECODER, DECODER_WITH_PAST]


class ClassifierGraph(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, names: list[str]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, inputs)), return_dict=True).logits


def export_classifier(model: torch.nn.Module, folder: Path, enc: dict[str, torch.Tensor], opset: int) -> list[str]:
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in enc]
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    axes["logits"] = {0: "batch"}
    _export(ClassifierGraph(model, names), tuple(enc[n] for n in names), folder / CLASSIFIER, names, ["logits"],
            axes, opset)
    return [CLASSIFIER]


def write_search_ops(folder: Path, opset: int) -> None:
    """search_ops.onnx: LogSoftmax and TopK over the vocabulary (logits [rows, vocab], k [1] -> values, indices
    [rows, k], best first, ties to the lower index). The runtime's beam search uses it instead of numpy, whose
    single-threaded exp and partition over [beams x vocab] took a third of a batch-16 step on 2 cores."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("LogSoftmax", ["logits"], ["log_probs"], axis=-1),
             helper.make_node("TopK", ["log_probs", "k"], ["values", "indices"], axis=-1, largest=1, sorted=1)]
    graph = helper.make_graph(
        nodes, "search_ops",
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["rows", "vocab"]),
         helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, ["rows", "k"]),
         helper.make_tensor_value_info("indices", TensorProto.INT64, ["rows", "k"])])
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="modelshrink",
                              ir_version=helper.find_min_ir_version_for(opsets))
    onnx.checker.check_model(model)
    onnx.save(model, str(folder / SEARCH_OPS))


# ---------------------------------------------------------------- one merged decoder

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
    (dynamic quantization of a weight is deterministic, so both graphs hold the same int8 copy)."""
    import onnx
    from onnx import helper, numpy_helper

    models = {"first": onnx.load(str(folder / DECODER)), "past": onnx.load(str(folder / DECODER_WITH_PAST))}
    shared: dict[str, Any] = {}
    by_value: dict[tuple, str] = {}
    total = 0
    renamed: dict[str, dict[str, str]] = {}
    for tag, model in models.items():
        mapping = renamed[tag] = {}
        for init in model.graph.initializer:
            total += 1
            key = (init.data_type, tuple(init.dims), _digest(numpy_helper.to_array(init)))
            name = by_value.get(key)
            if name is None:
                name = init.name if init.name not in shared else f"{tag}/{init.name}"
                copy = onnx.TensorProto()
                copy.CopyFrom(init)
                copy.name = name
                shared[name], by_value[key] = copy, name
            mapping[init.name] = name
    outer = {i.name: i for tag in ("past", "first") for i in models[tag].graph.input}  # first's input_ids: any length

    def branch(tag: str, extra_outputs: list[str]) -> Any:
        graph, mapping = models[tag].graph, renamed[tag]

        def rename(name: str) -> str:
            return name if not name or name in outer else mapping.get(name, f"{tag}/{name}")

        nodes = []
        for node in graph.node:
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
                raise UserError(f"cannot merge decoders: {node.op_type} node with a subgraph in {tag}")
            new = onnx.NodeProto()
            new.CopyFrom(node)
            new.name = f"{tag}/{node.name}"
            del new.input[:], new.output[:]
            new.input.extend(rename(n) for n in node.input)
            new.output.extend(rename(n) for n in node.output)
            nodes.append(new)
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

    first_outputs = [o.name for o in models["first"].graph.output]
    past_outputs = {o.name for o in models["past"].graph.output}
    then_branch = branch("past", [n for n in first_outputs if n not in past_outputs])
    else_branch = branch("first", [])
    inputs = [outer[name] for name in dict.fromkeys(
        [i.name for i in models["first"].graph.input] + [i.name for i in models["past"].graph.input])]
    flag = helper.make_tensor_value_info("use_cache_branch", onnx.TensorProto.BOOL, [1])
    outputs = []
    for o in models["first"].graph.output:
        info = onnx.ValueInfoProto()
        info.name = o.name
        info.type.tensor_type.elem_type = o.type.tensor_type.elem_type
        outputs.append(info)
    node = helper.make_node("If", ["use_cache_branch"], first_outputs, name="use_cache_branch_if",
                            then_branch=then_branch, else_branch=else_branch)
    graph = helper.make_graph([node], "decoder_merged", [*inputs, flag], outputs, initializer=list(shared.values()))
    first = models["first"]
    merged = helper.make_model(graph, opset_imports=list(first.opset_import), producer_name="modelshrink",
                               ir_version=first.ir_version)
    onnx.save(merged, str(folder / DECODER_MERGED))
    (folder / DECODER).unlink()
    (folder / DECODER_WITH_PAST).unlink()
    return {"initializers": total, "shared": total - len(shared)}


# ---------------------------------------------------------------- size

def store_tied_once(path: Path) -> dict[str, int]:
    """A float matrix that is the transpose of another initializer (a tied output projection: the exporter
    constant-folds lm_head's weight.T next to the embedding table it is tied to) becomes a Transpose node
    of that initializer, which onnxruntime folds back into a constant when it loads the graph: the file
    holds the table once. Float graphs only: `--int8` needs the matmul weight as an initializer."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    matrices = {i.name: numpy_helper.to_array(i) for i in graph.initializer
                if i.data_type == onnx.TensorProto.FLOAT and len(i.dims) == 2 and i.dims[0] * i.dims[1] >= 256}
    by_value = {(value.shape, _digest(value)): name for name, value in matrices.items()}
    found = {}
    for name, value in matrices.items():
        source = by_value.get((value.shape[::-1], _digest(value.T)))
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
    onnx.save(model, str(path))
    return {"tied": len(found), "bytes_saved": saved}


def compact_quantized(path: Path, thresholds: set[int]) -> dict[str, int]:
    """Store float initializers whose values are α·b (b integer, |b| <= a threshold) as int8 + DequantizeLinear.

    The values are recognised rather than looked up by name: the exporter renames and transposes
    linear weights, but it keeps their values exactly."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    consumers = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    replaced, saved = 0, 0
    kept = []
    new_nodes = []
    for init in graph.initializer:
        w = numpy_helper.to_array(init) if init.data_type == onnx.TensorProto.FLOAT else None
        found = _integer_form(w, thresholds) if w is not None and w.ndim == 2 and w.size >= 256 else None
        if found is None:
            kept.append(init)
            continue
        b, scale, axis = found
        q_name, s_name, z_name = init.name + "_int8", init.name + "_scale", init.name + "_zero"
        kept += [numpy_helper.from_array(b, q_name), numpy_helper.from_array(scale, s_name),
                 numpy_helper.from_array(np.zeros(scale.shape, dtype=np.int8), z_name)]
        attrs = {"axis": axis} if scale.ndim == 1 else {}
        new_nodes.append(helper.make_node("DequantizeLinear", [q_name, s_name, z_name], [init.name],
                                          name=init.name + "_dequantize", **attrs))
        replaced += 1
        saved += w.nbytes - b.nbytes - scale.nbytes * 2
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
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
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


def quantize_int8(path: Path, per_channel: bool) -> None:
    """onnxruntime dynamic quantization: 8-bit weights (one scale and zero point per output column with
    `per_channel`), activations quantized per call, matmuls in integers. Only MatMuls with a constant
    weight: attention's activation-by-activation products stay float. Embedding tables become int8 with
    one scale per row (`quantize_embeddings`): on a trained 6-2 MiniLM student (200 Debian documents) that
    kept ROUGE-1 at 22.6 (float32: 22.5) with 137 summaries equal to float32's, where onnxruntime's own
    Gather quantization (one scale per table) gave 21.7 and 116, and float tables 22.3 and 127 at 2.4x
    the size.

    Weights are unsigned: with signed weights onnxruntime multiplies u8 activations by s8 weights with
    AVX2's vpmaddubsw, which adds two products into a saturating int16 (2 x 255 x 127 > 32767); without
    VNNI (this project's 2-core machine) per-channel scales push every column to +-127, so sums clip, and
    the tiny test models' logits moved by 31% (RMS) against 1-4% with u8 weights, whose u8 x u8 kernel
    widens to int16 before multiplying and is exact. On the MiniLM teacher u8 per channel is also the
    most accurate (logits 10% RMS; s8 per channel 11%, s8 per channel 7-bit 11%, s8 per tensor 26%)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = path.with_suffix(".int8.onnx")
    quantize_dynamic(str(path), str(tmp), per_channel=per_channel, weight_type=QuantType.QUInt8,
                     op_types_to_quantize=["MatMul", "Gemm"], extra_options={"MatMulConstBOnly": True})
    tmp.replace(path)
    quantize_embeddings(path)


# ---------------------------------------------------------------- the step

def _sample_texts(options: ExportOptions, tokenizer: Any, count: int) -> list[str]:
    """Documents to validate with: from --data, else made of the tokenizer's own words."""
    if options.data is not None:
        from modelshrink.data import open_data, pick_columns

        source = open_data(options.data)
        text_column, _ = pick_columns(source.columns, options.text_column, source=options.data)
        texts = []
        for row in source.rows():
            texts.append(str(row[text_column]))
            if len(texts) == count:
                break
        if not texts:
            raise UserError(f"data {options.data} has no rows")
        return texts
    special = set(tokenizer.all_special_tokens)
    words = [w for w, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]) if w not in special
             and w.isalpha()][:2000] or ["hello", "world"]
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(words, size=4 + 5 * i)) for i in range(count)]


def export_model(options: ExportOptions, output: str | Path, *, overwrite: bool = False,
                 log: LogFn = lambda m: None) -> tuple[Path, dict[str, Any]]:
    """Write the export folder; returns (path, report). A failed check raises `ExportCheckFailed`
    after the folder and its report are written."""
    from modelshrink.export_check import ExportCheckFailed, validate
    from modelshrink.models import default_source_length, load_classifier, load_seq2seq, load_tokenizer

    writer = ArtifactWriter(output, overwrite=overwrite)
    writer.check()
    kind, config = inspect(options.model, options.trust_remote_code)
    local = Path(options.model)
    if local.is_dir() and not any((local / n).is_file() for n in ("tokenizer.json", "tokenizer_config.json")):
        raise UserError(f"{options.model} has no tokenizer (tokenizer.json); an export folder must be complete, so "
                        "save the tokenizer beside the model first")
    load_tokenizer(options.model, "model", options.trust_remote_code)  # a missing tokenizer fails here, not later
    if kind == "seq2seq":
        model, tokenizer, _ = load_seq2seq(options.model, "model", options.trust_remote_code)
    else:
        model, tokenizer = load_classifier(options.model, "model", options.trust_remote_code)
    _eager(model)
    qc = getattr(config, "quantization_config", None)
    quantized = dict(qc) if isinstance(qc, dict) and qc.get("quant_method") == "modelshrink" else None
    max_source_length = options.max_source_length or default_source_length(tokenizer, model.config)
    texts = _sample_texts(options, tokenizer, max(options.samples, 2))
    enc = dict(tokenizer(texts[:2], truncation=True, max_length=max_source_length, padding=True, return_tensors="pt"))
    if kind == "classifier" and "token_type_ids" not in enc and config.model_type == "bert":
        enc["token_type_ids"] = torch.zeros_like(enc["input_ids"])
    with writer:
        folder = writer.staging
        log(f"exporting {kind} {options.model} to ONNX (opset {options.opset})")
        graphs = (export_seq2seq if kind == "seq2seq" else export_classifier)(model, folder, enc, options.opset)
        storage: dict[str, Any] = {}
        if quantized is not None and not options.int8:
            # with --int8 the dynamic quantization stores every matmul weight and table in 8 bits itself (and
            # multiplies in integers); DequantizeLinear weights in front of its integer matmuls would not load
            thresholds = {1 if b == 2 else 2 ** (b - 1) - 1 for b in (quantized["weight_bits"],
                                                                      quantized["embedding_bits"])}
            for name in graphs:
                storage[name] = compact_quantized(folder / name, thresholds)
        if options.int8:
            for name in graphs:
                log(f"int8: dynamic quantization of {name}")
                quantize_int8(folder / name, options.per_channel)
        if kind == "seq2seq" and options.merge:
            storage["merged"] = merge_decoders(folder)
            graphs = [ENCODER, DECODER_MERGED]
            log(f"merged the two decoders into {DECODER_MERGED} ({storage['merged']['shared']} of the "
                f"{storage['merged']['initializers']} initializers were the same weight in both)")
        if not options.int8:
            for name in graphs:
                tied = store_tied_once(folder / name)
                if tied["tied"]:
                    storage.setdefault(name, {}).update(tied)
        _write_companions(model, tokenizer, folder, kind)
        resolved = {"kind": kind, "graphs": graphs, "max_source_length": max_source_length,
                    "quantized_artifact": quantized["bits"] if quantized else None,
                    "weights": "int8 (onnxruntime dynamic)" if options.int8 else (
                        DEQUANTIZED if quantized else "float32")}
        (folder / "modelshrink.json").write_text(json.dumps({"resolved": resolved}))  # the runtime reads it
        rtol = INT8_RTOL if options.int8 else (QUANTIZED_RTOL if quantized else None)
        atol = options.atol if options.atol is not None else (None if rtol else FLOAT_ATOL)
        report: dict[str, Any] = {"kind": kind, "graphs": graphs, "opset": options.opset, "int8": options.int8,
                                  "per_channel": options.per_channel, "storage": storage,
                                  "bytes": {n: (folder / n).stat().st_size for n in graphs}}
        failure = None
        if options.validate:
            log(f"validating against PyTorch on {len(texts)} documents")
            check = validate(model, tokenizer, folder, kind, texts, max_source_length, atol=atol, rtol=rtol,
                             rms=options.int8,
                             generation_docs=options.generation_docs, log=log)
            report["validation"] = check
            failure = check.get("failure")
        (folder / "export_report.json").write_text(json.dumps(report, indent=2) + "\n")
        _model_card(folder, options, report)
        metrics = {"validated": options.validate, "passed": failure is None if options.validate else None}
        if options.validate:
            metrics["max_abs_diff"] = report["validation"]["max_abs_diff"]
            for key in ("generation", "predictions"):
                if key in report["validation"]:
                    metrics[f"{key}_agreement"] = report["validation"][key]["agreement"]
        path = writer.commit(step="export", kind="model", options=asdict(options),
                             parents=[parent_ref("model", options.model)], metrics=metrics, resolved=resolved)
    if failure:
        raise ExportCheckFailed(failure, str(path))
    return path, report


def _write_companions(model: Any, tokenizer: Any, folder: Path, kind: str) -> None:
    """config.json (without modelshrink's quantization entry: the graphs hold the weights), generation
    config and tokenizer files, so that the folder is complete on its own."""
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if kind == "seq2seq" and getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if not (folder / "tokenizer.json").is_file():
        raise UserError("the model's tokenizer has no fast (tokenizer.json) form, which the torch-free runtime needs")


def _model_card(folder: Path, options: ExportOptions, report: dict[str, Any]) -> None:
    check = report.get("validation", {})
    lines = ["---", "library_name: onnxruntime", "tags: [onnx, modelshrink]", "---", "",
             f"# ONNX export of `{Path(options.model).name}`", "",
             f"Exported by `modelshrink export` from `{options.model}` (opset {options.opset}"
             f"{', int8 dynamic quantization' if options.int8 else ''}).", "",
             "Graphs: " + ", ".join(f"`{g}` ({report['bytes'][g] / 1e6:.1f} MB)" for g in report["graphs"]) + ".", "",
             "Run it without torch:", "", "```python", "from modelshrink.runtime import load",
             f"model = load(\"{folder.name if folder.name[0] != '.' else 'THIS_FOLDER'}\")",
             "print(model.summarize([\"a document\"]))" if report["kind"] == "seq2seq" else
             "print(model.classify([\"a sentence\"]))", "```", ""]
    if check:
        lines += ["## Validation against PyTorch", "",
                  f"Largest absolute difference over all outputs: {check['max_abs_diff']:.3g} "
                  f"(tolerance: {check['tolerance']}).", ""]
        if "generation" in check:
            g = check["generation"]
            lines += [f"Generated tokens equal to PyTorch's: {g['agreement']}.", ""]
    (folder / "README.md").write_text("\n".join(lines))
