"""The torch-free runtime: the same tokens as PyTorch, no torch import, a CLI, and eval on an export folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import DOCUMENTS, build
from modelshrink.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def exported(plain_models, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """(model folder, export folder) per family, exported without validation (test_export checks that)."""
    root = tmp_path_factory.mktemp("rt")
    out = {}
    for family, path in plain_models.items():
        result = runner.invoke(app, ["export", str(path), "-o", str(root / f"{family}-onnx"), "--no-validate"])
        assert result.exit_code == 0, result.output
        out[family] = (path, root / f"{family}-onnx")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bart", "t5", "bert2bert"])
@pytest.mark.parametrize("overrides", [dict(num_beams=1, min_length=4),
                                       dict(num_beams=3, no_repeat_ngram_size=2, min_length=6, length_penalty=2.0)],
                         ids=["greedy", "beam3-ngram-minlen"])
def test_runtime_generates_the_tokens_pytorch_generates(exported, family, overrides):
    from modelshrink.generation.settings import generate_ids, resolve_generation
    from modelshrink.models.loading import load_seq2seq
    from modelshrink.runtime import load

    model_path, export_path = exported[family]
    model, tok, _ = load_seq2seq(str(model_path))
    runtime = load(export_path)
    enc = tok(DOCUMENTS[:5], padding=True, return_tensors="pt")  # padded batch: the masks matter
    expected = generate_ids(model, enc["input_ids"], enc["attention_mask"],
                            resolve_generation(model.generation_config, **overrides)).numpy()
    got = runtime.generate_ids(enc["input_ids"].numpy(), enc["attention_mask"].numpy(), runtime.settings(**overrides))
    np.testing.assert_array_equal(got, expected)
    assert runtime.search_ops is not None  # beam search ranked onnxruntime's per-beam candidates; numpy agrees
    runtime.search_ops = None
    np.testing.assert_array_equal(runtime.generate_ids(enc["input_ids"].numpy(), enc["attention_mask"].numpy(),
                                                       runtime.settings(**overrides)), expected)
    # and the runtime's own tokenizer and decoding give transformers' text
    assert runtime.summarize(DOCUMENTS[:5], **overrides) == tok.batch_decode(expected, skip_special_tokens=True)


def test_runtime_never_imports_torch(exported, tmp_path):
    _, export_path = exported["bert2bert"]
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": str(i), "document": d}) + "\n" for i, d in enumerate(DOCUMENTS[:3])))
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'transformers'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from modelshrink.runtime import load, main\n"
        f"print(load({str(export_path)!r}).summarize(['the quick brown fox'], num_beams=2))\n"
        f"main([{str(export_path)!r}, '--input', {str(docs)!r}])\n"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 4 and json.loads(lines[1])["id"] == "0"


def test_run_command_prints_one_prediction_per_line(exported, docs_jsonl):
    _, export_path = exported["bart"]
    result = runner.invoke(app, ["run", str(export_path), "--input", str(docs_jsonl), "--limit", "3"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert [r["id"] for r in rows] == ["doc-0", "doc-1", "doc-2"] and all(isinstance(r["prediction"], str) for r in rows)
    one = runner.invoke(app, ["run", str(export_path), "--input", str(docs_jsonl), "--limit", "3", "--threads", "1"])
    assert one.exit_code == 0 and one.stdout == result.stdout  # one thread writes the same summaries
    from modelshrink.runtime import load

    assert load(export_path, threads=1).encoder.get_session_options().intra_op_num_threads == 1
    assert load(export_path, threads=2).decoder.get_session_options().intra_op_num_threads == 2
    bad = runner.invoke(app, ["run", str(docs_jsonl.parent), "--input", str(docs_jsonl)])
    assert bad.exit_code == 1 and "not an export folder" in bad.output


@pytest.mark.slow
def test_eval_scores_an_export_folder_like_its_model(exported, docs_jsonl, tmp_path):
    model_path, export_path = exported["bart"]
    common = ["--batch-size", "4", "--latency-docs", "2", "--resamples", "100"]
    a = runner.invoke(app, ["eval", str(export_path), str(docs_jsonl), "-o", str(tmp_path / "e-onnx"), *common,
                            "--threads", "1"])
    b = runner.invoke(app, ["eval", str(model_path), str(docs_jsonl), "-o", str(tmp_path / "e-torch"), *common])
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    metrics = json.loads((tmp_path / "e-onnx" / "metrics.json").read_text())
    torch_metrics = json.loads((tmp_path / "e-torch" / "metrics.json").read_text())
    assert metrics["rouge1"] == torch_metrics["rouge1"]
    assert metrics["efficiency"]["latency_ms_p50"] > 0 and metrics["efficiency"]["bytes_on_disk"] > 0
    assert metrics["efficiency"]["threads"] == 1
    refused = runner.invoke(app, ["eval", str(model_path), str(docs_jsonl), "-o", str(tmp_path / "e-t"), *common,
                                  "--threads", "1"])
    assert refused.exit_code == 1 and "--threads sets an export folder's" in refused.output
    assert not (tmp_path / "e-t").exists()
    predictions = lambda d: [json.loads(x)["prediction"] for x in (d / "predictions.jsonl").read_text().splitlines()]  # noqa: E731
    assert predictions(tmp_path / "e-onnx") == predictions(tmp_path / "e-torch")



@pytest.mark.parametrize("damage, named", [("truncated encoder", "encoder_model.onnx"),
                                           ("missing encoder", "encoder_model.onnx"),
                                           ("truncated decoder", "decoder_model_merged.onnx"),
                                           ("truncated tokenizer", "tokenizer.json"),
                                           ("missing config", "config.json"),
                                           # without a word, generation fell back to config.json's settings
                                           ("missing generation", "generation_config.json"),
                                           ("missing tokenizer-config", "tokenizer_config.json")])
def test_eval_and_run_on_a_damaged_export_folder_fail_with_one_line(exported, docs_jsonl, tmp_path, damage, named):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(exported["bart"][1], broken)
    what, name = damage.split()
    file = broken / {"encoder": "encoder_model.onnx", "decoder": "decoder_model_merged.onnx",
                     "tokenizer": "tokenizer.json", "config": "config.json",
                     "generation": "generation_config.json", "tokenizer-config": "tokenizer_config.json"}[name]
    if what == "truncated":
        file.write_bytes(file.read_bytes()[:file.stat().st_size // 3])
    else:
        file.unlink()
    for args in (["eval", str(broken), str(docs_jsonl), "-o", str(tmp_path / "e")],
                 ["run", str(broken), "--input", str(docs_jsonl)]):
        result = runner.invoke(app, args)
        errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
        assert result.exit_code == 1 and len(errors) == 1 and named in errors[0], (args[0], result.output)
        assert isinstance(result.exception, SystemExit), result.exception  # an exit code, not an uncaught error
    assert not (tmp_path / "e").exists()


def test_runtime_classifies_like_pytorch(classifier_path, tmp_path):
    from modelshrink.training.classify import predict
    from modelshrink.models.loading import load_classifier
    from modelshrink.runtime import load

    assert runner.invoke(app, ["export", str(classifier_path), "-o", str(tmp_path / "c"), "--no-validate"]).exit_code == 0
    model, tok = load_classifier(str(classifier_path))
    rows = [{"text": d, "text_pair": None} for d in DOCUMENTS]
    assert load(tmp_path / "c").classify(DOCUMENTS) == predict(model, tok, rows, 4, "cpu")


@pytest.mark.slow
@pytest.mark.parametrize("early_stopping,beams", [(False, 3), (True, 3), ("never", 3), (False, 1)])
def test_documents_that_finish_early_leave_the_batch_and_tokens_still_match(tmp_path, early_stopping, beams):
    """A BART whose end token is favoured ends some summaries after a few tokens; those documents leave the
    beam search's batch (fewer decoder rows per step), and every document still gets transformers' tokens."""
    import torch

    from modelshrink.generation.settings import generate_ids, resolve_generation
    from modelshrink.runtime import load

    model, tok = build("bart", wide=False)
    with torch.no_grad():
        model.final_logits_bias[0, model.generation_config.eos_token_id] += 2.5
    model.generation_config.early_stopping = early_stopping  # the runtime reads it from generation_config.json
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    assert runner.invoke(app, ["export", str(tmp_path / "m"), "-o", str(tmp_path / "x"), "--no-validate"]).exit_code == 0
    runtime = load(tmp_path / "x")
    rows = []
    step = runtime.run_decoder  # every decoder call, whichever cache the folder's decoder keeps
    runtime.run_decoder = lambda feed, with_past, **kw: (rows.append(feed["input_ids"].shape[0]) if with_past else None,
                                                         step(feed, with_past, **kw))[1]
    enc = tok(DOCUMENTS[:6], padding=True, return_tensors="pt")
    overrides = dict(num_beams=beams, max_length=20)
    got = runtime.generate_ids(enc["input_ids"].numpy(), enc["attention_mask"].numpy(), runtime.settings(**overrides))
    expected = generate_ids(model, enc["input_ids"], enc["attention_mask"],
                            resolve_generation(model.generation_config, **overrides)).numpy()
    np.testing.assert_array_equal(got, expected)
    assert min(rows) < 6 * beams  # fewer decoder rows once some documents were done


def test_search_ops_candidates_equal_the_whole_row_ranking_with_ties_and_bans(exported):
    """Per-beam top k from onnxruntime, then a ranking of those candidates: the same scores and indices as a
    stable top-k over all [beams x vocab], with ties (small integer logits) and banned tokens."""
    from modelshrink.runtime import Search, load

    runtime = load(exported["bart"][1])
    ops = runtime.search_ops
    rng = np.random.default_rng(0)
    batch, beams, vocab, keep = 3, 4, 40, 8
    for trial in range(20):
        logits = rng.integers(0, 4, size=(batch * beams, vocab)).astype(np.float32)
        running = rng.integers(-3, 0, size=(batch, beams)).astype(np.float32)
        if trial % 2:
            running[:, 1:] = -1.0e9  # the first step: only beam 0 is alive
        flat = rng.integers(0, 6, size=(batch * beams, 7))  # short sequences over few tokens: many 2-gram bans
        settings = Search(num_beams=beams, max_length=30, min_length=10, no_repeat_ngram_size=2, eos_token_id=(2,))
        runtime.search_ops = ops
        got = runtime._candidates(logits.copy(), flat, running, keep, settings)
        runtime.search_ops = None
        expected = runtime._candidates(logits.copy(), flat, running, keep, settings)
        np.testing.assert_array_equal(got[1], expected[1])
        np.testing.assert_allclose(got[0], expected[0], rtol=1e-6)


def test_topk_keeps_torch_order_with_ties():
    import torch

    from modelshrink.runtime.search import topk as _topk

    rng = np.random.default_rng(0)
    x = rng.integers(-5, 5, size=(6, 3000)).astype(np.float32)  # many ties: lower index first, as torch.topk
    x[0, :] = -np.inf
    x[0, 7] = 0.0
    for k in (1, 8, 12):
        expected = np.argsort(-x, axis=-1, kind="stable")[:, :k]
        np.testing.assert_array_equal(_topk(x, k), expected)
        values = torch.topk(torch.from_numpy(x[1:]), k).values.numpy()
        np.testing.assert_array_equal(np.take_along_axis(x[1:], _topk(x[1:], k), 1), values)


def test_no_repeat_ngram_bans_what_the_loop_bans():
    from modelshrink.runtime import Search
    from modelshrink.runtime.processors import process as _process

    rng = np.random.default_rng(1)
    sequences = rng.integers(0, 4, size=(8, 12))  # a 4-token vocabulary repeats n-grams often
    for n in (2, 3):
        got = _process(np.zeros((8, 6), dtype=np.float32), sequences, Search(no_repeat_ngram_size=n))
        expected = np.zeros((8, 6), dtype=np.float32)
        for row, tokens in enumerate(sequences.tolist()):  # transformers' definition, written out
            prefix = tokens[len(tokens) + 1 - n:]
            for i in range(len(tokens) - n + 1):
                if tokens[i:i + n - 1] == prefix:
                    expected[row, tokens[i + n - 1]] = -np.inf
        np.testing.assert_array_equal(got, expected)
        assert np.isinf(got).any()


def test_runtime_source_length_is_the_smaller_of_tokenizer_and_positions():
    from types import SimpleNamespace

    from modelshrink.runtime.model import ExportedModel

    length = ExportedModel.max_source_length.fget
    assert length(SimpleNamespace(tokenizer_config={"model_max_length": 512},
                                  config={"encoder": {"max_position_embeddings": 24}})) == 24
    assert length(SimpleNamespace(tokenizer_config={"model_max_length": 64},
                                  config={"max_position_embeddings": 1024})) == 64
    assert length(SimpleNamespace(tokenizer_config={}, config={})) == 1024


# every sentence an export recorded as its weights before they were data (git history of steps/export.py)
OLD_WEIGHTS = [
    ("float32", "float32", (), None, "fp32"),
    ("int8 (onnxruntime dynamic)", "int8", (8,), None, "q8"),
    ("int8 (uint8 weights per column: uint8, MatMulNBits or float matmuls)", "int8", (8,), None, "q8"),
    ("int8 (8-bit weights per column: s8, uint8, MatMulNBits or float matmuls)", "int8", (8,), None, "q8"),
    ("int4 (MatMulNBits)", "int4", (4,), None, "q4"),
    ("int4 (MatMulNBits, or float matmuls unpacked at load)", "int4", (4,), None, "q4"),
    ("int8 initializers + DequantizeLinear", "quantized", (), "dequantize_linear", "int8"),
    ("int8 initializers (Cast, Mul by their scales)", "quantized", (), "cast_mul", "int8"),
    ("quantized: 4-bit codes (MatMulNBits, GatherBlockQuantized)", "quantized", (4,), None, "q4"),
    ("quantized: 4-bit codes (MatMulNBits, GatherBlockQuantized) + int8 initializers + DequantizeLinear",
     "quantized", (4,), "dequantize_linear", "q4"),
    ("quantized: 2 and 8-bit codes (MatMulNBits, DynamicQuantizeMatMul or float matmuls; GatherBlockQuantized)",
     "quantized", (2, 8), None, "q4"),
    ("quantized: 8-bit codes (MatMulNBits, uint8 or float matmuls; GatherBlockQuantized) + int8 initializers "
     "(Cast, Mul by their scales)", "quantized", (8,), "cast_mul", "q8"),
    ("quantized: 2 and 4 and 8-bit codes (MatMulNBits, uint8 or float matmuls; GatherBlockQuantized)",
     "quantized", (2, 4, 8), None, "q4"),
]

CURRENT_SENTENCES = {OLD_WEIGHTS[i][0] for i in (0, 3, 5, 6, 7, 11, 12)}  # what the last sentence-writing export wrote


@pytest.mark.parametrize("sentence, kind, widths, initializers, dtype", OLD_WEIGHTS)
def test_weights_recorded_as_a_sentence_by_older_exports_read_as_data(sentence, kind, widths, initializers, dtype):
    from modelshrink.onnx.layout import dtype_of
    from modelshrink.runtime.weights import WeightFormat

    found = WeightFormat.from_recorded(sentence)
    assert (found.kind, found.widths, found.int8_initializers) == (kind, widths, initializers)
    assert dtype_of(found) == dtype  # the transformers.js name the old prefix table gave it
    again = WeightFormat.from_recorded(json.loads(json.dumps(found.recorded())))  # as modelshrink.json holds it
    assert again == found and found.recorded()["description"] == again.description
    if sentence in CURRENT_SENTENCES:
        assert found.description == sentence  # the same sentence as before, now only for people


def test_the_runtime_reads_either_form_of_the_weights_and_refuses_an_unknown_kind_in_one_line(exported, docs_jsonl,
                                                                                                tmp_path):
    import shutil

    from modelshrink.runtime import load
    from modelshrink.runtime.weights import DEQUANTIZE_LINEAR, FLOAT32

    folder = tmp_path / "old"
    shutil.copytree(exported["bart"][1], folder)
    manifest = json.loads((folder / "modelshrink.json").read_text())
    assert manifest["resolved"]["weights"]["kind"] == FLOAT32 and load(folder).weights.kind == FLOAT32
    for recorded, dequantized in (("float32", False), ("int8 initializers + DequantizeLinear", True)):
        manifest["resolved"]["weights"] = recorded  # as an export before the structured form wrote it
        (folder / "modelshrink.json").write_text(json.dumps(manifest))
        model = load(folder)
        assert (model.weights.int8_initializers == DEQUANTIZE_LINEAR) is dequantized
        assert len(model.summarize([DOCUMENTS[0]], max_length=5, num_beams=1)) == 1
    manifest["resolved"]["weights"] = {"kind": "fp8", "widths": [8]}  # a newer export's kind
    (folder / "modelshrink.json").write_text(json.dumps(manifest))
    result = runner.invoke(app, ["run", str(folder), "--input", str(docs_jsonl)])
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert result.exit_code == 1 and len(errors) == 1 and "'fp8'" in errors[0], result.output
