"""modelshrink.onnx.fuse: the decoder with past reads cross-attention keys and values once per document,
and the runtime's beam search still gives PyTorch's tokens (separate decoders and merged)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import DOCUMENTS
from modelshrink.cli import app

pytestmark = pytest.mark.slow  # end to end: see CONTRIBUTING.md, the fast loop


@pytest.mark.parametrize("family", ["bart", "t5", "bert2bert"])
def test_fused_decoder_generates_the_tokens_pytorch_generates(plain_models, tmp_path, family):
    from modelshrink.generation.settings import generate_ids, resolve_generation
    from modelshrink.models.loading import load_seq2seq
    from modelshrink.onnx.fuse import fuse_decoder_with_past
    from modelshrink.onnx.merge import merge_decoders
    from modelshrink.runtime import load

    folder = tmp_path / "onnx"
    result = CliRunner().invoke(app, ["export", str(plain_models[family]), "-o", str(folder), "--no-validate",
                                      "--no-merge"])
    assert result.exit_code == 0, result.output
    report = json.loads((folder / "export_report.json").read_text())["storage"]["fused"]  # export's own rewrite
    assert fuse_decoder_with_past(folder / "decoder_with_past_model.onnx")["per_document_matmuls"] == 0  # once
    # BART and bert2bert read each cross-attention key and value once (2 layers: 4 matmuls); T5's are read
    # by its position-bias code too, so its graph keeps one row per beam (the rewrite is all or nothing)
    assert report["per_document_matmuls"] == (0 if family == "t5" else 4)
    assert report["shape_only_constants"] == 1
    # the traced cache code's one-input Concat in front of past keys and values (copies of them) are gone
    assert report["single_input_concats"] == (7 if family == "bart" else 6)
    # self-attention with past as GroupQueryAttention, the cache written in place (onnx/self_attention.py); T5's
    # scores add a position bias computed from weights, which the op does not take: its graph stays as traced
    assert report["self_attention_layers"] == (0 if family == "t5" else 2)
    model, tok, _ = load_seq2seq(str(plain_models[family]))
    enc = tok(DOCUMENTS[:5], padding=True, return_tensors="pt")  # padded: the masks matter
    expected = generate_ids(model, enc["input_ids"], enc["attention_mask"],
                            resolve_generation(model.generation_config, num_beams=3, min_length=6)).numpy()
    for merged in (False, True):
        if merged:
            merge_decoders(folder)
            manifest = json.loads((folder / "modelshrink.json").read_text())  # as export writes it after merging
            manifest["files"] = {n: h for n, h in manifest["files"].items() if (folder / n).is_file()}
            (folder / "modelshrink.json").write_text(json.dumps(manifest))
        runtime = load(folder)
        assert len(runtime.per_document) == report["per_document_matmuls"]
        assert runtime.cache_in_place == (family != "t5")
        got = runtime.generate_ids(enc["input_ids"].numpy(), enc["attention_mask"].numpy(),
                                   runtime.settings(num_beams=3, min_length=6))
        np.testing.assert_array_equal(got, expected)
