"""Which kernel computes each low-bit weight of an export (`modelshrink.onnx.kernels`): chosen by measurement or
named with --kernel, reading the model's own activation codes (uint8 kernel) or the unrounded activations (where
the kernel rounds them itself), unpacked once when a merged
decoder loads; a runtime without a kernel's op is one line naming the export option that avoids it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import graph_nodes

from modelshrink.cli import app
from modelshrink.onnx import kernels
from modelshrink.onnx.kernels import KernelChoice

runner = CliRunner()
FAST = ["--samples", "3", "--generation-docs", "2"]


def _quantized(model: Path, out: Path, bits: str) -> Path:
    from modelshrink.steps.quantize import QuantizeOptions, quantize

    return quantize(QuantizeOptions(model=str(model), bits=bits, method="direct", device="cpu"), out)


@pytest.fixture(scope="module")
def ternary(plain_models, tmp_path_factory) -> Path:
    return _quantized(plain_models["bart"], tmp_path_factory.mktemp("kernels") / "q", "2-2-8")


@pytest.fixture(scope="module")
def ternary_int8(ternary, tmp_path_factory) -> Path:
    """The ternary artifact exported with the uint8 kernel on the model's own codes of its inputs
    (MatMulIntegerToFloat), unchecked (the tests below read its graphs)."""
    out = tmp_path_factory.mktemp("kernels-int8") / "onnx"
    result = runner.invoke(app, ["export", str(ternary), "-o", str(out), "--kernel", "int8", "--activation-rounding",
                                 "none", "--no-validate"])
    assert result.exit_code == 0, result.output
    return out


def test_the_choice_is_the_smallest_geometric_mean_of_the_measured_times(monkeypatch):
    # nbits is fastest at few rows, int8 at many: the geometric mean weighs the two row counts alike
    times = {"nbits/2": {4: 1.0, 64: 12.0}, "nbits/4": {4: 0.5, 64: 20.0}, "s8/2": {4: 2.5, 64: 5.0},
             "int8/2": {4: 2.0, 64: 4.0}, "float/2": {4: 3.0, 64: 8.0}}
    calls = []

    def fake(k, n, candidates, rows, block_size, zero_points=False, threads=None):
        calls.append((k, n, rows))
        return {f"{kernel}/{bits}": times[f"{kernel}/{bits}"] for kernel, bits in candidates}

    monkeypatch.setattr(kernels, "measure", fake)
    choice = KernelChoice("decoder_with_past_model.onnx")
    candidates = kernels.candidates_for(1)
    # sqrt(2·4) < sqrt(1·12) < sqrt(2.5·5) < sqrt(3·8) < sqrt(0.5·20)
    assert choice.choose(768, 768, candidates, 256) == ("int8", 2)
    assert choice.choose(768, 768, candidates, 256) == ("int8", 2) and len(calls) == 1  # one measurement a shape
    assert calls == [(768, 768, (4, 64))]
    report = choice.report()["measured"]
    (entry,) = report.values()
    assert entry["chosen"] == "int8/2" and entry["ms"]["nbits/4"] == {"4": 500.0, "64": 20000.0}
    # the encoder is measured at its own rows
    KernelChoice("encoder_model.onnx").choose(768, 3072, candidates, 256)
    assert calls[-1] == (768, 3072, kernels.ROWS["encoder_model.onnx"])
    # within 10% of the fastest is a tie, which the kernel reading the fewest weight bytes takes: nbits/2 at
    # sqrt(1·8.5) = 2.92 against int8's 2.83 (a quarter of a byte a weight against one; float/2, at 2.90, is tied
    # too but reads four)
    times["nbits/2"][64], times["float/2"] = 8.5, {4: 1.0, 64: 8.4}
    assert KernelChoice("decoder_model.onnx").choose(1024, 1024, candidates, 256) == ("nbits", 2)
    times["nbits/2"][64] = 9.9  # 3.15: 11% slower, no longer a tie
    assert KernelChoice("decoder_model.onnx").choose(512, 512, candidates, 256) == ("int8", 2)
    # kernels reading as many bytes (--int8's 8-bit codes: nbits/8, s8 and the uint8 kernel) tie in a fixed order,
    # not by which measured faster this time: MatMulNBits first, then s8
    times.update({"nbits/8": {4: 1.05, 64: 4.2}, "s8/8": {4: 1.0, 64: 4.0}, "int8/8": {4: 1.0, 64: 4.0},
                  "float/8": {4: 1.0, 64: 4.0}})
    assert KernelChoice("decoder_model.onnx").choose(256, 256, kernels.INT8_CANDIDATES, 256) == ("nbits", 8)
    times["nbits/8"] = {4: 1.0, 64: 9.0}  # out of the tie: s8 before the uint8 kernel
    assert KernelChoice("decoder_model.onnx").choose(128, 128, kernels.INT8_CANDIDATES, 128) == ("s8", 8)
    # a named kernel is taken without measuring, at the fewest bits that hold the weight
    assert KernelChoice("encoder_model.onnx", "nbits").choose(8, 8, candidates, 16) == ("nbits", 2)
    assert len(calls) == 6
    # a kernel whose op the runtime lacks (or, for s8, that this processor would not add exactly) is never a
    # candidate; float is always there
    only = KernelChoice("encoder_model.onnx", available=("float",))
    assert only.choose(768, 768, candidates, 256) == ("float", 2) and len(calls) == 6
    with pytest.raises(ValueError, match="cannot compute"):
        KernelChoice("encoder_model.onnx", "int8").choose(8, 8, kernels.candidates_for(None), 16)


def test_the_candidates_hold_each_weight_exactly():
    assert kernels.candidates_for(1) == [("nbits", 2), ("nbits", 4), ("s8", 2), ("int8", 2), ("float", 2)]  # ternary
    assert kernels.candidates_for(7) == [("nbits", 4), ("s8", 4), ("int8", 4), ("float", 4)]
    assert kernels.candidates_for(127) == [("nbits", 8), ("s8", 8), ("int8", 8), ("float", 8)]
    # --int4's blocks have a scale each, no column scale
    assert not {("int8", 4), ("s8", 4)} & set(kernels.candidates_for(None))


def test_two_bit_nbits_weights_are_blocked_by_at_most_128():
    """onnxruntime's 2-bit MatMulNBits is 17-25x slower at block 256: such weights are stored (and measured) at
    128; every other kernel keeps the largest block that divides K (the fewest scales)."""
    from modelshrink.onnx import lowbit

    assert lowbit.kernel_block("nbits", 2, 256) == 128 and lowbit.kernel_block("nbits", 2, 64) == 64
    assert lowbit.kernel_block("nbits", 4, 256) == lowbit.kernel_block("int8", 2, 256) == 256
    assert lowbit.block_size_for(768) == 256 and lowbit.block_size_for(48) == 16


def test_measure_times_every_candidate_at_every_row_count():
    found = kernels.measure(64, 48, [("nbits", 4), ("s8", 4), ("int8", 4), ("float", 4)], (2, 16), 32, repeats=2,
                            threads=1)
    assert set(found) == {"nbits/4", "s8/4", "int8/4", "float/4"}
    assert all(set(by_rows) == {2, 16} and all(t > 0 for t in by_rows.values()) for by_rows in found.values())
    # --int8's candidates: uint8 codes with a zero point a column, except s8's, which are symmetric
    found = kernels.measure(64, 48, kernels.INT8_CANDIDATES, (2,), 32, zero_points=True, repeats=1, threads=1)
    assert set(found) == {"nbits/8", "s8/8", "int8/8", "float/8"}


def test_the_timing_graphs_carry_the_lowest_ir_version_their_opsets_need(monkeypatch):
    """Not the installed onnx's newest: onnx 1.23 writes IR 14 by default, which onnxruntime 1.31 refuses (it reads
    up to 13), so an export on that pair failed while timing its kernels."""
    import onnx
    import onnxruntime as ort
    from onnx import helper

    seen, session = [], ort.InferenceSession

    def recording(model, *args, **kwargs):
        seen.append(onnx.load_from_string(model))
        return session(model, *args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", recording)
    kernels.measure(64, 48, [("nbits", 4), ("s8", 4), ("int8", 4), ("float", 4)], (2,), 32, repeats=1, threads=1)
    assert len(seen) == 4
    for model in seen:
        assert model.ir_version == helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True) <= 10


def test_the_option_lists_every_kernel():
    from modelshrink.onnx.compress import ROUNDINGS
    from modelshrink.options.export import KERNEL_CHOICES, ROUNDING_CHOICES

    assert KERNEL_CHOICES == kernels.CHOICES
    assert ROUNDING_CHOICES == ("auto", *ROUNDINGS)


@pytest.mark.slow
def test_an_automatic_export_records_what_it_measured_and_takes_the_fastest_or_a_tie(ternary, tmp_path):
    out = tmp_path / "auto"
    result = runner.invoke(app, ["export", str(ternary), "-o", str(out), *FAST])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "export_report.json").read_text())
    for name in ("encoder_model.onnx", "decoder_with_past_model.onnx"):
        measured = report["storage"][name]["kernels"]
        assert measured["kernel"] == "auto" and measured["rows"] == list(kernels.rows_for(name))
        assert measured["measured"]
        for entry in measured["measured"].values():
            mean = {c: math.exp(sum(math.log(t) for t in ms.values()) / len(ms)) for c, ms in entry["ms"].items()}
            # rounded to 4 decimals of a millisecond in the report, so compare within that either way; a candidate
            # within MARGIN of the fastest is a tie, which the one reading the fewest weight bytes takes
            slack, bound = 1e-3, min(mean.values()) * kernels.MARGIN
            assert mean[entry["chosen"]] <= bound + slack
            lighter = [c for c in mean if kernels._bytes_read(c) < kernels._bytes_read(entry["chosen"])]
            assert all(mean[c] > bound - slack for c in lighter), entry
        counts = report["storage"][name]["low_bit_kernels"]
        assert sum(counts.values()) == report["storage"][name]["low_bit_matmuls"]


def _producers(graph) -> dict:
    return {out: node for node in graph.node for out in node.output}


def _vnni() -> bool:
    from modelshrink.runtime.cpu import signed_products_exact

    return signed_products_exact()


NEEDS_VNNI = pytest.mark.skipif(not _vnni(), reason="the s8 kernel is exact only on x86 with VNNI or on ARM")


@pytest.mark.slow
@pytest.mark.parametrize("kernel", ["int8", pytest.param("s8", marks=NEEDS_VNNI), "nbits", "float"])
def test_integer_kernels_read_the_activation_before_the_models_own_rounding(ternary, tmp_path, kernel):
    import onnx

    out = tmp_path / kernel
    # the model's own attention roundings kept (the default leaves them float), so the int8 kernel's products are
    # the quantized model's, exactly
    result = runner.invoke(app, ["export", str(ternary), "-o", str(out), "--kernel", kernel, "--activation-rounding",
                                 "model", *FAST])
    assert result.exit_code == 0, result.output  # the check passes with the kernels' own rounding
    report = json.loads((out / "export_report.json").read_text())
    model = onnx.load(str(out / "encoder_model.onnx"))
    producers = _producers(model.graph)
    op = {"int8": "MatMulIntegerToFloat", "s8": "MatMulIntegerToFloat", "nbits": "MatMulNBits", "float": "MatMul"}[kernel]
    users = [n for n in model.graph.node if n.op_type == op and not n.input[1].startswith("/")]
    assert users

    def rounded(name: str) -> bool:  # round(x / α) · α, the quantized model's rounding (shortened by the export)
        node = producers.get(name)
        return node is not None and node.op_type == "Mul" and any(
            producers.get(i) is not None and producers[i].op_type == "Round" for i in node.input)

    encoder = report["storage"]["encoder_model.onnx"]
    # the roundings left (of the attention's queries, keys, values and probabilities) are written in fewer nodes
    assert encoder["roundings_shortened"] > 0
    assert not any(n.op_type in ("Clip", "Where") for n in model.graph.node if n.output[0].endswith("_rounding"))
    if kernel == "float":  # a float matmul computes what PyTorch computes: the graph keeps its rounding
        assert encoder["inputs_unrounded"] == 0 and all(rounded(n.input[0]) for n in users)
        assert report["validation"]["rms_ratio"] < 1e-5
    elif kernel in ("int8", "s8"):  # the integer kernel reads the model's own codes of x: round(x / α) + 128, α its own
        assert encoder["inputs_as_model_codes"] == len(users) and encoder["inputs_unrounded"] == 0
        for n in users:
            codes = producers[n.input[0]]
            assert codes.op_type == "QuantizeLinear" and codes.input[1] == n.input[2]  # the same α scales the product
            assert producers[codes.input[1]].op_type in ("Where", "Div", "Cast")  # the model's α (1 if x is all 0)
        assert report["validation"]["rms_ratio"] < 1e-5  # the quantized model's products, exactly in integers
        # the model in float64, the check's measure of what float rounding alone moves, is as close here
        assert all(o["float64_rms_ratio"] < 1e-3 for o in report["validation"]["outputs"].values())
        # s8 multiplies the ternary codes as int8 weights (zero point 0), int8 as uint8 b + 128
        weight_types = {producers[n.input[1]].output[0]: n.input[5] for n in users}
        zero = {i.name: i.data_type for i in model.graph.initializer}
        assert {zero[z] for z in weight_types.values()} == {onnx.TensorProto.INT8 if kernel == "s8" else
                                                           onnx.TensorProto.UINT8}
        resolved = json.loads((out / "modelshrink.json").read_text())["resolved"]
        assert resolved["cpu_features"] == (["vnni"] if kernel == "s8" else [])
    else:  # MatMulNBits rounds x per block of K itself: another rounding than the model's
        assert encoder["inputs_unrounded"] == len(users) and not any(rounded(n.input[0]) for n in users)
        assert report["validation"]["rms_ratio"] < 0.1  # 8-bit rounding noise, not a broken graph (~1)


@pytest.mark.slow
def test_without_the_models_rounding_no_activation_is_rounded_in_the_graph(ternary, tmp_path):
    import onnx

    out = tmp_path / "none"
    result = runner.invoke(app, ["export", str(ternary), "-o", str(out), "--kernel", "int8", "--activation-rounding",
                                 "none", *FAST])
    assert result.exit_code == 0, result.output  # within the check's tolerance
    for name in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        nodes = graph_nodes(onnx.load(str(out / name)).graph)
        # what rounding is left makes the uint8 kernel's codes (QuantizeLinear); no float rounding remains
        assert not any(n.op_type in ("Round", "Clip") for n in nodes), name
        assert any(n.op_type == "QuantizeLinear" for n in nodes), name
    report = json.loads((out / "export_report.json").read_text())
    assert report["storage"]["encoder_model.onnx"]["roundings_shortened"] > 0
    assert report["validation"]["rms_ratio"] < 0.1


@pytest.mark.slow
def test_with_the_kernels_rounding_each_integer_kernel_rounds_its_own_input_and_auto_weighs_nbits(ternary, tmp_path):
    import onnx

    out = tmp_path / "kernel"
    result = runner.invoke(app, ["export", str(ternary), "-o", str(out), "--activation-rounding", "kernel",
                                 "--no-validate"])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "export_report.json").read_text())
    for name in ("encoder_model.onnx", "decoder_with_past_model.onnx"):
        # the model rounds every matmul input, yet MatMulNBits (another rounding) is measured beside the uint8 kernel
        measured = report["storage"][name]["kernels"]["measured"].values()
        assert measured and all(any(c.startswith("nbits/") for c in entry["ms"]) for entry in measured), name
        assert report["storage"][name]["inputs_as_model_codes"] == 0
    for name in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        # no rounding of the model's is left in the graph: neither its float rounding nor its codes
        nodes = graph_nodes(onnx.load(str(out / name)).graph)
        assert not any(n.op_type in ("Round", "Clip", "QuantizeLinear") for n in nodes), name
    # named, the uint8 kernel rounds x itself, per tensor, as --int8's does
    out = tmp_path / "kernel-int8"
    result = runner.invoke(app, ["export", str(ternary), "-o", str(out), "--activation-rounding", "kernel",
                                 "--kernel", "int8", *FAST])
    assert result.exit_code == 0, result.output  # within the check's tolerance
    report = json.loads((out / "export_report.json").read_text())
    encoder = report["storage"]["encoder_model.onnx"]
    model = onnx.load(str(out / "encoder_model.onnx"))
    users = [n for n in model.graph.node if n.op_type == "DynamicQuantizeMatMul"]
    assert users and encoder["inputs_unrounded"] == len(users) and encoder["inputs_as_model_codes"] == 0
    assert not any(n.op_type in ("Round", "QuantizeLinear", "MatMulIntegerToFloat") for n in model.graph.node)
    assert 0 < report["validation"]["rms_ratio"] < 0.1  # 8-bit rounding noise, not a broken graph (~1)


@pytest.mark.slow
def test_a_ternary_weight_on_the_four_bit_kernel_is_stored_in_two_bits(ternary, tmp_path, monkeypatch):
    """4-bit MatMulNBits is the fastest kernel for most ternary weights on this machine; its codes are kept in 2 bits
    on disk and widened when the graph loads, so the choice costs the folder nothing."""
    import onnx

    def four_bits_fastest(k, n, candidates, rows, block_size, zero_points=False, threads=None):
        return {f"{kernel}/{bits}": {r: 1.0 if (kernel, bits) == ("nbits", 4) else 2.0 for r in rows}
                for kernel, bits in candidates}

    monkeypatch.setattr(kernels, "measure", four_bits_fastest)
    out = tmp_path / "nbits4"
    result = runner.invoke(app, ["export", str(ternary), "-o", str(out), "--activation-rounding", "kernel", *FAST])
    assert result.exit_code == 0, result.output  # the check against the quantized PyTorch model passes
    report = json.loads((out / "export_report.json").read_text())
    for name in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        storage = report["storage"].get(name) or report["storage"]["decoder_with_past_model.onnx"]
        assert storage["low_bit_widths"] == [2], name
        graph = onnx.load(str(out / name)).graph
        nbits = [n for n in graph_nodes(graph) if n.op_type == "MatMulNBits"]
        assert nbits and all(a.i == 4 for n in nbits for a in n.attribute if a.name == "bits"), name
        # no 4-bit codes on disk: each kernel reads codes that nodes widen from the stored ones when a session loads
        stored = {i.name for i in graph.initializer}
        assert not any(n.input[1] in stored for n in nbits), name
    monkeypatch.undo()
    named = tmp_path / "nbits2"  # the same model on 2-bit kernels stores the same bytes of weights (the widening
    # nodes add a few hundred bytes a weight: a tiny model's graph is mostly nodes, a real one's mostly weights)
    result = runner.invoke(app, ["export", str(ternary), "-o", str(named), "--activation-rounding", "kernel",
                                 "--kernel", "nbits", "--no-validate"])
    assert result.exit_code == 0, result.output
    size = {d: sum(len(i.raw_data) for f in d.glob("*.onnx") for i in onnx.load(str(f)).graph.initializer)
            for d in (out, named)}
    assert abs(size[out] - size[named]) < 0.05 * size[named], size


@pytest.mark.slow
def test_a_merged_decoder_unpacks_each_weight_once(ternary_int8, tmp_path):
    import onnx
    import onnxruntime as ort

    out = ternary_int8
    model = onnx.load(str(out / "decoder_model_merged.onnx"))
    outer = [n for n in model.graph.node if n.op_type != "If"]
    inner = [n for n in graph_nodes(model.graph) if n not in model.graph.node]
    assert any(n.op_type == "BitShift" for n in outer) and not any(n.op_type == "BitShift" for n in inner)
    assert len({tuple(n.output) for n in outer}) == len(outer)
    # onnxruntime folds the unpacking into constants when it loads the graph
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "loaded.onnx")
    ort.InferenceSession(str(out / "decoder_model_merged.onnx"), options, providers=["CPUExecutionProvider"])
    loaded = onnx.load(str(tmp_path / "loaded.onnx"))
    # outside the If only its condition is left (the fused self-attention's: is a past_sequence_length given?)
    ops = [n.op_type for n in loaded.graph.node]
    assert ops[-1] == "If" and set(ops[:-1]) <= {"Less", "Not"}, ops
    assert not any(n.op_type == "BitShift" for n in graph_nodes(loaded.graph))


def _refused(args: list[str], out: Path, message: str) -> None:
    result = runner.invoke(app, ["export", *args, "-o", str(out)])
    assert result.exit_code == 1, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not out.exists() and not (out.parent / f".{out.name}.partial").exists()


@pytest.mark.slow
def test_bad_kernel_requests_are_one_line_and_write_nothing(plain_models, ternary, tmp_path):
    bart = str(plain_models["bart"])
    _refused([bart, "--int4", "--kernel", "int8"], tmp_path / "o2", "--int4's blocks each have their own")
    _refused([bart, "--kernel", "nbits"], tmp_path / "o3", "is a float model; add --int8 or --int4")
    _refused([str(ternary), "--kernel", "fastest"], tmp_path / "o4", "--kernel must be one of")
    _refused([bart, "--activation-rounding", "none"], tmp_path / "o5", "is a float model, whose activations are not")
    _refused([str(ternary), "--int8", "--activation-rounding", "none"], tmp_path / "o6", "not with --int8 or --int4")


def _schemas_without(*ops: str) -> list:
    from onnxruntime.capi import onnxruntime_pybind11_state

    return [s for s in onnxruntime_pybind11_state.get_all_operator_schema()
            if not (s.domain == "com.microsoft" and s.name in ops)]


@pytest.mark.slow
def test_a_kernel_the_runtime_lacks_is_one_line_naming_the_option_that_avoids_it(ternary, ternary_int8, tmp_path,
                                                                                   monkeypatch):
    from onnxruntime.capi import onnxruntime_pybind11_state

    from modelshrink.runtime import load
    from modelshrink.runtime.errors import UserError

    out = ternary_int8
    lacking = _schemas_without("MatMulIntegerToFloat")
    monkeypatch.setattr(onnxruntime_pybind11_state, "get_all_operator_schema", lambda: lacking)
    with pytest.raises(UserError, match="needs onnxruntime's MatMulIntegerToFloat, which onnxruntime .* lacks; "
                                        "upgrade onnxruntime .*, or export again with --kernel float"):
        load(out)
    # the export refuses to write such a graph, naming the same way out
    _refused([str(ternary), "--kernel", "int8"], tmp_path / "o", "needs onnxruntime's MatMulIntegerToFloat")
    # left to choose, it takes only the kernels this onnxruntime has (for the model's rounded inputs: float)
    auto = tmp_path / "auto"
    result = runner.invoke(app, ["export", str(ternary), "-o", str(auto), "--no-validate"])
    assert result.exit_code == 0, result.output
    report = json.loads((auto / "export_report.json").read_text())
    encoder = report["storage"]["encoder_model.onnx"]
    measured = encoder["kernels"]["measured"].values()
    assert not any(name.startswith("int8/") for entry in measured for name in entry["ms"])
    assert encoder["low_bit_kernels"] and "int8" not in encoder["low_bit_kernels"]
    assert "MatMulIntegerToFloat" not in json.loads((auto / "modelshrink.json").read_text())["resolved"]["contrib_ops"]


@pytest.mark.parametrize("moved, passed", [(0.1, True), (0.04, False)])
def test_a_model_that_rounds_its_activations_is_bounded_by_what_float64_moves_it(monkeypatch, tmp_path, moved, passed):
    """Float rounding alone flips a quantized model's roundings at near ties; the check's bound for such a model is
    at least twice the most its float64 twin moves any output (one run of the twin may flip nothing in a graph
    where the export flips a little: the bound is the largest, not each output's own)."""
    from modelshrink.onnx import validate as check

    monkeypatch.setattr(check, "load", lambda folder: object())
    diffs = {"runtime": {"encoder": 0.15, "decoder": 0.12}, "twin": {"encoder": moved, "decoder": 0.0}}
    as_report = {tag: {name: {"max_abs_diff": r, "reference_max_abs": 1.0, "rms_ratio": r} for name, r in d.items()}
                 for tag, d in diffs.items()}
    monkeypatch.setattr(check, "output_differences", lambda ref, runtime: as_report["runtime"])
    monkeypatch.setattr(check, "twin_differences", lambda ref, merged: as_report["twin"])
    step = check.Step("encoder", {}, ["last_hidden_state"], [], twin=[])  # the reference holds the twin's outputs
    ref = check.Reference("seq2seq", ["a document"], None, None, [step])
    report = check.validate(ref, tmp_path, atol=None, rtol=check.QUANTIZED_RTOL, rms=True)
    assert (report["failure"] is None) == passed
    assert report["outputs"]["decoder"]["float64_rms_ratio"] == 0.0 and report["outputs"]["decoder"]["passed"] == passed
    assert ("float64" in report["tolerance"]) == passed  # the bound says where it came from when the twin sets it


@pytest.mark.parametrize("first, other", [("nbits", "int8"), pytest.param("nbits", "s8", marks=NEEDS_VNNI),
                                          pytest.param("s8", "int8", marks=NEEDS_VNNI)])
def test_int8_weights_split_between_kernels_run_in_one_graph(tmp_path, monkeypatch, first, other):
    """--int8's rewrite when the measurement splits a graph's weights: the uint8 kernel's are left to onnxruntime's
    dynamic quantization, which then runs on a graph that already holds MatMulNBits; s8's are symmetric int8 codes
    unpacked at load; both compute the float product to 8-bit accuracy. The quantization runs on a graph whose
    com.microsoft ops have no types in onnx's shape inference (the Relu between reads one)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from modelshrink.onnx import int8

    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((64, 128)).astype(np.float32), rng.standard_normal((128, 32)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h0"]), helper.make_node("Relu", ["h0"], ["h"]),
         helper.make_node("MatMul", ["h", "w2"], ["y0"]), helper.make_node("Relu", ["y0"], ["y"])], "two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", 32])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    path = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))

    def fake(k, n, candidates, rows, block_size, zero_points=False, threads=None):
        fastest = f"{first}/8" if k == 64 else f"{other}/8"
        return {f"{kernel}/{bits}": {r: 1.0 if f"{kernel}/{bits}" == fastest else 2.0 for r in rows}
                for kernel, bits in candidates}

    monkeypatch.setattr(kernels, "measure", fake)
    stored = int8.quantize_int8(path, per_channel=True, choice=KernelChoice("encoder_model.onnx"))
    assert stored["int8_kernels"] == {first: 1, other: 1} and stored["int8_matmuls"] == 2
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert ("MatMulNBits" in ops) == (first == "nbits") and ops & {"MatMulInteger", "DynamicQuantizeMatMul"}
    x = rng.standard_normal((4, 64)).astype(np.float32)
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    want = np.maximum(np.maximum(x @ w1, 0) @ w2, 0)
    assert np.sqrt(((got - want) ** 2).mean() / (want ** 2).mean()) < 0.02


def test_s8_weights_are_symmetric_codes_and_their_products_exact_where_offered():
    """--int8's s8 codes: round(w / s), |b| <= 127, s = max |w| / 127 a column; the kernel adds uint8 x int8
    products into int32 exactly on the processors it is offered on (VNNI's instruction), even at the extremes
    that clip AVX2's int16 sums (255 x 127 twice)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from modelshrink.onnx import int8

    w = np.random.default_rng(0).standard_normal((40, 6)).astype(np.float32)
    blocks = int8.int8_blocks(w, 16)
    b = blocks.codes.astype(np.int16) - 128  # [N, blocks, block]: padded to 48 with the zero point (b = 0)
    assert blocks.zero_points is None and np.abs(b).max() == 127 and not b.reshape(6, -1)[:, 40:].any()
    scale = blocks.scales[:, 0]
    assert np.allclose(scale, np.abs(w).max(axis=0) / 127)
    assert np.abs(b.reshape(6, -1)[:, :40].T * scale - w).max() <= scale.max() / 2 + 1e-6
    if not _vnni():
        pytest.skip("the s8 kernel is offered only where the processor adds its products exactly")
    k = 768
    a = np.full((2, k), 255, dtype=np.uint8)
    weights = np.stack([np.full(k, 127), np.full(k, -127), np.resize([127, -127], k)], axis=1).astype(np.int8)
    graph = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "s8",
                              [helper.make_tensor_value_info("a", TensorProto.UINT8, ["rows", k])],
                              [helper.make_tensor_value_info("y", TensorProto.INT32, ["rows", 3])],
                              [numpy_helper.from_array(weights, "b")])
    session = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
                                   .SerializeToString(), providers=["CPUExecutionProvider"])
    assert (session.run(None, {"a": a})[0] == a.astype(np.int64) @ weights.astype(np.int64)).all()


