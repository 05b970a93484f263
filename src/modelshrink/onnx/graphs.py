"""The ONNX graphs of a model, traced from PyTorch under Optimum's names.

A seq2seq model becomes
- encoder_model.onnx: input_ids, attention_mask -> last_hidden_state
- decoder_model.onnx (the first step): input_ids, encoder_attention_mask, encoder_hidden_states ->
  logits, present.{i}.decoder.key/value, present.{i}.encoder.key/value
- decoder_with_past_model.onnx (every later step): input_ids, encoder_attention_mask,
  past_key_values.{i}.decoder.key/value, past_key_values.{i}.encoder.key/value -> logits,
  present.{i}.decoder.key/value (the cross-attention keys and values never change after step one)
- search_ops.onnx: log-softmax and top-k over the vocabulary, for the runtime's beam search.
(`modelshrink.onnx.merge` then makes the two decoders one file.) A classifier becomes model.onnx
(input_ids, attention_mask[, token_type_ids] -> logits). Batch and sequence axes are dynamic. The decoders
are traced through a small wrapper that takes and returns flat tensors and builds transformers' cache
object inside, because the exporter cannot trace through a cache object passed in from outside.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from modelshrink.families import decoder_layer_count, hidden_size
from modelshrink.onnx.positions import computed_positions
from modelshrink.onnx.saving import attach_weights, consolidate
from modelshrink.runtime.files import CLASSIFIER, DECODER, DECODER_WITH_PAST, ENCODER, SEARCH_OPS


def use_eager_attention(model: torch.nn.Module) -> None:
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


def cache_keyword(model: torch.nn.Module) -> str:
    """The name of the cache in `model`'s forward and in its outputs: transformers 5.24 renamed `past_key_values`
    to `cache` (the old name still works there but warns that 5.40 removes it); 5.0-5.23 know only
    `past_key_values`."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


class DecoderGraph(torch.nn.Module):
    """One decoder step of the whole model (so BART's final_logits_bias, T5's output scaling and
    bert2bert's encoder projection stay where the model applies them)."""

    def __init__(self, model: torch.nn.Module, layers: int, with_past: bool):
        super().__init__()
        self.model, self.layers, self.with_past = model, layers, with_past
        self.width = hidden_size(model.config)
        self.cache_name = cache_keyword(model)

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
                         decoder_input_ids=input_ids, use_cache=True, return_dict=True, **{self.cache_name: cache})
        returned = getattr(out, self.cache_name)
        flat = []
        for i in range(self.layers):
            own, cross = returned.self_attention_cache.layers[i], returned.cross_attention_cache.layers[i]
            flat += [own.keys, own.values] + ([] if self.with_past else [cross.keys, cross.values])
        return (out.logits, *flat)


def present_names(layers: int, with_past: bool) -> list[str]:
    names = []
    for i in range(layers):
        names += [f"present.{i}.decoder.key", f"present.{i}.decoder.value"]
        if not with_past:
            names += [f"present.{i}.encoder.key", f"present.{i}.encoder.value"]
    return names


def _trace(module: torch.nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str],
            axes: dict[str, dict[int, str]], opset: int) -> None:
    import warnings

    module.eval()  # the exporter restores the wrapper's mode afterwards, and a new Module is in training mode
    with warnings.catch_warnings(), torch.no_grad():
        # What tracing these models always says (the export is checked against PyTorch afterwards, which is what
        # catches a trace that took a wrong branch); any other warning reaches the user.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        for message in ("You are using the legacy TorchScript-based ONNX export", "The feature will be removed",
                        "Exporting aten::index operator of advanced indexing"):
            warnings.filterwarnings("ignore", message=message)
        before = set(path.parent.iterdir())
        with _no_function_pass(), _weights_kept() as weights:
            torch.onnx.export(module, args, str(path), dynamo=False, opset_version=opset, input_names=inputs,
                              output_names=outputs, dynamic_axes=axes, do_constant_folding=True,
                              export_params=not weights.kept)
        if weights.kept:  # the graph was written without its weights: they go to its data file one at a time
            attach_weights(path, weights.tensors)
            weights.tensors.clear()
            _check_inputs(path, inputs)
            return
    # past 2 GB the exporter writes each weight to a file of its own beside the graph: one data file instead
    consolidate(path, sorted(set(path.parent.iterdir()) - before - {path}))


def _check_inputs(path: Path, inputs: list[str]) -> None:
    import onnx

    left = [i.name for i in onnx.load(str(path), load_external_data=False).graph.input if i.name not in inputs]
    if left:  # a weight the exporter named otherwise than its graph-building step did: a torch this code never saw
        raise RuntimeError(f"the traced graph {path.name} has inputs that are neither {inputs} nor weights: {left}")


