"""`modelshrink export --int4`: MatMulNBits weights that onnxruntime reads as we pack them (or a float matmul on them
unpacked at load); validated; bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import graph_nodes

from modelshrink.artifacts import read_manifest
from modelshrink.cli import app

runner = CliRunner()
FAST = ["--samples", "3", "--generation-docs", "2"]


@pytest.fixture(scope="module")
def int4_exports(plain_models, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("int4")
    for family in ("bart", "t5"):
        result = runner.invoke(app, ["export", str(plain_models[family]), "-o", str(root / family), "--int4",
                                     "--kernel", "nbits", *FAST])
        assert result.exit_code == 0, result.output  # the check passes at the stated int4 tolerance
    return {family: root / family for family in ("bart", "t5")}


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bart", "t5"])
def test_int4_export_stores_matmul_weights_in_four_bits_and_runs(int4_exports, family):
    import onnx
    from onnx import numpy_helper

    from modelshrink.runtime import load

    folder = int4_exports[family]
    manifest = read_manifest(folder)
    assert manifest["resolved"]["weights"]["kind"] == "int4" and manifest["metrics"]["passed"] is True
    assert manifest["resolved"]["int4"]["block_size"] == 32 and manifest["options"]["int4_block_size"] == 32
    assert all(count > 0 for count in manifest["resolved"]["int4"]["matmuls_converted"].values())
    assert all(count > 0 for count in manifest["resolved"]["int4"]["tables_converted"].values())
    float_bytes = packed_bytes = 0
    for name in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        model = onnx.load(str(folder / name))
        assert any(o.domain == "com.microsoft" for o in model.opset_import)
        inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        nodes = graph_nodes(model.graph)
        # every stored tensor is read (a table no matmul shares keeps no packed zero points for one)
        assert set(inits) <= {name for n in nodes for name in n.input}
        int4 = [n for n in nodes if n.op_type == "MatMulNBits"]
        assert int4 and all(inits[n.input[1]].dtype == np.uint8 for n in int4)
        # no MatMul is left with a float weight; the remaining ones multiply activations (attention)
        assert not any(n.op_type == "MatMul" and n.input[1] in inits for n in nodes)
        # word embeddings are looked up from 4-bit codes; no float table is read by a Gather any more
        lookups = [n for n in nodes if n.op_type == "GatherBlockQuantized"]
        vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
        assert lookups and not any(n.op_type == "Gather" and n.input[0] in inits and inits[n.input[0]].shape[0] == vocab
                                   for n in nodes)
        if name == "decoder_model_merged.onnx":  # the tied output projection reads the table's very codes
            assert {n.input[0] for n in lookups} & {n.input[1] for n in int4}
        for weight in {tuple(n.input[1:4]): n for n in int4}.values():
            attrs = {a.name: a.i for a in weight.attribute}
            assert attrs["bits"] == 4 and attrs["block_size"] == 32 and attrs["accuracy_level"] == 4
            float_bytes += attrs["K"] * attrs["N"] * 4
            packed_bytes += sum(inits[i].nbytes for i in weight.input[1:4])
    assert 4 < float_bytes / packed_bytes < 8  # 4 bits a weight, plus a scale and a zero point a block
    report = json.loads((folder / "export_report.json").read_text())["validation"]
    assert report["failure"] is None and "agreement" in report["generation"]
    assert "RMS" in report["tolerance"]
    summaries = load(folder).summarize(["the quick brown fox", "a small library for parsing files"], num_beams=2)
    assert len(summaries) == 2 and all(isinstance(s, str) for s in summaries)


def _reference_rtn(weight: np.ndarray, block: int) -> np.ndarray:
    """Round to nearest with a scale and zero point per block of each column, written out loop by loop."""
    k, n = weight.shape
    out = np.zeros_like(weight)
    for column in range(n):
        for start in range(0, k, block):
            values = weight[start:start + block, column]
            low, high = min(values.min(), 0), max(values.max(), 0)
            scale = np.float32((high - low) / 15)
            zero = np.clip(np.round(-low / scale), 0, 15)
            codes = np.clip(np.round(values / scale + zero), 0, 15)
            out[start:start + block, column] = (codes - zero) * scale
    return out


@pytest.mark.parametrize("k, block, kernel", [(40, 16, "nbits"), (64, 32, "float"), (100, 128, "nbits"),
                                              (100, 128, "float")])
def test_packing_round_trips_and_onnxruntime_reads_it_the_same(tmp_path, k, block, kernel):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from modelshrink.onnx.int4 import dequantize, pack, quantize_blocks, quantize_int4
    from modelshrink.onnx.kernels import KernelChoice

    rng = np.random.default_rng(k)
    weight = rng.standard_normal((k, 24)).astype(np.float32)
    codes, scales, zero_points = quantize_blocks(weight, block)
    unpacked = dequantize(pack(codes), scales, pack(zero_points), k)
    assert np.array_equal(unpacked, _reference_rtn(weight, block))  # k not a multiple of the block: padded
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["b", "s", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 24])],
                              initializer=[numpy_helper.from_array(weight, "w")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    done = quantize_int4(path, block, KernelChoice("model.onnx", kernel))
    assert done["int4_matmuls"] == 1 and done["int4_kernels"] == {kernel: 1}
    a = rng.standard_normal((2, 3, k)).astype(np.float32)
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    exact = a @ unpacked
    if kernel == "float":  # the weight itself, unpacked when the session loads
        assert np.allclose(got, exact, atol=1e-4)
    else:  # activations rounded to int8 per block: well under 2% of the product
        assert np.sqrt(((got - exact) ** 2).mean() / (exact ** 2).mean()) < 0.02


def _refused(args: list[str], out: Path, message: str) -> None:
    result = runner.invoke(app, ["export", *args, "-o", str(out)])
    assert result.exit_code == 1, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists() and not (out.parent / f".{out.name}.partial").exists()


def test_bad_int4_inputs_are_one_line_and_write_nothing(plain_models, tmp_path):
    bart = str(plain_models["bart"])
    _refused([bart, "--int4", "--int8"], tmp_path / "o1", "exclude each other")
    _refused([bart, "--int4", "--int4-block-size", "48"], tmp_path / "o2", "--int4-block-size must be one of")
    _refused([bart, "--int4-block-size", "64"], tmp_path / "o3", "--int4-block-size goes with --int4")
    _refused([bart, "--no-int4-embeddings"], tmp_path / "o5", "--int4-embeddings goes with --int4")
    quantized = tmp_path / "q"
    made = runner.invoke(app, ["quantize", bart, "-o", str(quantized), "--method", "direct"])
    assert made.exit_code == 0, made.output
    _refused([str(quantized), "--int4"], tmp_path / "o4", "exporting a quantized artifact keeps its own bits")


@pytest.mark.slow
def test_float_embeddings_on_request(plain_models, tmp_path):
    import onnx
    from onnx import numpy_helper

    out = tmp_path / "e"
    result = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(out), "--int4", "--no-int4-embeddings",
                                 "--kernel", "nbits", *FAST])
    assert result.exit_code == 0, result.output
    resolved = read_manifest(out)["resolved"]["int4"]
    assert resolved["embeddings"] == "float32" and not any(resolved["tables_converted"].values())
    model = onnx.load(str(out / "decoder_model_merged.onnx"))
    nodes = graph_nodes(model.graph)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert not any(n.op_type == "GatherBlockQuantized" for n in nodes)
    assert any(n.op_type == "Gather" and n.input[0] in inits and inits[n.input[0]].dtype == np.float32 for n in nodes)
    vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    # the tied output projection is a 4-bit matmul weight of its own
    assert any(n.op_type == "MatMulNBits" and {a.name: a.i for a in n.attribute}["N"] == vocab for n in nodes)
