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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from modelshrink.errors import CheckFailed
from modelshrink.families import decoder_layer_count
from modelshrink.onnx.graphs import ClassifierGraph, DecoderGraph, EncoderGraph, present_names, sample_decoder_ids
from modelshrink.runtime.files import DECODER, DECODER_MERGED, DECODER_WITH_PAST
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
# the outputs of a quantized model are also compared with the same PyTorch model in float64 (`FloatTwin`: the
# model's own arithmetic, other float rounding), and each output's bound is the larger of QUANTIZED_RTOL and
# FLOAT_ROUNDING_FACTOR times the largest of those differences. The largest, not the output's own: flips are
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


class _Session:
    def __init__(self, run: Callable[[dict[str, np.ndarray]], list[np.ndarray]]):
        self._run = run

    def run(self, _names: Any, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self._run(feed)


def _tensor(value: np.ndarray) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(value))
    return tensor.double() if tensor.is_floating_point() else tensor


def _array(value: torch.Tensor) -> np.ndarray:
    return value.detach().float().numpy()


class FloatTwin:
    """The PyTorch model in float64 behind the runtime's interface (`output_differences` reads it as it reads an
    export): the same arithmetic with other float rounding. How far it moves from the float32 model is how far
    float rounding alone moves a quantized model, whose roundings of activations flip at near ties."""

    def __init__(self, model: Any, kind: str, runtime: Any):
        import copy

        self.merged = getattr(runtime, "merged", False)  # only names the outputs as the export's are named
        twin = copy.deepcopy(model).double().eval()
        if kind == "classifier":
            self.classifier_inputs = sorted(runtime.classifier_inputs)
            graph = ClassifierGraph(twin, self.classifier_inputs).eval()
            self.classifier = _Session(lambda feed: [_array(graph(*(_tensor(feed[n]) for n in self.classifier_inputs)))])
            return
        encoder = EncoderGraph(twin).eval()
        self.encoder = _Session(lambda feed: [_array(encoder(_tensor(feed["input_ids"]),
                                                             _tensor(feed["attention_mask"])))])
        self.layers = decoder_layer_count(model.config)
        self.decoders = {past: DecoderGraph(twin, self.layers, with_past=past).eval() for past in (False, True)}

    def run_decoder(self, feed: dict[str, np.ndarray], with_past: bool) -> dict[str, np.ndarray]:
        rest = ([feed["encoder_hidden_states"]] if not with_past else
                [feed[n.replace("present", "past_key_values")] for n in present_names(self.layers, with_past=False)])
        out = self.decoders[with_past](_tensor(feed["input_ids"]), _tensor(feed["encoder_attention_mask"]),
                                       *(_tensor(r) for r in rest))
        names = ["logits", *present_names(self.layers, with_past=with_past)]
        return {name: _array(value) for name, value in zip(names, out)}


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


def _compare(name: str, reference: list[torch.Tensor], got: list[np.ndarray], names: list[str],
             diffs: dict[str, dict[str, float]], mask: np.ndarray | None = None) -> None:
    for output, ref, value in zip(names, reference, got):
        ref = ref.detach().float().numpy()
        real = _source_mask(output, mask) if mask is not None else None
        difference, magnitude = np.abs(ref - value), np.abs(ref)
        if real is not None:
            difference, magnitude = difference * real, magnitude * real
        diffs[f"{name}:{output}"] = {"max_abs_diff": float(difference.max()),
                                     "reference_max_abs": float(magnitude.max()),
                                     "rms_ratio": float(np.sqrt((difference ** 2).sum() / max((magnitude ** 2).sum(),
                                                                                              1e-30)))}


