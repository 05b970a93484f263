"""`modelshrink export` of a `quantize` artifact keeps its low bits: ternary weights as base-3 codes, 3-4-bit as
4-bit and 5-8-bit as 8-bit codes (a tied projection sharing its table's codes), and every kernel that computes on
them (MatMulNBits, the uint8 kernel, a float matmul on the codes unpacked at load) reads exactly the quantized
model's values; bad input is one line."""

from __future__ import annotations

import hashlib
import json
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
    from modelshrink.steps.quantize import QuantizeOptions, quantize

    return quantize(QuantizeOptions(model=str(model), bits=bits, method="direct", granularity=granularity,
                                    device="cpu"), out)


def _kernel_weights(folder: Path, tmp_path: Path) -> tuple[list[np.ndarray], list, dict]:
    """Every matmul weight of the export as its kernel reads it once onnxruntime has loaded the graphs (the codes'
    unpacking folded into constants) as [N, K], a row per output; the nodes and initializers of the loaded graphs."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    from modelshrink.onnx.lowbit import unpack

    weights, nodes, inits = [], [], {}
    for name in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC  # folds, fuses nothing
        options.optimized_model_filepath = str(tmp_path / f"loaded-{name}")
        ort.InferenceSession(str(folder / name), options, providers=["CPUExecutionProvider"])
        model = onnx.load(str(tmp_path / f"loaded-{name}"))
        inits.update({i.name: numpy_helper.to_array(i) for i in model.graph.initializer})
        nodes += graph_nodes(model.graph)
    for node in nodes:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: a.i for a in node.attribute}
            assert len(node.input) == 3 and attrs["accuracy_level"] == 4  # symmetric codes, integer products
            codes = unpack(inits[node.input[1]], attrs["bits"], attrs["block_size"]).astype(np.float32)
            scales = inits[node.input[2]].reshape(attrs["N"], -1, 1)
            weights.append(((codes - 2 ** (attrs["bits"] - 1)) * scales).reshape(attrs["N"], -1)[:, :attrs["K"]])
        elif node.op_type in ("DynamicQuantizeMatMul", "MatMulIntegerToFloat"):  # (A, B, [a_scale], b_scale, ...)
            b, scale, zero = (inits[n] for n in (node.input[1:4] if node.op_type == "DynamicQuantizeMatMul" else
                                                 (node.input[1], node.input[3], node.input[5])))
            weights.append(((b.astype(np.float32) - zero.astype(np.float32)) * scale).T)
        elif node.op_type in ("MatMul", "Gemm") and node.input[1] in inits and inits[node.input[1]].ndim == 2:
            transposed = any(a.name == "transB" and a.i for a in node.attribute)  # Gemm: a MatMul + Add fused
            weights.append(inits[node.input[1]] if transposed else inits[node.input[1]].T)
    return weights, nodes, inits


def _digest(value: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(value, dtype=np.float32).tobytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize("family, bits, granularity, kernel", [
    ("bart", "2-2-8", "tensor", "nbits"), ("t5", "2-2-8", "tensor", "int8"), ("bert2bert", "4-4-8", "row", "float"),
    ("bart", "3-8-8", "row", "int8")])  # auto: tests/test_export_kernels.py
def test_low_bits_are_kept_exactly_and_pass_the_check(plain_models, tmp_path, family, bits, granularity, kernel):
    from modelshrink.quant.model import load_quantized

    quantized = _quantized(plain_models[family], tmp_path / "q", bits, granularity)
    out = tmp_path / "onnx"
    result = runner.invoke(app, ["export", str(quantized), "-o", str(out), "--kernel", kernel, *FAST])
    assert result.exit_code == 0, result.output
    manifest = read_manifest(out)
    assert manifest["metrics"]["passed"] is True and manifest["resolved"]["quantized_artifact"] == bits
    width = {"2": 2, "3": 4, "4": 4}.get(bits.split("-")[0], 8)  # 2 bits a ternary weight, 4 for 3-4 bits, else 8
    weights_format = manifest["resolved"]["weights"]
    assert weights_format["kind"] == "quantized" and weights_format["widths"][0] == width
    assert weights_format["description"].startswith(f"quantized: {width}")  # the sentence, for people
    weights, nodes, inits = _kernel_weights(out, tmp_path)
    model = load_quantized(quantized)
    linear = {_digest(m.weight.detach().numpy()) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    # every matmul weight a kernel reads is exactly one of the quantized model's linear weights (alpha * b, bit for bit)
    assert weights and all(_digest(w) in linear for w in weights)
    kinds = {n.op_type for n in nodes}
    # the uint8 kernel rounds its own input, as --int8's (the default --activation-rounding kernel; with none it
    # reads the model's own codes of the input: tests/test_export_kernels.py)
    expected = {"nbits": "MatMulNBits", "int8": "DynamicQuantizeMatMul", "float": "MatMul"}.get(kernel)
    if expected:  # a named kernel computes every low-bit weight
        integer = {"MatMulNBits", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}
        assert expected in kinds and not (integer - {expected}) & kinds
    report = json.loads((out / "export_report.json").read_text())
    stored = report["storage"]["encoder_model.onnx"]
    # (a scale a block of 32 weights at d 32 costs another bit a weight, and the unpacking its constants)
    assert stored["low_bit_matmuls"] > 0 and stored["low_bit_bytes_after"] < stored["low_bit_bytes_before"] * (
        width / 32 + 0.1)
    tables = [n for n in nodes if n.op_type == "GatherBlockQuantized"]
    assert tables and all({a.name: a.i for a in n.attribute}["bits"] in (2, 4, 8) for n in tables)
    assert manifest["metrics"]["generation_agreement"]


@pytest.mark.slow
def test_position_tables_quantized_by_a_rule_are_exported_in_their_bits(plain_models, tmp_path):
    """`positions=8`: the export reads the position tables' 8-bit codes (no float copy left) and passes its check."""
    import onnx

    quantized = _quantized(plain_models["bart"], tmp_path / "q", "4-4-8,positions=8", "row")
    out = tmp_path / "onnx"
    result = runner.invoke(app, ["export", str(quantized), "-o", str(out), *FAST])
    assert result.exit_code == 0, result.output
    assert read_manifest(out)["metrics"]["passed"] is True
    for name in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        graph = onnx.load(str(out / name)).graph
        floats = {i.name for i in graph.initializer if i.data_type == onnx.TensorProto.FLOAT and len(i.dims) == 2}
        assert not any(n.endswith("embed_positions.weight") for n in floats), name
        assert any("embed_positions" in i.name and i.data_type != onnx.TensorProto.FLOAT  # their codes
                   for i in graph.initializer), name


