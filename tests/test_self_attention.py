"""modelshrink.onnx.self_attention and runtime/cache.py: the decoder's self-attention with past as onnxruntime's
GroupQueryAttention, its cache in buffers written in place; the same numbers as the traced graph, both when a
client feeds a growing past (Optimum, transformers.js) and when the runtime binds one buffer as past and present."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import DOCUMENTS
from modelshrink.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def traced_and_fused(plain_models, tmp_path_factory):
    """A tiny BART exported with separate decoders, self-attention as traced; the same decoder with past rewritten."""
    from modelshrink.onnx.self_attention import fuse_self_attention

    root = tmp_path_factory.mktemp("self_attention")
    traced = root / "traced"
    result = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(traced), "--no-merge", "--no-validate",
                                 "--self-attention", "traced"])
    assert result.exit_code == 0, result.output
    fused = root / "fused.onnx"
    shutil.copy(traced / "decoder_with_past_model.onnx", fused)
    assert fuse_self_attention(fused) == {"self_attention_layers": 2}
    return traced, fused


def _feed(rng, batch: int, past: int, source: int = 7) -> dict[str, np.ndarray]:
    feed = {"input_ids": rng.integers(5, 30, (batch, 1)), "encoder_attention_mask": np.ones((batch, source), np.int64)}
    feed["encoder_attention_mask"][0, -2:] = 0  # a padded source
    for layer in range(2):
        for kind in ("key", "value"):
            feed[f"past_key_values.{layer}.decoder.{kind}"] = rng.normal(size=(batch, 4, past, 8)).astype(np.float32)
            feed[f"past_key_values.{layer}.encoder.{kind}"] = rng.normal(size=(batch, 4, source, 8)).astype(np.float32)
    return feed


def test_the_rewritten_step_computes_what_the_traced_one_does(traced_and_fused):
    import onnx
    import onnxruntime as ort

    from modelshrink.runtime.cache import PAST_LENGTH, _run_bound

    traced, fused = traced_and_fused
    ops = [n.op_type for n in onnx.load(str(fused)).graph.node]
    before = [n.op_type for n in onnx.load(str(traced / "decoder_with_past_model.onnx")).graph.node]
    # both layers' self-attention, and only it: cross-attention keeps its Softmax
    assert ops.count("GroupQueryAttention") == 2 and (before.count("Softmax"), ops.count("Softmax")) == (4, 2)
    a = ort.InferenceSession(str(traced / "decoder_with_past_model.onnx"), providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(fused), providers=["CPUExecutionProvider"])
    assert PAST_LENGTH in {i.name for i in b.get_overridable_initializers()}
    names = [o.name for o in a.get_outputs()]
    feed = _feed(np.random.default_rng(0), batch=3, past=5)
    expected = dict(zip(names, a.run(None, feed)))
    # fed as Optimum feeds it (a past of its own length, past_sequence_length left out): the present grows by one
    got = dict(zip(names, b.run(None, feed)))
    for name in names:
        assert got[name].shape == expected[name].shape
        np.testing.assert_allclose(got[name], expected[name], atol=1e-5, err_msg=name)
    # bound as the runtime binds it: buffers of 9 positions, 5 filled, each present written into its past
    buffers = {}
    for name, value in feed.items():
        if ".decoder." in name:
            buffers[name] = np.full((3, 4, 9, 8), 7.0, dtype=np.float32)
            buffers[name][:, :, :5] = value
    into = {"logits": np.empty_like(expected["logits"]),
            **{n.replace("past_key_values", "present"): v for n, v in buffers.items()}}
    _run_bound(b, names, {**feed, **buffers, PAST_LENGTH: np.array([5], np.int64)}, into)
    np.testing.assert_allclose(into["logits"], expected["logits"], atol=1e-5)
    for name, buffer in buffers.items():
        present = expected[name.replace("past_key_values", "present")]
        np.testing.assert_allclose(buffer[:, :, :6], present, atol=1e-5, err_msg=name)
        assert (buffer[:, :, 6:] == 7.0).all()  # nothing written past the new position


def test_a_bias_from_weights_or_a_second_reader_keeps_the_graph_as_traced(traced_and_fused, tmp_path):
    import onnx
    from onnx import helper

    from modelshrink.onnx.self_attention import fuse_self_attention

    traced, _ = traced_and_fused
    path = tmp_path / "decoder.onnx"
    model = onnx.load(str(traced / "decoder_with_past_model.onnx"))
    # the present key of layer 1 read by one more node (as T5's position-bias code reads its keys)
    model.graph.node.append(helper.make_node("Shape", ["present.1.decoder.key"], ["extra_shape"]))
    model.graph.output.append(helper.make_tensor_value_info("extra_shape", onnx.TensorProto.INT64, [4]))
    onnx.save(model, str(path))
    before = path.read_bytes()
    report = fuse_self_attention(path)
    assert report["self_attention_layers"] == 0 and "layer 1" in report["self_attention_traced"]
    assert path.read_bytes() == before  # all layers or none



def test_a_kept_binding_binds_again_only_the_arrays_that_changed(traced_and_fused, monkeypatch):
    """runtime.cache.Binding across two steps: the second binds only its new token array (the buffers, written
    in place, and the length, advanced in place, stay bound) and computes what the traced graph does."""
    import onnxruntime as ort

    from modelshrink.runtime.cache import PAST_LENGTH, Binding

    traced, fused = traced_and_fused
    a = ort.InferenceSession(str(traced / "decoder_with_past_model.onnx"), providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(fused), providers=["CPUExecutionProvider"])
    names = [o.name for o in a.get_outputs()]
    rng = np.random.default_rng(1)
    feed = _feed(rng, batch=3, past=5)
    buffers = {n: np.zeros((3, 4, 9, 8), dtype=np.float32) for n in feed if ".decoder." in n}
    for name, buffer in buffers.items():
        buffer[:, :, :5] = feed[name]
    logits = np.empty((3, 1, a.get_outputs()[0].shape[-1]), dtype=np.float32)
    into = {"logits": logits, **{n.replace("past_key_values", "present"): v for n, v in buffers.items()}}
    bound = []
    real = ort.OrtValue.ortvalue_from_numpy
    monkeypatch.setattr(ort.OrtValue, "ortvalue_from_numpy", lambda value, *rest: (bound.append(value), real(value, *rest))[1])
    length = np.array([5], np.int64)
    binding = Binding(b, names)
    binding.run({**feed, **buffers, PAST_LENGTH: length}, into)
    assert len(bound) == len(feed) + 1 + len(into)  # every input (past_sequence_length too) and every output
    bound.clear()
    tokens = rng.integers(5, 30, (3, 1))
    length[0] = 6
    expected = dict(zip(names, a.run(None, {**feed, "input_ids": tokens, **{n: v[:, :, :6].copy() for n, v in buffers.items()}})))
    out = binding.run({**feed, "input_ids": tokens, **buffers, PAST_LENGTH: length}, into)
    assert len(bound) == 1 and bound[0] is tokens
    np.testing.assert_allclose(out["logits"], expected["logits"], atol=1e-5)
    for name, buffer in buffers.items():
        np.testing.assert_allclose(buffer[:, :, :7], expected[name.replace("past_key_values", "present")], atol=1e-5)

@pytest.mark.slow
def test_the_runtime_gives_the_traced_export_s_tokens_and_grows_a_short_cache(plain_models, tmp_path, monkeypatch):
    from modelshrink.runtime import cache, load

    folders = {}
    for how in ("traced", "fused"):
        folders[how] = tmp_path / how
        result = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(folders[how]), "--no-validate",
                                     "--self-attention", how])
        assert result.exit_code == 0, result.output
    contrib = {how: json.loads((f / "modelshrink.json").read_text())["resolved"]["contrib_ops"]
               for how, f in folders.items()}
    assert "GroupQueryAttention" in contrib["fused"] and "GroupQueryAttention" not in contrib["traced"]
    traced, fused = load(folders["traced"]), load(folders["fused"])
    assert fused.cache_in_place and not traced.cache_in_place
    # the cross-attention over each document's own length at the generation config's 2 beams
    # (onnx/cross_attention.py; tests/test_cross_attention.py), the per-document one at 1 and 3
    assert (fused.cross_beams, traced.cross_beams) == (2, 0)
    enc = fused.encode(DOCUMENTS[:5])
    assert len(set(enc["attention_mask"].sum(axis=1))) > 1  # sources of different lengths
    made = cache.InPlaceCache.__init__
    for beams in (1, 2, 3):
        settings = fused.settings(num_beams=beams, min_length=8, max_length=12)
        expected = traced.generate_ids(enc["input_ids"], enc["attention_mask"], settings)
        np.testing.assert_array_equal(fused.generate_ids(enc["input_ids"], enc["attention_mask"], settings), expected)
        # a search longer than the buffers it was given: they double, the tokens stay the same
        monkeypatch.setattr(cache.InPlaceCache, "__init__", lambda self, model, capacity: made(self, model, 2))
        np.testing.assert_array_equal(fused.generate_ids(enc["input_ids"], enc["attention_mask"], settings), expected)
        monkeypatch.undo()


@pytest.mark.slow
def test_a_runtime_without_the_op_is_one_line_naming_the_option_that_avoids_it(plain_models, tmp_path, monkeypatch):
    from onnxruntime.capi import onnxruntime_pybind11_state

    from modelshrink.runtime import load
    from modelshrink.runtime.errors import UserError

    folder = tmp_path / "fused"
    result = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(folder), "--no-validate"])
    assert result.exit_code == 0, result.output
    lacking = [s for s in onnxruntime_pybind11_state.get_all_operator_schema()
               if not (s.domain == "com.microsoft" and s.name == "GroupQueryAttention")]
    monkeypatch.setattr(onnxruntime_pybind11_state, "get_all_operator_schema", lambda: lacking)
    with pytest.raises(UserError, match="needs onnxruntime's GroupQueryAttention, which onnxruntime .* lacks; .*"
                                        "export again with --self-attention traced"):
        load(folder)
    # an export on such an onnxruntime keeps the traced attention and says why
    out = tmp_path / "here"
    result = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(out), "--no-validate"])
    assert result.exit_code == 0, result.output
    assert "self-attention kept as traced: onnxruntime" in result.output
    assert not load(out).cache_in_place


@pytest.mark.slow
def test_a_quantize_artifact_fuses_only_without_the_models_attention_rounding(plain_models, tmp_path):
    """With --activation-rounding model the attention rounds its probabilities between the two products, which
    GroupQueryAttention cannot: traced, and the export says why; with none (a float Cast and an Identity left
    where the roundings were) it is fused, and generates the traced graph's tokens (all but a near-tie: a random 2-bit
    model's logits sit close together, and the two graphs add in different orders)."""
    from modelshrink.runtime import load

    artifact = tmp_path / "q"
    result = runner.invoke(app, ["quantize", str(plain_models["bart"]), "-o", str(artifact), "--method", "direct",
                                 "--bits", "2-2-8", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    folders = {}
    for rounding, how in (("model", "fused"), ("none", "fused"), ("none", "traced")):
        folders[rounding, how] = tmp_path / f"{rounding}-{how}"
        # one kernel for all (auto measures each export anew, and kernels round differently): only the attention
        # differs between the folders
        result = runner.invoke(app, ["export", str(artifact), "-o", str(folders[rounding, how]), "--no-validate",
                                     "--activation-rounding", rounding, "--self-attention", how, "--kernel", "int8"])
        assert result.exit_code == 0, result.output
        fused = json.loads((folders[rounding, how] / "export_report.json").read_text())["storage"]["fused"]
        assert fused.get("self_attention_layers", 0) == (2 if (rounding, how) == ("none", "fused") else 0)
        if rounding == "model":
            assert "not the plain pattern" in fused["self_attention_traced"]
    fused, traced = load(folders["none", "fused"]), load(folders["none", "traced"])
    enc = fused.encode(DOCUMENTS[:4])
    settings = fused.settings(num_beams=2, max_length=12)
    a = fused.generate_ids(enc["input_ids"], enc["attention_mask"], settings)
    b = traced.generate_ids(enc["input_ids"], enc["attention_mask"], settings)
    assert a.shape == b.shape and (a == b).mean() >= 0.9, (a, b)


def test_self_attention_on_a_classifier_is_refused_in_one_line(classifier_path, tmp_path):
    result = runner.invoke(app, ["export", str(classifier_path), "-o", str(tmp_path / "c"), "--self-attention", "traced"])
    assert result.exit_code != 0 and not (tmp_path / "c").exists()
    assert "--self-attention applies to a seq2seq model's decoder" in result.output