def test_the_processor_check_reads_vnni_from_cpuinfo(tmp_path, monkeypatch):
    from modelshrink.runtime import cpu

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f\n\nprocessor\t: 1\n")
    assert cpu.cpu_flags(info) == {"fpu", "sse", "avx2", "avx512f"}
    assert cpu.cpu_flags(tmp_path / "none") is None
    assert not cpu.signed_products_exact(True, cpu.cpu_flags(info))  # AVX2 and AVX-512 without VNNI: clipped sums
    for flag in ("avx512_vnni", "avx_vnni", "amx_int8"):
        assert cpu.signed_products_exact(True, frozenset({"avx2", flag}))
    assert not cpu.signed_products_exact(True, frozenset())  # flags unread: the safe side
    assert cpu.signed_products_exact(False, frozenset())  # ARM: widening multiplies, exact
    monkeypatch.setattr(cpu, "signed_products_exact", lambda: False)
    assert cpu.missing_features(["vnni"]) == ["vnni"] and cpu.missing_features([]) == []
    from modelshrink.onnx import lowbit

    assert "s8" not in lowbit.available_kernels() and "int8" in lowbit.available_kernels()


@pytest.mark.slow
def test_without_vnni_s8_is_refused_and_never_chosen(plain_models, ternary_int8, tmp_path, monkeypatch):
    """On an x86 processor without VNNI: --kernel s8 is one line naming the kernel to use instead, auto does not
    weigh s8, and a folder holding s8 weights (exported on a VNNI machine) is refused by the runtime, which would
    otherwise return clipped sums."""
    from modelshrink.runtime import cpu, load
    from modelshrink.runtime.errors import UserError

    monkeypatch.setattr(cpu, "signed_products_exact", lambda: False)
    monkeypatch.setattr("modelshrink.steps.export.signed_products_exact", lambda: False)
    _refused([str(plain_models["bart"]), "--int8", "--kernel", "s8"], tmp_path / "o",
             "this processor has none: use --kernel int8")
    auto = tmp_path / "auto"
    result = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(auto), "--int8", "--no-validate"])
    assert result.exit_code == 0, result.output
    report = json.loads((auto / "export_report.json").read_text())
    measured = report["storage"]["encoder_model.onnx"]["kernels"]["measured"].values()
    assert measured and not any(name.startswith("s8/") for entry in measured for name in entry["ms"])
    assert json.loads((auto / "modelshrink.json").read_text())["resolved"]["cpu_features"] == []
    load(auto)
    # a folder that records it needs VNNI (what an s8 export writes)
    manifest = json.loads((ternary_int8 / "modelshrink.json").read_text())
    folder = tmp_path / "s8"
    import shutil

    shutil.copytree(ternary_int8, folder)
    manifest["resolved"]["cpu_features"] = ["vnni"]
    (folder / "modelshrink.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="adds exactly only with VNNI, and this processor lacks it .*--kernel int8"):
        load(folder)


@pytest.mark.slow
def test_a_transformers_js_folder_is_left_only_kernels_exact_everywhere(plain_models, tmp_path):
    """transformers.js reads no modelshrink.json, so nothing would keep its folder's s8 weights off a processor
    without VNNI: left to choose, the export does not weigh s8 for it."""
    out = tmp_path / "js"
    result = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(out), "--int8", "--layout",
                                 "transformers.js", "--no-validate"])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "export_report.json").read_text())
    measured = [entry for storage in report["storage"].values() if isinstance(storage, dict) and "kernels" in storage
                for entry in storage["kernels"]["measured"].values()]
    assert measured and not any(name.startswith("s8/") for entry in measured for name in entry["ms"])
    assert json.loads((out / "modelshrink.json").read_text())["resolved"]["cpu_features"] == []


