"""`modelshrink export`: every family exports and validates; int8; quantized artifacts stay small; bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import build
from modelshrink.artifacts import read_manifest, verify_files
from modelshrink.cli import app

runner = CliRunner()
FAST = ["--samples", "3", "--generation-docs", "2"]


@pytest.fixture(scope="module")
def exports(plain_models, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("exports")
    out = {}
    for family, path in plain_models.items():
        result = runner.invoke(app, ["export", str(path), "-o", str(root / family), *FAST])
        assert result.exit_code == 0, result.output
        out[family] = root / family
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bart", "t5", "bert2bert"])
def test_every_family_exports_a_complete_validated_folder(exports, family):
    folder = exports[family]
    for name in ("encoder_model.onnx", "decoder_model_merged.onnx", "search_ops.onnx", "config.json",
                 "generation_config.json", "tokenizer.json", "README.md", "export_report.json"):
        assert (folder / name).is_file(), name
    assert not (folder / "decoder_model.onnx").exists() and not (folder / "decoder_with_past_model.onnx").exists()
    manifest = read_manifest(folder)
    assert manifest["step"] == "export" and manifest["metrics"]["passed"] is True
    assert manifest["metrics"]["max_abs_diff"] < 1e-4
    assert verify_files(folder) == []
    report = json.loads((folder / "export_report.json").read_text())["validation"]
    assert report["generation"]["equal"] and report["generation"]["agreement"] == "4/4"
    # the float bound: 1e-4 where an output's magnitude is at most 1, a share of it above (a real-size model's
    # logits reach the hundreds); every output was held to it
    assert report["tolerance"] == "0.0001 x max(1, each output's largest magnitude)"
    assert all(e["passed"] and e["max_abs_diff"] <= 1e-4 * max(1.0, e["reference_max_abs"])
               for e in report["outputs"].values())
    assert "decoder_model_merged.onnx[with past]:logits" in report["outputs"]
    assert "decoder_model_merged.onnx[first step]:present.0.encoder.key" in report["outputs"]


@pytest.mark.slow
def test_dynamic_axes_and_optimum_names(exports):
    import onnxruntime as ort

    session = ort.InferenceSession(str(exports["bart"] / "decoder_model_merged.onnx"))
    inputs = {i.name: i.shape for i in session.get_inputs()}
    assert inputs["input_ids"][:2] == ["batch", "target"] and inputs["use_cache_branch"] == [1]
    assert inputs["encoder_hidden_states"][:2] == ["batch", "source"]
    assert inputs["past_key_values.0.decoder.key"][2] == "past"
    assert inputs["past_key_values.1.encoder.value"][2] == "source"
    assert [o.name for o in session.get_outputs()][:2] == ["logits", "present.0.decoder.key"]


@pytest.mark.slow
def test_merged_decoder_stores_each_weight_once_and_matches_the_separate_pair(plain_models, exports, tmp_path):
    import onnx
    from onnx import numpy_helper

    from modelshrink.runtime import load

    result = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(tmp_path / "pair"), "--no-merge",
                                 *FAST])
    assert result.exit_code == 0, result.output
    pair, merged = tmp_path / "pair", exports["bart"]
    assert (pair / "decoder_model.onnx").is_file() and (pair / "decoder_with_past_model.onnx").is_file()
    assert not (pair / "decoder_model_merged.onnx").exists()

    def weight_bytes(*paths: Path) -> int:
        return sum(numpy_helper.to_array(i).nbytes for p in paths for i in onnx.load(str(p)).graph.initializer)

    first, with_past = weight_bytes(pair / "decoder_model.onnx"), weight_bytes(pair / "decoder_with_past_model.onnx")
    assert weight_bytes(merged / "decoder_model_merged.onnx") <= 1.05 * max(first, with_past)
    report = json.loads((merged / "export_report.json").read_text())
    assert report["storage"]["merged"]["shared"] > 0
    # BART's output projection is tied to the embedding table: the float graph stores the table once
    assert report["storage"]["decoder_model_merged.onnx"]["tied"] == 1
    docs = ["the quick brown fox", "a small library for parsing files and more words"]
    assert load(merged).summarize(docs, num_beams=3) == load(pair).summarize(docs, num_beams=3)


def test_classifier_exports_and_predictions_agree(classifier_path, tmp_path):
    result = runner.invoke(app, ["export", str(classifier_path), "-o", str(tmp_path / "clf"), *FAST])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "clf" / "model.onnx").is_file()
    report = json.loads((tmp_path / "clf" / "export_report.json").read_text())["validation"]
    assert report["predictions"]["equal"] and report["max_abs_diff"] < 1e-4
    # not only the export's word for it: the runtime's logits are PyTorch's
    from modelshrink.models.loading import load_classifier
    from modelshrink.runtime import load

    model, tok = load_classifier(str(classifier_path))
    texts = ["the quick brown fox", "a small library for parsing files and more words", "x"]
    with torch.no_grad():
        expected = model(**tok(texts, padding=True, return_tensors="pt")).logits.numpy()
    np.testing.assert_allclose(load(tmp_path / "clf").logits(texts), expected, atol=1e-4)


def test_classifier_int8_exports_with_integer_tables(classifier_path, tmp_path):
    import numpy as np
    import onnx
    from onnx import numpy_helper

    result = runner.invoke(app, ["export", str(classifier_path), "-o", str(tmp_path / "c8"), "--int8", *FAST])
    assert result.exit_code == 0, result.output
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(tmp_path / "c8" / "model.onnx")).graph.initializer}
    assert any(v.dtype == np.int8 and v.ndim == 2 for v in inits.values())  # the embedding tables
    report = json.loads((tmp_path / "c8" / "export_report.json").read_text())["validation"]
    assert report["failure"] is None and "agreement" in report["predictions"]


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["nbits", "float"])
def test_int8_weights_on_the_other_kernels_are_the_same_uint8_codes_per_column(plain_models, tmp_path, kernel):
    import onnx
    from onnx import numpy_helper

    from modelshrink.onnx import lowbit
    from modelshrink.runtime import load

    out = tmp_path / kernel
    result = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(out), "--int8", "--kernel", kernel,
                                 *FAST])
    assert result.exit_code == 0, result.output  # validated at --int8's tolerance
    report = json.loads((out / "export_report.json").read_text())
    storage = report["storage"]["encoder_model.onnx"]
    assert storage["int8_kernels"] == {kernel: storage["int8_matmuls"]} and storage["int8_widths"] == [8]
    graph = onnx.load(str(out / "encoder_model.onnx")).graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    assert not any(n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul") for n in graph.node)
    assert not any(v.dtype == np.float32 and v.ndim == 2 and v.size >= 256 for v in inits.values())  # no float matrix
    if kernel == "nbits":
        nodes = [n for n in graph.node if n.op_type == "MatMulNBits"]
        assert len(nodes) == storage["int8_matmuls"] and nodes
        for node in nodes:
            attrs = {a.name: a.i for a in node.attribute}
            assert attrs["bits"] == 8 and attrs["accuracy_level"] == lowbit.ACCURACY_INT8
            scales = inits[node.input[2]].reshape(attrs["N"], -1)
            zero = inits[node.input[3]].reshape(attrs["N"], -1)
            # one scale and zero point a column, as the uint8 kernel's (every block of a column repeats them)
            assert (scales == scales[:, :1]).all() and (zero == zero[:, :1]).all()
    texts = ["a b c d", "e f g h i j"]
    assert len(load(out).summarize(texts, max_length=5, num_beams=1)) == 2


@pytest.mark.slow
def test_int8_export_measures_its_kernels_and_records_the_choice(plain_models, tmp_path):
    out = tmp_path / "auto"
    result = runner.invoke(app, ["export", str(plain_models["t5"]), "-o", str(out), "--int8", *FAST])
    assert result.exit_code == 0, result.output
    storage = json.loads((out / "export_report.json").read_text())["storage"]
    for name in ("encoder_model.onnx", "decoder_with_past_model.onnx"):
        assert storage[name]["kernels"]["kernel"] == "auto" and storage[name]["kernels"]["measured"]
        assert sum(storage[name]["int8_kernels"].values()) == storage[name]["int8_matmuls"] > 0
    assert "int8: " in result.output and "matmuls" in result.output


@pytest.mark.slow
def test_int8_export_is_per_channel_validated_and_runs(plain_models, tmp_path):
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from modelshrink.runtime import load

    # the uint8 kernel named: onnxruntime's dynamic quantization writes its graphs (auto may take MatMulNBits below)
    result = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(tmp_path / "int8"), "--int8",
                                 "--kernel", "int8", *FAST])
    assert result.exit_code == 0, result.output  # the check passes at the stated int8 tolerance
    manifest = read_manifest(tmp_path / "int8")
    assert manifest["resolved"]["weights"]["kind"] == "int8" and manifest["options"]["per_channel"] is True
    graph = onnx.load(str(tmp_path / "int8" / "decoder_model_merged.onnx")).graph
    if_node = next(n for n in graph.node if n.op_type == "If")
    nodes = [n for branch in if_node.attribute for n in branch.g.node]  # the If's two branches
    assert any(n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul") for n in nodes)
    # one weight scale per output column: the default, because per-tensor scales moved the MiniLM teacher's
    # logits by 26% (RMS) against 10% per channel
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    weights = {n.input[1] for n in nodes if n.op_type == "MatMulInteger"} & set(inits)
    assert weights and all(inits[w].dtype == np.uint8 for w in weights)
    scales = [inits[n.input[3]] for n in nodes if n.op_type == "MatMulInteger" and n.input[3] in inits]
    assert scales == [] or all(s.size > 1 for s in scales)
    per_column = [v for k, v in inits.items() if k.endswith("_scale") and v.ndim == 1 and v.size > 1]
    assert per_column
    # the embedding tables are int8 too, with one scale per row (gathered beside the rows)
    gathers = [n for n in nodes if n.op_type == "Gather" and n.input[0] in inits]
    tables = [inits[n.input[0]] for n in gathers if inits[n.input[0]].ndim == 2]
    assert tables and all(t.dtype == np.int8 for t in tables)
    row_scales = [inits[n.input[0]] for n in gathers if n.input[0].endswith("_row_scale")]
    assert row_scales and all(r.dtype == np.float32 and r.ndim == 1 for r in row_scales)
    assert not any(i.dtype == np.float32 and i.ndim == 2 and i.size >= 256 for i in inits.values())  # no float matrix
    # unsigned weights: signed per-channel weights clip int16 sums on CPUs without VNNI (logits 31% RMS off)
    outputs = json.loads((tmp_path / "int8" / "export_report.json").read_text())["validation"]["outputs"]
    assert max(o["rms_ratio"] for o in outputs.values()) < 0.1
    summaries = load(tmp_path / "int8").summarize(["the quick brown fox", "a small library"])
    assert len(summaries) == 2 and all(isinstance(s, str) for s in summaries)
    per_tensor = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(tmp_path / "int8-pt"), "--int8",
                                     "--no-per-channel", "--no-validate"])
    assert per_tensor.exit_code == 0, per_tensor.output
    assert read_manifest(tmp_path / "int8-pt")["options"]["per_channel"] is False
    assert len(load(tmp_path / "int8-pt").summarize(["the quick brown fox"])) == 1


def test_padded_source_positions_are_not_compared():
    import numpy as np
    import torch

    from modelshrink.onnx.validate import _compare

    mask = np.array([[1, 1, 1], [1, 1, 0]])
    hidden = torch.ones(2, 3, 4)
    got = hidden.numpy().copy()
    got[1, 2] = 50.0  # padding: never read again, and int8 moves it most
    keys = torch.ones(2, 2, 3, 4)
    got_keys = keys.numpy().copy()
    got_keys[1, :, 2] = 50.0
    logits = torch.ones(2, 1, 5)
    got_logits = logits.numpy().copy()
    got_logits[1, 0, 0] = 1.5
    diffs = {}
    _compare("g", [hidden, keys, logits], [got, got_keys, got_logits],
             ["last_hidden_state", "present.0.encoder.key", "logits"], diffs, mask)
    assert diffs["g:last_hidden_state"]["max_abs_diff"] == 0 and diffs["g:present.0.encoder.key"]["max_abs_diff"] == 0
    assert diffs["g:logits"]["max_abs_diff"] == 0.5
    got[0, 1, 0] = 3.0  # a real position still counts
    _compare("g", [hidden], [got], ["last_hidden_state"], diffs, mask)
    assert diffs["g:last_hidden_state"]["max_abs_diff"] == 2.0


@pytest.mark.slow
def test_quantized_artifact_keeps_integer_weights(plain_models, tmp_path):
    from modelshrink.steps.quantize import QuantizeOptions, quantize

    quantized = quantize(QuantizeOptions(model=str(plain_models["bart"]), bits="2-2-8", method="direct",
                                         device="cpu"), tmp_path / "q")
    plain = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(tmp_path / "float"), "--no-validate"])
    result = runner.invoke(app, ["export", str(quantized), "-o", str(tmp_path / "q-onnx"), *FAST])
    assert plain.exit_code == 0 and result.exit_code == 0, result.output
    report = json.loads((tmp_path / "q-onnx" / "export_report.json").read_text())
    assert report["storage"]["encoder_model.onnx"]["low_bit_matmuls"] >= 8  # 4-bit codes (test_export_lowbit.py)
    import onnx
    from onnx import numpy_helper

    def weight_bytes(folder: Path) -> int:  # tiny graphs are mostly nodes, so count the initializers
        return sum(numpy_helper.to_array(i).nbytes for n in report["graphs"]
                   for i in onnx.load(str(folder / n)).graph.initializer)

    assert weight_bytes(tmp_path / "q-onnx") < 0.4 * weight_bytes(tmp_path / "float")
    assert report["validation"]["failure"] is None and "agreement" in report["validation"]["generation"]
    # --int8 on a quantize artifact: onnxruntime's integer matmuls instead of DequantizeLinear (which they
    # cannot load behind); the weights stay 8-bit
    int8 = runner.invoke(app, ["export", str(quantized), "-o", str(tmp_path / "q-int8"), "--int8", *FAST])
    assert int8.exit_code == 0, int8.output
    assert read_manifest(tmp_path / "q-int8")["resolved"]["weights"]["kind"] == "int8"
    assert weight_bytes(tmp_path / "q-int8") < 0.4 * weight_bytes(tmp_path / "float")


@pytest.mark.slow
def test_outputs_beyond_atol_exit_3_after_writing_the_report(plain_models, tmp_path):
    out = tmp_path / "strict"
    result = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(out), "--atol", "1e-12",
                                 "--generation-docs", "0"])
    assert result.exit_code == 3, result.output
    assert str(out) in result.stdout
    assert (out / "export_report.json").is_file() and read_manifest(out)["metrics"]["passed"] is False
    assert "differ from PyTorch" in result.output
    assert json.loads((out / "export_report.json").read_text())["validation"]["tolerance"] == 1e-12  # as given


def _refused(args: list[str], out: Path, message: str) -> None:
    result = runner.invoke(app, ["export", *args, "-o", str(out)])
    assert result.exit_code == 1, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (out.parent / f".{out.name}.partial").exists()


def test_bad_inputs_are_one_line_and_write_nothing(plain_models, docs_jsonl, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    eval_like = tmp_path / "an-eval"
    eval_like.mkdir()
    (eval_like / "modelshrink.json").write_text(json.dumps({"kind": "eval", "step": "eval"}))
    _refused([str(eval_like)], tmp_path / "o1", "is not a model")
    _refused([str(docs_jsonl)], tmp_path / "o2", "is a file")
    gpt = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)).save_pretrained(gpt)
    _refused([str(gpt)], tmp_path / "o3", "no export path")
    bare = tmp_path / "no-tokenizer"
    model, _ = build("bart", wide=False)
    model.save_pretrained(bare)
    _refused([str(bare)], tmp_path / "o4", "tokenizer")
    assert not (tmp_path / "o4").exists()
    _refused([str(plain_models["bart"]), "--opset", "9"], tmp_path / "o5", "--opset")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "file").write_text("x")
    _refused([str(plain_models["bart"])], taken, "already exists")


def test_embedding_tables_are_int8_with_one_scale_per_row(tmp_path):
    """A table with one row 100x larger than the others: per-row scales keep every small row to within half
    its own step (one scale per table would round all of them to zero)."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from modelshrink.onnx.int8 import quantize_embeddings

    rng = np.random.default_rng(0)
    table = rng.standard_normal((50, 8)).astype(np.float32) * 0.02
    table[7] *= 100
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0)], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
                              [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["b", "s", 8])],
                              initializer=[numpy_helper.from_array(table, "table")])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    assert quantize_embeddings(path) == 1
    model = onnx.load(str(path))
    assert {numpy_helper.to_array(i).dtype for i in model.graph.initializer if i.name.startswith("table")} == \
        {np.dtype(np.int8), np.dtype(np.float32), np.dtype(np.int64)}
    ids = np.array([[0, 7, 3], [49, 7, 1]])
    got = ort.InferenceSession(str(path)).run(None, {"ids": ids})[0]
    step = np.abs(table).max(axis=1) / 127
    assert np.all(np.abs(got - table[ids]) <= step[ids][..., None] / 2 + 1e-7)
