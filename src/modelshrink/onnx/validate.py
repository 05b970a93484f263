"""Validation of an export folder against the PyTorch model it came from.

Two checks, both on documents the export did not trace with (other batch size, lengths, past length):
1. outputs: PyTorch and onnxruntime on the same inputs, graph by graph; the largest absolute
   difference of every output against the tolerance (--atol, 1e-4 for float32 graphs; for a `quantize`
   artifact 5% of each output's largest magnitude; for --int8, the RMS of the differences against a
   quarter of the output's RMS, for --int4 0.6 of it; unless --atol is given: see INT8_RTOL, INT4_RTOL and
   QUANTIZED_RTOL below).
   Padded source positions (encoder states, cross-attention keys and values) are not compared;
2. generation: the torch-free runtime's tokens against `model.generate`'s, greedy and beam search with
   the model's generation settings, each document's tokens compared (the documents go as one padded
   batch to both); for classifiers, the predicted labels.
   A float32 export must agree everywhere; differences of int8 and int4 graphs and of quantized artifacts
   (whose activations round at 8 bits) are listed, not failed.

PyTorch's side (`reference`) is computed first, from the model the export traced; the export then frees the
model before it rewrites the graphs and opens them in onnxruntime (`validate`), so its peak memory holds one of
the two, not both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from modelshrink.errors import CheckFailed
from modelshrink.families import decoder_layer_count
from modelshrink.onnx.graphs import ClassifierGraph, DecoderGraph, EncoderGraph, present_names, sample_decoder_ids
from modelshrink.runtime.files import CLASSIFIER, DECODER, DECODER_MERGED, DECODER_WITH_PAST, ENCODER
from modelshrink.runtime.model import load

DIFFERENCES_LISTED = 10
FLOAT_ATOL = 1e-4
# Dynamic int8 rounds every activation with one scale per tensor, and BERT-like layers have a few channels
# 5-30x larger than the rest, so each matmul moves by 2-4% and the errors add up over the layers: on the
# MiniLM bert2bert teacher (6+6 layers, per-channel weights) the RMS difference is 10% of the logits' RMS
# and 18% of the encoder states' (its largest single differences: 12% and 9% of the largest magnitudes; 24%
# for one cross-attention key, a tail value that grows with the number of values compared). The check
# bounds each output's RMS difference by a quarter of its RMS: int8 noise passes, and a broken graph,
# whose differences are of the order of the output itself (RMS ratio near or above 1), does not.
INT8_RTOL = 0.25
# A `quantize` artifact's weights are held exactly, but its integer kernels (`modelshrink.onnx.kernels`) round each
# linear layer's input their own way (per block of the input, or per tensor with a zero point) where the PyTorch
# model rounds it per tensor, symmetrically: 8-bit rounding noise, carried downstream. Measured (RMS difference /
# RMS, worst output): 0.02 on a ternary random BART of base shape, 0.054 and 0.072 on the tiny test BARTs (d 32)
# with MatMulNBits, 0.018 with the uint8 kernel; with float kernels, which keep the model's own rounding, 3e-6.
# A broken graph is at 1 or above, so the check bounds each output's RMS difference by a tenth of its RMS.
QUANTIZED_RTOL = 0.1
# A quantized model rounds its activations (per tensor, to 8 bits) dozens of times a layer, so a difference of
# float rounding alone (another summation order) flips the values at near ties, and the flips grow layer by
# layer. Small models hardly have near ties; a trained one has many: the Debian teacher's 8-8-8 model moved by
# 15-22% of an output's RMS between onnxruntime and PyTorch with every product computed exactly in integers. So
# the outputs of a quantized model are also compared with the same PyTorch model in float64 (its twin: `reference`
# with `float_rounding`; the model's own arithmetic, other float rounding), and each output's bound is the larger
# of QUANTIZED_RTOL and FLOAT_ROUNDING_FACTOR times the largest of those differences. The largest, not the output's own: flips are
# rare events, and one run of the twin can flip none in a graph where the export flips a few (the 2-2-8 model:
# its decoder's first step moved by 0 in float64 and by up to 12% in onnxruntime, while its encoder moved by 13%
# in both). A broken graph is still at 1 or above.
FLOAT_ROUNDING_FACTOR = 2.0
# --int4 rounds weights only (activations stay float), but to 16 levels a block: each weight moves by ~8% of
# the weights' RMS at block 32 (10% at 128), against ~0.5% at 8 bits, and each matmul's output by about as
# much. Measured (RMS difference / RMS, worst output; with 4-bit embedding tables, the default): 0.54 on the
# tiny test BART (d 32, whose encoder states are a LayerNorm of small random embeddings: 0.40 with float
# tables), 0.17 on the tiny T5, 0.14 on the tiny bert2bert, 0.16 on a random BART of base shape (6+6 layers,
# d 768, vocabulary 50265; 3 of 4 beam summaries equal). A broken graph (wrong packing, a transposed weight)
# computes something unrelated, whose RMS ratio is near 1 (a zero output) or sqrt(2) (uncorrelated): 0.6 of
# the output's RMS passes 4-bit noise and fails those.
INT4_RTOL = 0.6


@dataclass
class Step:
    """One graph's inputs and what PyTorch computed from them (`twin`: the float64 model's outputs)."""
    graph: str  # encoder, first (the decoder's first step), past (a step with past), classifier
    feed: dict[str, np.ndarray]
    names: list[str]
    expected: list[np.ndarray]
    twin: list[np.ndarray] | None = None


@dataclass
class Reference:
    """What the PyTorch model computes on the check's inputs, taken before the export frees it: the model and the
    onnxruntime sessions of its export are never in memory together (issue 78: export's peak memory)."""
    kind: str
    texts: list[str]
    tokenizer: Any
    mask: np.ndarray | None  # the source's padding, for the outputs that hold a vector per source token
    steps: list[Step]
    documents: dict[str, np.ndarray] = field(default_factory=dict)  # the generation check's batch
    expected: dict[str, tuple[int, list[list[int]]]] | list = field(default_factory=dict)  # mode -> (beams, ids)


def _tensor(value: np.ndarray, double: bool) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(value))
    return tensor.double() if double and tensor.is_floating_point() else tensor