def output_differences(model: Any, tokenizer: Any, runtime: Any, kind: str, texts: list[str],
                       max_source_length: int) -> dict[str, dict[str, float]]:
    enc = tokenizer(texts, truncation=True, max_length=max_source_length, padding=True, return_tensors="pt")
    diffs: dict[str, dict[str, float]] = {}
    with torch.no_grad():
        if kind == "classifier":
            names = sorted(runtime.classifier_inputs)
            feed = {n: enc[n] if n in enc else torch.zeros_like(enc["input_ids"]) for n in names}
            logits = ClassifierGraph(model, names).eval()(*feed.values())
            _compare("model.onnx", [logits], runtime.classifier.run(None, {k: v.numpy() for k, v in feed.items()}),
                     ["logits"], diffs)
            return diffs
        ids, mask = enc["input_ids"], enc["attention_mask"]
        hidden = EncoderGraph(model).eval()(ids, mask)
        _compare("encoder_model.onnx", [hidden], runtime.encoder.run(None, {"input_ids": ids.numpy(),
                                                                            "attention_mask": mask.numpy()}),
                 ["last_hidden_state"], diffs, mask.numpy())
        layers = decoder_layer_count(model.config)
        vocab = model.get_output_embeddings().weight.shape[0]
        dec_ids = sample_decoder_ids(ids.shape[0], 5, vocab, model.generation_config.decoder_start_token_id or 0, 1)
        first = DecoderGraph(model, layers, with_past=False).eval()(dec_ids, mask, hidden)
        names = ["logits", *present_names(layers, with_past=False)]
        got = runtime.run_decoder({"input_ids": dec_ids.numpy(), "encoder_attention_mask": mask.numpy(),
                                   "encoder_hidden_states": hidden.numpy()}, with_past=False)
        labels = (f"{DECODER_MERGED}[first step]", f"{DECODER_MERGED}[with past]") if runtime.merged \
            else (DECODER, DECODER_WITH_PAST)
        _compare(labels[0], list(first), [got[n] for n in names], names, diffs, mask.numpy())
        step = dec_ids[:, -1:].flip(0)
        following = DecoderGraph(model, layers, with_past=True).eval()(step, mask, *first[1:])
        past = {n.replace("present", "past_key_values"): t.numpy() for n, t in zip(names[1:], first[1:])}
        got = runtime.run_decoder({"input_ids": step.numpy(), "encoder_attention_mask": mask.numpy(), **past},
                                  with_past=True)
        names = ["logits", *present_names(layers, with_past=True)]
        _compare(labels[1], list(following), [got[n] for n in names], names, diffs, mask.numpy())
    return diffs


def _generated(row: list[int], eos: set[int]) -> list[int]:
    """A row of a batch's output up to its first end token (the start token, which may be one, excluded):
    what follows is the batch's padding, which the two sides may fill differently."""
    for at, token in enumerate(row[1:], start=1):
        if token in eos:
            return row[:at + 1]
    return row


def generation_agreement(model: Any, tokenizer: Any, runtime: Any, texts: list[str], max_source_length: int,
                         log: Callable[[str], None]) -> dict[str, Any]:
    """Tokens of the runtime against `generate`, greedy and beam, every document compared on its own.

    The documents go as one padded batch per mode, to both sides. One at a time, this check was nearly all
    of validation's time (a BART of base shape, 4 documents, 48 tokens: 346 of 353 s, mostly PyTorch's
    `generate`); batched it took 12.6 s against 34.6 s and 28.7 s against 102.7 s in two rounds on a busy
    machine, with the same verdict, and the padded rows check the masks too. An int8 graph quantizes a
    batch's activations with shared scales, so its tokens for a document can depend on the batch; those
    differences are listed, as int8's are anyway."""
    from modelshrink.generation.settings import decode, generate_ids, resolve_generation

    beams = max(int(getattr(model.generation_config, "num_beams", 1) or 1), 2)
    modes = {"greedy": 1, f"beam {beams}": beams}
    eos = set(runtime.search.eos_token_id)
    enc = tokenizer(texts, truncation=True, max_length=max_source_length, padding=True, return_tensors="pt")
    differences, agree, total = [], 0, 0
    for mode, num_beams in modes.items():
        settings = resolve_generation(model.generation_config, num_beams=num_beams)
        expected = generate_ids(model, enc["input_ids"], enc["attention_mask"], settings).tolist()
        got = runtime.generate_ids(enc["input_ids"].numpy(), enc["attention_mask"].numpy(),
                                   runtime.settings(num_beams=num_beams)).tolist()
        for index, (want, have) in enumerate(zip(expected, got)):
            want, have = _generated(want, eos), _generated(have, eos)
            total += 1
            if want == have:
                agree += 1
            elif len(differences) < DIFFERENCES_LISTED:
                differences.append({"document": index, "mode": mode,
                                    "pytorch": decode(tokenizer, torch.tensor([want]))[0],
                                    "onnx": runtime.decode(np.array([have]))[0]})
    return {"documents": len(texts), "modes": list(modes), "agreement": f"{agree}/{total}",
            "equal": agree == total, "differences": differences}