@pytest.mark.slow
def test_a_ternary_export_stores_a_fifth_of_the_bytes_of_an_eight_bit_one(plain_models, tmp_path):
    import onnx
    from onnx import numpy_helper

    def weight_bytes(folder: Path, codes: bool = False) -> int:  # tiny graphs are mostly nodes: the initializers
        return sum(numpy_helper.to_array(i).nbytes for n in ("encoder_model.onnx", "decoder_model_merged.onnx")
                   for i in onnx.load(str(folder / n)).graph.initializer if not codes or i.name.endswith(("_q", "_q3")))

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
    # the codes themselves: a ternary weight's five a byte in base 3 against one a byte (a tied projection shares its
    # table's codes)
    ternary, eight = weight_bytes(tmp_path / "2-2-8-onnx", True), weight_bytes(tmp_path / "8-8-8-onnx", True)
    assert 0.2 * eight <= ternary <= 0.201 * eight
    # at d 32 a block holds 32 weights, so its float scale costs another bit a weight; positions and norms are float
    assert sizes["2-2-8"] < 0.6 * sizes["8-8-8"]


@pytest.mark.slow
def test_an_onnxruntime_without_the_ops_is_one_line_and_writes_nothing(plain_models, tmp_path, monkeypatch):
    from onnxruntime.capi import onnxruntime_pybind11_state

    quantized = _quantized(plain_models["bart"], tmp_path / "q", "2-2-8")
    monkeypatch.setattr(onnxruntime_pybind11_state, "get_all_operator_schema", lambda: [])
    for args, message in (([str(quantized)], "exporting a 2-2-8 artifact needs onnxruntime's GatherBlockQuantized"),
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


@pytest.mark.parametrize("kernel", ["nbits", "int8", "float"])
def test_packing_at_two_four_and_eight_bits_is_what_onnxruntime_reads(tmp_path, kernel):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from modelshrink.onnx.lowbit import DOMAIN, integer_blocks, pack, unpack
    from modelshrink.onnx.lowbit_graph import LowBitGraph

    rng = np.random.default_rng(0)
    # (bits the kernel reads, bits stored): a ternary weight read by 4-bit kernels is stored in 2 bits
    for bits, stored in ((2, 2), (4, 4), (8, 8), (4, 2)):
        top = 2 ** (stored - 1) - 1
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
        assert rewrite.as_tied(table, tied, blocks, kernel, stored) == 1
        rewrite.finish()
        assert {o.domain for o in model.opset_import} >= {DOMAIN}
        # the codes (and their scales) stored once, `stored` bits a code (a ternary weight's five a byte in base 3):
        # the lookup and the matmul read those bytes
        codes = [i for i in model.graph.initializer if i.name.endswith(("_q", "_q3"))]
        assert [list(i.dims) for i in codes] == ([[-(-10 * 3 * 16 // 5)]] if stored == 2 else [[10, 3, 16 * stored // 8]])
        # one scale a column, not one a block: the three blocks of a column share it
        scales = [i for i in model.graph.initializer if i.name.endswith("scales")]
        assert [list(i.dims) for i in scales] == [[10]]
        assert rewrite.summary("x")["x_widths"] == [stored]
        path = tmp_path / f"m{bits}-{stored}.onnx"
        onnx.save(model, str(path))
        a, ids = rng.standard_normal((3, 48)).astype(np.float32), np.array([[0, 9], [3, 3]])
        y, e = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"a": a, "ids": ids})
        exact = a @ (b * scale)
        # float: the weight itself; the integer kernels round the activations to 8 bits (well under 2% here)
        error = np.sqrt(((y - exact) ** 2).mean() / (exact ** 2).mean())
        assert error < (1e-6 if kernel == "float" else 0.02), error
        assert np.array_equal(e, (b * scale).T[ids])


@pytest.mark.parametrize("kernel", ["nbits", "float"])
def test_a_scale_a_column_is_stored_once_beside_zero_points(tmp_path, kernel):
    """Blocks with zero points (--int4's) whose blocks in a column share one scale: the scale is stored once a
    column, the zero points a block, and the kernels read the very weight the blocks hold."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from modelshrink.onnx.lowbit import Blocks
    from modelshrink.onnx.lowbit_graph import LowBitGraph

    rng = np.random.default_rng(2)
    codes = rng.integers(0, 16, (6, 3, 16)).astype(np.uint8)
    scales = np.repeat(rng.random((6, 1)).astype(np.float32) + 0.5, 3, axis=1)
    blocks = Blocks(codes, scales, rng.integers(0, 16, (6, 3)).astype(np.uint8), 4, 40)  # K 40: padded to 48
    weight = blocks.weight()
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 40])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])],
                              initializer=[numpy_helper.from_array(weight.astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    rewrite = LowBitGraph(model)
    assert rewrite.as_matmul(model.graph.initializer[0], blocks, kernel=kernel) == 1
    rewrite.finish()
    stored = {i.name: list(i.dims) for i in model.graph.initializer}
    assert stored["w_column_scales"] == [6] and "w_scales" not in stored and stored["w_zero_points"] == [12]
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    a = rng.standard_normal((2, 40)).astype(np.float32)
    y = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    exact = a @ weight
    error = np.sqrt(((y - exact) ** 2).mean() / (exact ** 2).mean())
    assert error < (1e-6 if kernel == "float" else 0.02), error


def test_the_scales_of_packed_codes_stay_float(tmp_path):
    """A per-row scale repeated over a row's blocks looks like an integer weight itself; compact_quantized must
    leave it to the ops that read it (it once stored it as int8 too)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from modelshrink.onnx.compress import compact_quantized, keep_low_bits
    from modelshrink.onnx.kernels import KernelChoice

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
    kept = keep_low_bits(path, {1}, KernelChoice("model.onnx", "float"))
    assert kept["low_bit_tables"] == 1 and kept["low_bit_matmuls"] == 1
    assert compact_quantized(path, {1})["int8_initializers"] == 0
    import onnxruntime as ort

    y = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": np.array([[0, 5]])})[0]
    assert np.allclose(y, table[[0, 5]] @ table.T, atol=1e-3)


@pytest.mark.slow
def test_an_activation_clip_is_exported_and_passes_the_check(plain_models, tmp_path):
    """A quantize artifact made with --activation-clip: the clamp is in the graphs (Clip at ±2.5 before the
    roundings) and the export matches the quantized PyTorch model."""
    import onnx
    from onnx import numpy_helper

    from modelshrink.steps.quantize import QuantizeOptions, quantize

    quantized = quantize(QuantizeOptions(model=str(plain_models["bart"]), bits="8-8-8", method="direct",
                                         activation_clip=2.5, device="cpu"), tmp_path / "q")
    out = tmp_path / "onnx"
    result = runner.invoke(app, ["export", str(quantized), "-o", str(out), *FAST])
    assert result.exit_code == 0, result.output
    assert read_manifest(out)["metrics"]["passed"] is True
    graph = onnx.load(str(out / "encoder_model.onnx")).graph
    constants = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    constants.update({n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node
                      if n.op_type == "Constant" and n.attribute and n.attribute[0].HasField("t")})
    bounds = [float(constants[n.input[2]]) for n in graph.node
              if n.op_type == "Clip" and len(n.input) == 3 and n.input[2] in constants]
    assert bounds.count(2.5) >= 4  # each linear input and q/k/v output of the encoder