def _array(value: torch.Tensor) -> np.ndarray:
    return value.detach().float().numpy()


def _run_step(model: Any, step: Step, double: bool = False) -> list[np.ndarray]:
    """The PyTorch graph behind `step` on its inputs (in float64 with `double`: the model converted beforehand)."""
    feed = {name: _tensor(value, double) for name, value in step.feed.items()}
    with torch.no_grad():
        if step.graph == "classifier":
            return [_array(ClassifierGraph(model, list(feed)).eval()(*feed.values()))]
        if step.graph == "encoder":
            return [_array(EncoderGraph(model).eval()(feed["input_ids"], feed["attention_mask"]))]
        layers = decoder_layer_count(model.config)
        with_past = step.graph == "past"
        rest = [feed[n.replace("present", "past_key_values")] for n in present_names(layers, with_past=False)] \
            if with_past else [feed["encoder_hidden_states"]]
        graph = DecoderGraph(model, layers, with_past=with_past).eval()
        return [_array(v) for v in graph(feed["input_ids"], feed["encoder_attention_mask"], *rest)]


def _steps(model: Any, tokenizer: Any, kind: str, texts: list[str], max_source_length: int,
           classifier_inputs: list[str]) -> tuple[list[Step], np.ndarray]:
    """The graphs' inputs, each computed from PyTorch's outputs before it, with PyTorch's outputs; the source mask."""
    enc = tokenizer(texts, truncation=True, max_length=max_source_length, padding=True, return_tensors="np")
    ids, mask = enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int64)
    if kind == "classifier":
        feed = {n: enc[n].astype(np.int64) if n in enc else np.zeros_like(ids) for n in classifier_inputs}
        step = Step("classifier", feed, ["logits"], [])
        step.expected = _run_step(model, step)
        return [step], mask
    encoder = Step("encoder", {"input_ids": ids, "attention_mask": mask}, ["last_hidden_state"], [])
    encoder.expected = _run_step(model, encoder)
    layers = decoder_layer_count(model.config)
    vocab = model.get_output_embeddings().weight.shape[0]
    dec_ids = sample_decoder_ids(ids.shape[0], 5, vocab, model.generation_config.decoder_start_token_id or 0, 1).numpy()
    names = ["logits", *present_names(layers, with_past=False)]
    first = Step("first", {"input_ids": dec_ids, "encoder_attention_mask": mask,
                           "encoder_hidden_states": encoder.expected[0]}, names, [])
    first.expected = _run_step(model, first)
    past = {n.replace("present", "past_key_values"): v for n, v in zip(names[1:], first.expected[1:])}
    following = Step("past", {"input_ids": np.ascontiguousarray(dec_ids[::-1, -1:]), "encoder_attention_mask": mask,
                              **past}, ["logits", *present_names(layers, with_past=True)], [])
    following.expected = _run_step(model, following)
    return [encoder, first, following], mask