class _Weights:
    def __init__(self) -> None:
        self.kept, self.tensors = False, {}


@contextlib.contextmanager
def _weights_kept() -> Iterator[_Weights]:
    """The weights of the graph the TorchScript exporter is about to write (its own, constant folding's results
    among them), kept from its graph-building step, so that the export writes the graph without them and
    `saving.attach_weights` writes them to the data file one at a time: the exporter itself builds a protobuf
    holding every weight and then its serialized bytes, which with the model beside them was the export's peak
    (issue 78). Where torch no longer has that step under this name, `kept` is False and the export writes its
    weights itself."""
    weights = _Weights()
    try:
        from torch.onnx._internal.torchscript_exporter import utils
    except ImportError:
        yield weights
        return
    original = getattr(utils, "_model_to_graph", None)
    if original is None:
        yield weights
        return

    def keeping(*args: object, **kwargs: object) -> object:
        graph, params, out = original(*args, **kwargs)
        weights.tensors.update(params)
        return graph, params, out

    utils._model_to_graph, weights.kept = keeping, True
    try:
        yield weights
    finally:
        utils._model_to_graph = original


@contextlib.contextmanager
def _no_function_pass() -> Iterator[None]:
    """The TorchScript exporter parses the graph it serialized once more to insert onnxscript functions, which a
    graph without custom opsets never has, so it writes the bytes it had: that parse held one more copy of every
    weight at the trace's peak (distilbart-cnn's shape: 3.42 GB without it, 3.00 with; issue 78). Where torch no
    longer has the pass under this name, the export runs as it is."""
    try:
        from torch.onnx._internal.torchscript_exporter import onnx_proto_utils
    except ImportError:
        yield
        return
    original = getattr(onnx_proto_utils, "_add_onnxscript_fn", None)
    if original is None:
        yield
        return
    onnx_proto_utils._add_onnxscript_fn = lambda model_bytes, custom_opsets: (
        model_bytes if not custom_opsets else original(model_bytes, custom_opsets))
    try:
        yield
    finally:
        onnx_proto_utils._add_onnxscript_fn = original


def sample_decoder_ids(batch: int, length: int, vocab: int, start: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, length), generator=g)
    ids[:, 0] = start
    return ids


def export_seq2seq(model: torch.nn.Module, folder: Path, enc: dict[str, torch.Tensor], opset: int) -> list[str]:
    with computed_positions(model):  # sinusoidal tables as a few ops, not a stored table in each graph
        _trace_seq2seq(model, folder, enc, opset)
    write_search_ops(folder, opset)
    return [ENCODER, DECODER, DECODER_WITH_PAST]


def _trace_seq2seq(model: torch.nn.Module, folder: Path, enc: dict[str, torch.Tensor], opset: int) -> None:
    layers = decoder_layer_count(model.config)
    vocab = model.get_output_embeddings().weight.shape[0]
    start = model.generation_config.decoder_start_token_id or 0
    encoder = EncoderGraph(model)
    _trace(encoder, (enc["input_ids"], enc["attention_mask"]), folder / ENCODER,
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
    _trace(first, (dec_ids, enc["attention_mask"], hidden), folder / DECODER,
            ["input_ids", "encoder_attention_mask", "encoder_hidden_states"], ["logits", *names], axes, opset)
    with torch.no_grad():
        past = first.eval()(dec_ids, enc["attention_mask"], hidden)[1:]
    past_names = [n.replace("present", "past_key_values") for n in names]
    new_names = present_names(layers, True)
    axes = {"input_ids": {0: "batch"}, "encoder_attention_mask": {0: "batch", 1: "source"}, "logits": {0: "batch"}}
    axes.update({n: {0: "batch", 2: "past" if ".decoder." in n else "source"} for n in past_names})
    axes.update({n: {0: "batch", 2: "past_and_one"} for n in new_names})
    _trace(DecoderGraph(model, layers, with_past=True), (dec_ids[:, -1:], enc["attention_mask"], *past),
            folder / DECODER_WITH_PAST, ["input_ids", "encoder_attention_mask", *past_names], ["logits", *new_names],
            axes, opset)


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
    _trace(ClassifierGraph(model, names), tuple(enc[n] for n in names), folder / CLASSIFIER, names, ["logits"],
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


def parameter_count(folder: Path, graphs: list[str]) -> int:
    """Values held by the graphs' initializers (a separate decoder with past repeats the decoder's: skipped).
    The export records it in modelshrink.json, where the runtime, which has no onnx package, reads it."""
    import onnx

    total = 0
    for name in graphs:
        if name != DECODER_WITH_PAST:
            for init in onnx.load(str(folder / name), load_external_data=False).graph.initializer:
                total += int(np.prod(init.dims)) if len(init.dims) else 1
    return total
