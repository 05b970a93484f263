"""`modelshrink export` of a `quantize` artifact keeps its low bits: ternary and 3-4-bit weights as 4-bit codes
(MatMulNBits, GatherBlockQuantized, a tied projection sharing its table's codes) that hold exactly the quantized
model's values; 5-8 bits stay int8; bad input is one line."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import graph_nodes

from modelshrink.artifacts import read_manifest
from modelshrink.cli import app

runner = CliRunner()
FAST = ["--samples", "3", "--generation-docs", "2"]


def _quantized(model: Path, out: Path, bits: str, granularity: str = "tensor") -> Path:
    from modelshrink.quantize import QuantizeOptions, quantize

    return quantize(QuantizeOptions(model=str(model), bits=bits, method="direct", granularity=granularity,
                                    device="cpu"), out)


def _decoded(folder: Path) -> tuple[list[np.ndarray], list, dict]:
    """Every low-bit weight of the export as the ops compute it ([N, K], a row per output), the nodes, inits."""
    import onnx
    from onnx import numpy_helper

    from modelshrink.onnx.lowbit import unpack

    weights, nodes, inits = [], [], {}
    for name in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        model = onnx.load(str(folder / name))
        inits.update({i.name: numpy_helper.to_array(i) for i in model.graph.initializer})
        nodes += graph_nodes(model.graph)
    for node in nodes:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: a.i for a in node.attribute}
            assert attrs["bits"] == 4 and len(node.input) == 3  # codes b + 8 under the default zero point
            codes = unpack(inits[node.input[1]], 4, attrs["block_size"]).astype(np.float32)
            scales = inits[node.input[2]].reshape(attrs["N"], -1, 1)
            weights.append(((codes - 8) * scales).reshape(attrs["N"], -1)[:, :attrs["K"]])
    return weights, nodes, inits


def _digest(value: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(value, dtype=np.float32).tobytes()).hexdigest()


@pytest.mark.parametrize("family, bits, granularity", [("bart", "2-2-8", "tensor"), ("t5", "2-2-8", "tensor"),
                                                       ("bert2bert", "4-4-8", "row"), ("bart", "3-8-8", "row")])
def test_low_bits_are_kept_exactly_and_pass_the_check(plain_models, tmp_path, family, bits, granularity):
    from modelshrink.quant.model import load_quantized

    quantized = _quantized(plain_models[family], tmp_path / "q", bits, granularity)
    out = tmp_path / "onnx"
    result = runner.invoke(app, ["export", str(quantized), "-o", str(out), *FAST])
    assert result.exit_code == 0, result.output
    manifest = read_manifest(out)
    assert manifest["metrics"]["passed"] is True and manifest["resolved"]["quantized_artifact"] == bits
    assert manifest["resolved"]["weights"].startswith("quantized: 4-bit codes")
    weights, nodes, inits = _decoded(out)
    model = load_quantized(quantized)
    linear = {_digest(m.weight.detach().numpy()) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    # every packed matmul weight is exactly one of the quantized model's linear weights (alpha * b, bit for bit)
    assert weights and all(_digest(w) in linear for w in weights)
    if bits.split("-")[0] in ("2", "3", "4"):  # no float matmul weight is left behind
        assert not any(n.op_type == "MatMul" and n.input[1] in inits and inits[n.input[1]].dtype == np.float32
                       for n in nodes)
    tables = [n for n in nodes if n.op_type == "GatherBlockQuantized"]
    if bits.split("-")[1] in ("2", "4"):
        # the word embeddings are looked up from 4-bit codes, and the tied output projection reads the same codes
        assert tables and {n.input[0] for n in tables} & {n.input[1] for n in nodes if n.op_type == "MatMulNBits"}
    else:  # 8-bit embeddings stay int8, scaled back to float by a Cast and a Mul
        assert not tables and manifest["resolved"]["weights"].endswith("int8 initializers (Cast, Mul by their scales)")
    report = manifest["metrics"]
    assert report["generation_agreement"]


def test_a_ternary_export_is_about_half_the_size_of_the_int8_one(plain_models, tmp_path):
    import onnx
    from onnx import numpy_helper

    def weight_bytes(folder: Path, dtype=None) -> int:  # tiny graphs are mostly nodes, so count the initializers
        return sum(a.nbytes for n in ("encoder_model.onnx", "decoder_model_merged.onnx")
                   for a in map(numpy_helper.to_array, onnx.load(str(folder / n)).graph.initializer)
                   if dtype is None or a.dtype == dtype)

    sizes = {}
    for bits in ("2-2-8", "8-8-8"):
        quantized = _quantized(plain_models["bart"], tmp_path / bits, bits)
        result = runner.invoke(app, ["export", str(quantized), "-o", str(tmp_path / f"{bits}-onnx"), "--no-validate",
                                     "--quiet"])
        assert result.exit_code == 0, result.output
        assert result.output.strip() == str(tmp_path / f"{bits}-onnx")  # --quiet: the path alone
        sizes[bits] = weight_bytes(tmp_path / f"{bits}-onnx")
    float_export = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(tmp_path / "f"), "--no-validate"])
    assert float_export.exit_code == 0
    assert sizes["8-8-8"] < 0.4 * weight_bytes(tmp_path / "f")
    # the weights themselves: half a byte each against one (the tied projection shares its table's codes in both)
    codes, int8 = weight_bytes(tmp_path / "2-2-8-onnx", np.uint8), weight_bytes(tmp_path / "8-8-8-onnx", np.int8)
    assert 0.45 * int8 < codes <= 0.5 * int8
    # at d 32 a block holds 32 weights, so its float scale costs another quarter; positions and norms are float
    assert sizes["2-2-8"] < 0.75 * sizes["8-8-8"]


def test_an_onnxruntime_without_the_ops_is_one_line_and_writes_nothing(plain_models, tmp_path, monkeypatch):
    from onnxruntime.capi import onnxruntime_pybind11_state

    quantized = _quantized(plain_models["bart"], tmp_path / "q", "2-2-8")
    monkeypatch.setattr(onnxruntime_pybind11_state, "get_all_operator_schema", lambda: [])
    for args, message in (([str(quantized)], "exporting a 2-2-8 artifact (4-bit codes) needs onnxruntime's "
                                             "MatMulNBits and GatherBlockQuantized"),
                          ([str(plain_models["bart"]), "--int4"], "--int4 needs onnxruntime's")):
        out = tmp_path / "o"
        result = runner.invoke(app, ["export", *args, "-o", str(out)])
        assert result.exit_code == 1, result.output
        assert message in result.output and "--int8" in result.output
        assert len(result.output.strip().splitlines()) == 1
        assert not out.exists() and not (tmp_path / ".o.partial").exists()
    # --int8 does not need them
    result = runner.invoke(app, ["export", str(quantized), "-o", str(tmp_path / "i8"), "--int8", "--no-validate"])
    assert result.exit_code == 0, result.output


def test_packing_at_two_four_and_eight_bits_is_what_onnxruntime_reads(tmp_path):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from modelshrink.onnx.lowbit import DOMAIN, LowBitGraph, integer_blocks, pack, unpack

    rng = np.random.default_rng(0)
    for bits in (2, 4, 8):
        top = 2 ** (bits - 1) - 1
        b = rng.integers(-top, top + 1, (48, 10)).astype(np.int8)
        scale = rng.random(10).astype(np.float32) + 0.5
        blocks = integer_blocks(b, scale, bits, 16)
        assert np.array_equal(unpack(pack(blocks.codes, bits), bits, 16), blocks.codes)
        assert np.array_equal(blocks.weight(), b * scale)  # exact: small integers times a float
        graph = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"]),
                                   helper.make_node("Gather", ["t", "ids"], ["e"], axis=0)], "g",
                                  [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, 48]),
                                   helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 2])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 10]),
                                   helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 2, 48])],
                                  initializer=[numpy_helper.from_array((b * scale).astype(np.float32), "w"),
                                               numpy_helper.from_array((b * scale).T.astype(np.float32).copy(), "t")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        rewrite = LowBitGraph(model)
        tied = [i for i in model.graph.initializer if i.name == "w"]
        table = [i for i in model.graph.initializer if i.name == "t"][0]
        assert rewrite.as_tied(table, tied, blocks) == 1
        rewrite.finish()
        assert {o.domain for o in model.opset_import} >= {DOMAIN} and len(model.graph.initializer) == 4
        path = tmp_path / f"m{bits}.onnx"
        onnx.save(model, str(path))
        a, ids = rng.standard_normal((3, 48)).astype(np.float32), np.array([[0, 9], [3, 3]])
        y, e = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"a": a, "ids": ids})
        assert np.allclose(y, a @ (b * scale), atol=1e-4) and np.array_equal(e, (b * scale).T[ids])


def test_the_scales_of_packed_codes_stay_float(tmp_path):
    """A per-row scale repeated over a row's blocks looks like an integer weight itself; compact_quantized must
    leave it to the ops that read it (it once stored it as int8 too)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from modelshrink.onnx.compress import compact_quantized, keep_low_bits

    rng = np.random.default_rng(1)
    alpha = (rng.random((6, 1)) + 0.5).astype(np.float32)
    table = (rng.integers(-1, 2, (6, 768)) * alpha).astype(np.float32)  # ternary, one scale a row: 3 blocks of 256
    graph = helper.make_graph([helper.make_node("Gather", ["t", "ids"], ["e"], axis=0),
                               helper.make_node("MatMul", ["e", "head"], ["y"])], "g",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 6])],
                              initializer=[numpy_helper.from_array(table, "t"),
                                           numpy_helper.from_array(table.T.copy(), "head")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    kept = keep_low_bits(path, {1})
    assert kept["low_bit_tables"] == 1 and kept["low_bit_matmuls"] == 1
    assert compact_quantized(path, {1})["int8_initializers"] == 0
    import onnxruntime as ort

    y = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": np.array([[0, 5]])})[0]
    assert np.allclose(y, table[[0, 5]] @ table.T, atol=1e-3)