def reference(model: Any, tokenizer: Any, kind: str, texts: list[str], max_source_length: int, *,
              generation_docs: int, float_rounding: bool = False,
              classifier_inputs: tuple[str, ...] = ("input_ids", "attention_mask")) -> Reference:
    """PyTorch's side of `validate`. With `float_rounding` (a model that rounds its activations), also its
    float64 twin's outputs: the model is converted to float64 in place, last (the caller frees it afterwards)."""
    steps, mask = _steps(model, tokenizer, kind, texts, max_source_length, list(classifier_inputs))
    result = Reference(kind, texts, tokenizer, mask if kind == "seq2seq" else None, steps)
    docs = texts[:generation_docs]
    if docs and kind == "seq2seq":
        _expected_tokens(model, tokenizer, docs, max_source_length, result)
    elif docs:
        from modelshrink.training.classify import predict

        rows = [{"text": t, "text_pair": None} for t in docs]
        result.expected = predict(model, tokenizer, rows, len(rows), "cpu", max_source_length)
    if float_rounding:
        model.double().eval()  # the model's own arithmetic with other rounding, at 2x its float32 bytes, not 3x
        for step in steps:
            step.twin = _run_step(model, step, double=True)
    return result


def _expected_tokens(model: Any, tokenizer: Any, docs: list[str], max_source_length: int, result: Reference) -> None:
    """`generate`'s tokens, greedy and beam search with the model's settings, the documents as one padded batch.

    One at a time, this check was nearly all of validation's time (a BART of base shape, 4 documents, 48 tokens:
    346 of 353 s, mostly PyTorch's `generate`); batched it took 12.6 s against 34.6 s and 28.7 s against 102.7 s
    in two rounds on a busy machine, with the same verdict, and the padded rows check the masks too."""
    from modelshrink.generation.settings import generate_ids, resolve_generation

    beams = max(int(getattr(model.generation_config, "num_beams", 1) or 1), 2)
    enc = tokenizer(docs, truncation=True, max_length=max_source_length, padding=True, return_tensors="pt")
    result.documents = {"input_ids": enc["input_ids"].numpy(), "attention_mask": enc["attention_mask"].numpy()}
    result.expected = {}
    for mode, num_beams in {"greedy": 1, f"beam {beams}": beams}.items():
        settings = resolve_generation(model.generation_config, num_beams=num_beams)
        result.expected[mode] = (num_beams, generate_ids(model, enc["input_ids"], enc["attention_mask"],
                                                         settings).tolist())


class ExportCheckFailed(CheckFailed):
    """The export was written, but it does not compute what the PyTorch model computes."""


def _source_mask(output: str, mask: np.ndarray) -> np.ndarray | None:
    """Where an output holds one vector per source token (the encoder's states, the cross-attention keys and
    values), the positions of real tokens: padding's values are computed but masked out of every later
    use, and under int8 they are the first to move (the worst 'difference' of the MiniLM teacher's
    encoder was 55% of its magnitude at a padded position, 16% at a real one)."""
    real = mask.astype(bool)
    if output == "last_hidden_state":
        return real[:, :, None]
    if ".encoder." in output:
        return real[:, None, :, None]
    return None