def test_a_linear_layers_bias_goes_into_its_integer_kernel():
    """The Add of a linear layer's bias after DynamicQuantizeMatMul becomes the kernel's own bias input (one node
    fewer a layer); an Add of anything else, or a product read twice, stays as it is; the outputs do not change."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from modelshrink.onnx import int8, lowbit_graph

    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((32, 48)).astype(np.float32), rng.standard_normal((48, 16)).astype(np.float32)
    b1, b2 = rng.standard_normal(48).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["b1", "h"], ["hb"]),  # bias
             helper.make_node("MatMul", ["hb", "w2"], ["y"]), helper.make_node("Identity", ["b2"], ["b2_same"]),
             helper.make_node("Add", ["y", "b2_same"], ["yb"]),  # bias, through an Identity as the exporter writes
             helper.make_node("Add", ["yb", "r"], ["out"]),  # a residual: not an initializer
             helper.make_node("MatMul", ["x", "w1"], ["twice"]), helper.make_node("Add", ["twice", "b1"], ["t1"]),
             helper.make_node("Mul", ["twice", "twice"], ["t2"])]  # a product read by two nodes keeps its Add
    graph = helper.make_graph(nodes, "bias", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 32]),
                                              helper.make_tensor_value_info("r", TensorProto.FLOAT, ["rows", 16])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["rows", k])
                               for n, k in (("out", 16), ("t1", 48), ("t2", 48))],
                              [numpy_helper.from_array(v, n) for n, v in (("w1", w1), ("w2", w2), ("b1", b1), ("b2", b2))])
    for node in graph.node:
        node.name = node.output[0]
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    rewrite = lowbit_graph.LowBitGraph(model)
    for init in [i for i in model.graph.initializer if i.name in ("w1", "w2")]:
        rewrite.as_matmul(init, int8.int8_blocks(numpy_helper.to_array(init), 16), kernel="int8")
    rewrite.finish()
    feed = {"x": rng.standard_normal((4, 32)).astype(np.float32), "r": rng.standard_normal((4, 16)).astype(np.float32)}

    def run(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)

    before = run(model)
    assert lowbit_graph.fuse_bias(model.graph, rewrite.integer_nodes) == 2
    onnx.checker.check_model(model)
    kernels_ = [n for n in model.graph.node if n.op_type == "DynamicQuantizeMatMul"]
    assert sorted(list(n.input)[4:] for n in kernels_) == [[], ["b1"], ["b2_same"]]
    adds = {n.output[0] for n in model.graph.node if n.op_type == "Add" and not n.output[0].startswith("w")}
    assert adds == {"out", "t1"}  # the residual and the twice-read product's (the others unpack the weights)
    after = run(model)
    for got, want in zip(after, before):
        assert np.allclose(got, want, rtol=1e-5, atol=1e-5)
    exact = (feed["x"] @ w1 + b1) @ w2 + b2 + feed["r"]
    assert np.sqrt(((after[0] - exact) ** 2).mean() / (exact ** 2).mean()) < 0.05  # 8-bit products, biases added
