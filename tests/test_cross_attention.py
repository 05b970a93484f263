"""modelshrink.onnx.cross_attention: the decoder's cross-attention with past as onnxruntime's GroupQueryAttention
over each document's own source length, a document's beams as its query heads; the same numbers as the
per-document attention it replaces, which still runs for every other caller (Optimum, transformers.js, another
beam count)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from modelshrink.cli import app

runner = CliRunner()
BEAMS = 3


@pytest.fixture(scope="module")
def per_document_and_fused(plain_models, tmp_path_factory):
    """A tiny BART exported with separate decoders (self-attention fused, cross-attention per document); the
    same decoder with past with its cross-attention rewritten for BEAMS beams."""
    from modelshrink.onnx.cross_attention import fuse_cross_attention

    root = tmp_path_factory.mktemp("cross_attention")
    export = root / "export"
    result = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(export), "--no-merge", "--no-validate"])
    assert result.exit_code == 0, result.output
    fused = root / "fused.onnx"
    shutil.copy(export / "decoder_with_past_model.onnx", fused)
    assert fuse_cross_attention(fused, BEAMS) == {"cross_attention_layers": 2, "cross_attention_beams": BEAMS}
    return export / "decoder_with_past_model.onnx", fused


def _feed(rng, docs: int, beams: int, filled: int = 5, capacity: int = 9, source: int = 7) -> dict[str, np.ndarray]:
    """A step of `docs` documents x `beams` rows: the self-attention cache in buffers (runtime/cache.py), the
    cross-attention's keys and values once per document; document 0's source is 3 tokens shorter (right padding),
    and its keys and values beyond them are not zero, so that reading them would show."""
    from modelshrink.runtime.cache import PAST_LENGTH

    rows = docs * beams
    mask = np.ones((rows, source), np.int64)
    mask[:beams, -3:] = 0
    feed = {"input_ids": rng.integers(5, 30, (rows, 1)), "encoder_attention_mask": mask,
            PAST_LENGTH: np.array([filled], np.int64)}
    for layer in range(2):
        for kind in ("key", "value"):
            feed[f"past_key_values.{layer}.decoder.{kind}"] = rng.normal(size=(rows, 4, capacity, 8)).astype(np.float32)
            feed[f"past_key_values.{layer}.encoder.{kind}"] = rng.normal(size=(docs, 4, source, 8)).astype(np.float32)
    return feed


def _step(path, feed: dict[str, np.ndarray], bind_encoder: bool) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One bound call as the runtime makes it: (logits and every output, the arrays fed, after the call)."""
    import onnxruntime as ort

    from modelshrink.runtime.cache import _run_bound

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    fed = {n: v.copy() for n, v in feed.items()}
    into = {n.replace("past_key_values", "present"): v for n, v in fed.items()
            if ".decoder." in n or (bind_encoder and ".encoder." in n)}
    return _run_bound(session, names, fed, into), fed


def test_the_fused_step_computes_what_the_per_document_one_does(per_document_and_fused):
    import onnx
    import onnxruntime as ort

    from modelshrink.runtime.cache import CROSS_BEAMS, PAST_LENGTH

    per_document, fused = per_document_and_fused
    model = onnx.load(str(fused))
    assert {p.key: p.value for p in model.metadata_props}[CROSS_BEAMS] == str(BEAMS)
    branches = [{a.name: [m.op_type for m in a.g.node] for a in n.attribute} for n in model.graph.node
                if n.op_type == "If"]
    assert len(branches) == 2  # one a layer: GroupQueryAttention, else the per-document matmuls and Softmax
    assert all("GroupQueryAttention" in b["then_branch"] and "Softmax" in b["else_branch"] for b in branches)
    assert [n.op_type for n in model.graph.node].count("Softmax") == 0  # no cross-attention outside the Ifs
    rng = np.random.default_rng(0)
    feed = _feed(rng, docs=2, beams=BEAMS)
    expected, expected_fed = _step(per_document, feed, bind_encoder=False)
    got, fed = _step(fused, feed, bind_encoder=True)
    np.testing.assert_allclose(got["logits"], expected["logits"], atol=1e-5)
    for name in feed:
        if ".decoder." in name:  # the self-attention buffers as the per-document graph left them
            np.testing.assert_allclose(fed[name], expected_fed[name], atol=1e-5, err_msg=name)
        if ".encoder." in name:  # written in place with the numbers they held
            np.testing.assert_array_equal(fed[name], feed[name], err_msg=name)
    # the other callers take the per-document branch: the same logits, empty cross-attention presents
    optimum = {n: v for n, v in feed.items() if n != PAST_LENGTH}  # Optimum and transformers.js leave it out
    other_beams = _feed(np.random.default_rng(1), docs=3, beams=2)
    for case in (optimum, other_beams):
        session = ort.InferenceSession(str(fused), providers=["CPUExecutionProvider"])
        reference = ort.InferenceSession(str(per_document), providers=["CPUExecutionProvider"])
        names = [o.name for o in reference.get_outputs()]
        out = dict(zip([o.name for o in session.get_outputs()], session.run(None, case)))
        ref = dict(zip(names, reference.run(None, case)))
        np.testing.assert_allclose(out["logits"], ref["logits"], atol=1e-5)
        assert out["present.0.encoder.key"].size == 0


def test_a_second_reader_of_the_cached_keys_keeps_the_graph_as_it_was(per_document_and_fused, tmp_path):
    import onnx
    from onnx import helper

    from modelshrink.onnx.cross_attention import fuse_cross_attention

    per_document, _ = per_document_and_fused
    path = tmp_path / "decoder.onnx"
    model = onnx.load(str(per_document))
    model.graph.node.append(helper.make_node("ReduceMean", ["past_key_values.1.encoder.key"], ["extra"]))
    model.graph.output.append(helper.make_tensor_value_info("extra", onnx.TensorProto.FLOAT, None))
    onnx.save(model, str(path))
    before = path.read_bytes()
    report = fuse_cross_attention(path, BEAMS)
    assert report["cross_attention_layers"] == 0 and "layer 1" in report["cross_attention_traced"]
    assert path.read_bytes() == before  # all layers or none


def test_a_traced_self_attention_keeps_the_cross_attention_as_it_was(plain_models, tmp_path):
    """Without past_sequence_length the graph cannot tell the runtime's calls from other clients'."""
    import json

    folder = tmp_path / "traced"
    result = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(folder), "--no-validate",
                                 "--self-attention", "traced"])
    assert result.exit_code == 0, result.output
    fused = json.loads((folder / "export_report.json").read_text())["storage"]["fused"]
    assert "cross_attention_layers" not in fused


def test_a_left_padded_source_is_refused_in_one_line(plain_models, tmp_path):
    from modelshrink.errors import UserError
    from modelshrink.runtime import load

    folder = tmp_path / "export"
    result = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(folder), "--no-validate"])
    assert result.exit_code == 0, result.output
    runtime = load(folder)
    enc = runtime.encode(["a longer document than the other one", "short"])
    left = np.stack([np.roll(row, int((row == 0).sum())) for row in enc["attention_mask"]])
    with pytest.raises(UserError, match="right-padded"):
        runtime.generate_ids(enc["input_ids"], left)