def _compare(name: str, reference: list[Any], got: list[np.ndarray], names: list[str],
             diffs: dict[str, dict[str, float]], mask: np.ndarray | None = None) -> None:
    for output, ref, value in zip(names, reference, got):
        ref = ref.detach().float().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref, dtype=np.float32)
        real = _source_mask(output, mask) if mask is not None else None
        difference, magnitude = np.abs(ref - value), np.abs(ref)
        if real is not None:
            difference, magnitude = difference * real, magnitude * real
        diffs[f"{name}:{output}"] = {"max_abs_diff": float(difference.max()),
                                     "reference_max_abs": float(magnitude.max()),
                                     "rms_ratio": float(np.sqrt((difference ** 2).sum() / max((magnitude ** 2).sum(),
                                                                                              1e-30)))}


def _label(step: Step, merged: bool) -> str:
    if step.graph in ("encoder", "classifier"):
        return ENCODER if step.graph == "encoder" else CLASSIFIER
    if merged:
        return f"{DECODER_MERGED}[{'first step' if step.graph == 'first' else 'with past'}]"
    return DECODER if step.graph == "first" else DECODER_WITH_PAST


def _runtime_outputs(runtime: Any, step: Step) -> list[np.ndarray]:
    if step.graph == "classifier":
        return runtime.classifier.run(None, {k: v for k, v in step.feed.items() if k in runtime.classifier_inputs})
    if step.graph == "encoder":
        return runtime.encoder.run(None, step.feed)
    got = runtime.run_decoder(step.feed, with_past=step.graph == "past")
    return [got[n] for n in step.names]


def output_differences(ref: Reference, runtime: Any) -> dict[str, dict[str, float]]:
    """Each graph's outputs in onnxruntime against PyTorch's, on PyTorch's inputs (padded source positions left out)."""
    diffs: dict[str, dict[str, float]] = {}
    for step in ref.steps:
        _compare(_label(step, getattr(runtime, "merged", False)), step.expected, _runtime_outputs(runtime, step),
                 step.names, diffs, ref.mask)
    return diffs


def twin_differences(ref: Reference, merged: bool) -> dict[str, dict[str, float]]:
    """How far the float64 twin moved each output from the float32 model: how far float rounding alone moves it."""
    diffs: dict[str, dict[str, float]] = {}
    for step in ref.steps:
        _compare(_label(step, merged), step.expected, step.twin or [], step.names, diffs, ref.mask)
    return diffs


def _generated(row: list[int], eos: set[int]) -> list[int]:
    """A row of a batch's output up to its first end token (the start token, which may be one, excluded):
    what follows is the batch's padding, which the two sides may fill differently."""
    for at, token in enumerate(row[1:], start=1):
        if token in eos:
            return row[:at + 1]
    return row


def generation_agreement(ref: Reference, runtime: Any) -> dict[str, Any]:
    """Tokens of the runtime against `generate`'s (`Reference`), greedy and beam, every document compared on its
    own. An int8 graph quantizes a batch's activations with shared scales, so its tokens for a document can depend
    on the batch; those differences are listed, as int8's are anyway."""
    from modelshrink.generation.settings import decode

    eos = set(runtime.search.eos_token_id)
    differences, agree, total = [], 0, 0
    for mode, (num_beams, expected) in ref.expected.items():
        got = runtime.generate_ids(ref.documents["input_ids"], ref.documents["attention_mask"],
                                   runtime.settings(num_beams=num_beams)).tolist()
        for index, (want, have) in enumerate(zip(expected, got)):
            want, have = _generated(want, eos), _generated(have, eos)
            total += 1
            if want == have:
                agree += 1
            elif len(differences) < DIFFERENCES_LISTED:
                differences.append({"document": index, "mode": mode,
                                    "pytorch": decode(ref.tokenizer, torch.tensor([want]))[0],
                                    "onnx": runtime.decode(np.array([have]))[0]})
    return {"documents": len(ref.documents["input_ids"]), "modes": list(ref.expected), "agreement": f"{agree}/{total}",
            "equal": agree == total, "differences": differences}


def label_agreement(ref: Reference, runtime: Any) -> dict[str, Any]:
    docs = ref.texts[:len(ref.expected)]
    got = runtime.classify(docs)
    differences = [{"document": i, "pytorch": a, "onnx": b} for i, (a, b) in enumerate(zip(ref.expected, got))
                   if (a != b if isinstance(a, int) else abs(a - b) > 1e-3)]
    agree = len(docs) - len(differences)
    return {"documents": len(docs), "agreement": f"{agree}/{len(docs)}", "equal": not differences,
            "differences": differences[:DIFFERENCES_LISTED]}