def label_agreement(model: Any, tokenizer: Any, runtime: Any, texts: list[str], max_source_length: int) -> dict[str, Any]:
    from modelshrink.training.classify import predict

    rows = [{"text": t, "text_pair": None} for t in texts]
    expected = predict(model, tokenizer, rows, len(rows), "cpu", max_source_length)
    got = runtime.classify(texts)
    differences = [{"document": i, "pytorch": a, "onnx": b} for i, (a, b) in enumerate(zip(expected, got))
                   if (a != b if isinstance(a, int) else abs(a - b) > 1e-3)]
    agree = len(texts) - len(differences)
    return {"documents": len(texts), "agreement": f"{agree}/{len(texts)}", "equal": not differences,
            "differences": differences[:DIFFERENCES_LISTED]}


def validate(model: Any, tokenizer: Any, folder: Path, kind: str, texts: list[str], max_source_length: int, *,
             atol: float | None, rtol: float | None, generation_docs: int, rms: bool = False,
             float_rounding: bool = False, scaled: bool = False,
             log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """The validation report; `failure` holds a one-line reason when a check failed. Differences are
    bounded by `atol` when given, else by `rtol` times each output's largest magnitude (with `rms`: the root mean
    square of the differences by `rtol` times the output's root mean square); with `rtol`
    (int8 graphs, quantized artifacts) token differences are listed but do not fail the check. With
    `float_rounding` (a model that rounds its activations), the RMS bound is at least FLOAT_ROUNDING_FACTOR times
    the largest RMS ratio between the model and its float64 twin (`FloatTwin`). With `scaled` (the float check's
    default), `atol` bounds an output whose largest magnitude is 1 or less, and grows with the magnitude above it:
    float32 sums in another order differ by a share of what they sum, and a real-size model's logits reach the
    hundreds (flan-t5-base's random shape: 197, where the graph and PyTorch differed by 1.3e-4, 6e-7 of it)."""
    runtime = load(folder)
    diffs = output_differences(model, tokenizer, runtime, kind, texts, max_source_length)
    tolerance = (f"{atol:g} x max(1, each output's largest magnitude)" if scaled and atol is not None else atol
                 if atol is not None else f"RMS difference <= {rtol:g} x each output's RMS" if rms else
                 f"{rtol:g} x each output's largest magnitude")
    if float_rounding and atol is None and rms:
        twin = output_differences(model, tokenizer, FloatTwin(model, kind, runtime),
                                  kind, texts, max_source_length)
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
                              "worst_output": worst, "documents": len(texts)}
    if measure == "rms_ratio":
        report["rms_ratio"] = diffs[worst]["rms_ratio"]
    shown = "RMS ratio" if measure == "rms_ratio" else "largest difference"
    log(f"{shown} {diffs[worst][measure]:.3g} ({worst}); tolerance {tolerance}")
    failure = None
    if failed:
        failure = (f"{len(failed)} of {len(diffs)} outputs differ from PyTorch by more than {tolerance} "
                   f"(worst: {worst}, {shown} {diffs[worst][measure]:.3g}); see export_report.json")
    docs = texts[:generation_docs]
    if docs:
        check = generation_agreement(model, tokenizer, runtime, docs, max_source_length, log) if kind == "seq2seq" \
            else label_agreement(model, tokenizer, runtime, docs, max_source_length)
        report["generation" if kind == "seq2seq" else "predictions"] = check
        log(f"{'generated tokens' if kind == 'seq2seq' else 'predictions'} equal to PyTorch's: {check['agreement']}")
        if not check["equal"] and rtol is None and failure is None:
            failure = (f"the ONNX model's {'tokens' if kind == 'seq2seq' else 'predictions'} differ from PyTorch's "
                       f"on {check['agreement']} agreeing cases; see export_report.json")
    report["failure"] = failure
    return report