def validate(ref: Reference, folder: Path, *, atol: float | None, rtol: float | None, rms: bool = False,
             scaled: bool = False, log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """The validation report of the export in `folder` against PyTorch's `ref`; `failure` holds a one-line reason
    when a check failed. Differences are bounded by `atol` when given, else by `rtol` times each output's largest
    magnitude (with `rms`: the root mean square of the differences by `rtol` times the output's root mean square);
    with `rtol` (int8 graphs, quantized artifacts) token differences are listed but do not fail the check. Where
    `ref` holds the float64 twin's outputs (a model that rounds its activations), the RMS bound is at least
    FLOAT_ROUNDING_FACTOR times the largest RMS ratio between the model and its twin. With `scaled` (the float
    check's default), `atol` bounds an output whose largest magnitude is 1 or less, and grows with the magnitude
    above it: float32 sums in another order differ by a share of what they sum, and a real-size model's logits
    reach the hundreds (flan-t5-base's random shape: 197, where the graph and PyTorch differed by 1.3e-4, 6e-7 of
    it)."""
    runtime = load(folder)
    diffs = output_differences(ref, runtime)
    tolerance = (f"{atol:g} x max(1, each output's largest magnitude)" if scaled and atol is not None else atol
                 if atol is not None else f"RMS difference <= {rtol:g} x each output's RMS" if rms else
                 f"{rtol:g} x each output's largest magnitude")
    if any(step.twin is not None for step in ref.steps) and atol is None and rms:
        twin = twin_differences(ref, getattr(runtime, "merged", False))
        for name, entry in diffs.items():
            entry["float64_rms_ratio"] = twin[name]["rms_ratio"]
        moved = max(entry["rms_ratio"] for entry in twin.values())
        if FLOAT_ROUNDING_FACTOR * moved > rtol:
            tolerance = (f"RMS difference <= {FLOAT_ROUNDING_FACTOR:g} x {moved:.3g} x each output's RMS ({moved:.3g}: "
                         "the most PyTorch in float64 moves an output)")
            rtol = FLOAT_ROUNDING_FACTOR * moved
    failed = []
    for name, entry in diffs.items():
        if atol is None and rms:
            entry["passed"] = entry["rms_ratio"] <= rtol
        else:
            bound = (atol * max(1.0, entry["reference_max_abs"]) if scaled else atol) if atol is not None else \
                rtol * entry["reference_max_abs"]
            entry["passed"] = entry["max_abs_diff"] <= bound
        if not entry["passed"]:
            failed.append(name)
    measure = "rms_ratio" if rms and atol is None else "max_abs_diff"
    worst = max(diffs, key=lambda n: diffs[n][measure])
    report: dict[str, Any] = {"tolerance": tolerance, "outputs": diffs, "max_abs_diff": diffs[worst]["max_abs_diff"],
                              "worst_output": worst, "documents": len(ref.texts)}
    if measure == "rms_ratio":
        report["rms_ratio"] = diffs[worst]["rms_ratio"]
    shown = "RMS ratio" if measure == "rms_ratio" else "largest difference"
    log(f"{shown} {diffs[worst][measure]:.3g} ({worst}); tolerance {tolerance}")
    failure = None
    if failed:
        failure = (f"{len(failed)} of {len(diffs)} outputs differ from PyTorch by more than {tolerance} "
                   f"(worst: {worst}, {shown} {diffs[worst][measure]:.3g}); see export_report.json")
    if ref.expected:
        seq2seq = ref.kind == "seq2seq"
        check = generation_agreement(ref, runtime) if seq2seq else label_agreement(ref, runtime)
        report["generation" if seq2seq else "predictions"] = check
        log(f"{'generated tokens' if seq2seq else 'predictions'} equal to PyTorch's: {check['agreement']}")
        if not check["equal"] and rtol is None and failure is None:
            failure = (f"the ONNX model's {'tokens' if seq2seq else 'predictions'} differ from PyTorch's "
                       f"on {check['agreement']} agreeing cases; see export_report.json")
    report["failure"] = failure
    return report
