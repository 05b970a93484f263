"""What keeps export's peak memory near the model's bytes (issue 78): the PyTorch model is freed before the graphs
are rewritten and opened in onnxruntime, and no rewrite keeps a graph alive after it returns. The peaks themselves
are measured by benchmarks/real_shapes.py on real-size shapes (BENCHMARKS.md), never by a test."""

from __future__ import annotations

import contextlib
import gc
import json
import weakref

import numpy as np
import pytest

FAST = ["--samples", "3", "--generation-docs", "2"]


@pytest.mark.parametrize("flags", [[], ["--int8"]])
def test_the_model_is_freed_before_the_graphs_are_rewritten_and_validated(plain_models, tmp_path, monkeypatch, flags):
    from typer.testing import CliRunner

    import modelshrink.steps.export as step
    from modelshrink.cli import app

    alive = {}
    load, rewrite = step._load_model, step._rewrite

    def watched_load(options):
        kind, config, model, tokenizer = load(options)
        alive["model"] = weakref.ref(model)
        return kind, config, model, tokenizer

    def watched_rewrite(*args, **kwargs):
        alive["at rewrite"] = alive["model"]() is not None
        return rewrite(*args, **kwargs)

    monkeypatch.setattr(step, "_load_model", watched_load)
    monkeypatch.setattr(step, "_rewrite", watched_rewrite)
    result = CliRunner().invoke(app, ["export", str(plain_models["bart"]), "-o", str(tmp_path / "onnx"), *flags,
                                      *FAST])
    assert result.exit_code == 0, result.output
    assert alive["at rewrite"] is False
    assert "generated tokens equal to PyTorch's" in result.output or "--int8" in flags  # the check still ran


def test_a_low_bit_rewrite_does_not_keep_its_model_alive():
    """LowBitGraph and its unpacking nodes must not reference each other: a cycle kept the whole model (every
    float weight) in memory until the collector ran, one graph more per rewrite."""
    from onnx import TensorProto, helper, numpy_helper

    from modelshrink.onnx.int8 import int8_blocks
    from modelshrink.onnx.lowbit import S8
    from modelshrink.onnx.lowbit_graph import LowBitGraph

    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["rows", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", 32])], [weight])
    model = helper.make_model(graph)
    rewrite = LowBitGraph(model)
    rewrite.as_matmul(model.graph.initializer[0], int8_blocks(numpy_helper.to_array(weight), 32), kernel=S8)
    rewrite.finish()
    assert [i.name for i in model.graph.initializer if i.name == "w"] == []  # the float weight was replaced
    watched = weakref.ref(rewrite)
    gc.disable()
    try:
        del rewrite
        assert watched() is None  # freed by reference counting alone
    finally:
        gc.enable()


def test_integer_codes_are_made_without_copies_of_the_weight_and_equal_the_rounding():
    """int8_blocks rounds in place; its codes are still round(w / s) + 128 per column, the padding the zero point."""
    from modelshrink.onnx.int8 import int8_blocks, uint8_blocks

    w = np.random.default_rng(1).standard_normal((40, 6)).astype(np.float32)
    blocks = int8_blocks(w, 32)
    scale = np.abs(w).max(axis=0) / 127
    expected = np.clip(np.round(w / scale), -127, 127) + 128
    assert blocks.codes.shape == (6, 2, 32)
    assert np.array_equal(blocks.codes.reshape(6, 64)[:, :40].T, expected.astype(np.uint8))
    assert (blocks.codes.reshape(6, 64)[:, 40:] == 128).all()
    unsigned = uint8_blocks(w, 32)
    low, high = np.minimum(w.min(0), 0), np.maximum(w.max(0), 0)
    step = (high - low) / 255
    zero = np.clip(np.round(-low / step), 0, 255)
    assert np.array_equal(unsigned.codes.reshape(6, 64)[:, :40].T,
                          np.clip(np.round(w / step) + zero, 0, 255).astype(np.uint8))
    assert np.array_equal(unsigned.codes.reshape(6, 64)[:, 40:], np.repeat(zero[:, None], 24, 1).astype(np.uint8))


def test_the_trace_skips_the_function_pass_only_while_it_runs(tmp_path, monkeypatch):
    """The exporter's onnxscript-function pass (one more parse of the whole graph) is skipped while modelshrink
    traces a graph without custom opsets, and put back afterwards; the graph written is complete."""
    import onnx
    import onnxruntime as ort
    import torch
    from torch.onnx._internal.torchscript_exporter import onnx_proto_utils

    from modelshrink.onnx.graphs import _trace

    calls = []
    original = onnx_proto_utils._add_onnxscript_fn

    def spy(model_bytes, custom_opsets):
        calls.append(len(model_bytes))
        return original(model_bytes, custom_opsets)

    monkeypatch.setattr(onnx_proto_utils, "_add_onnxscript_fn", spy)
    linear = torch.nn.Linear(8, 4)
    _trace(linear, (torch.randn(2, 8),), tmp_path / "linear.onnx", ["x"], ["y"], {"x": {0: "batch"}}, 17)
    assert calls == [] and onnx_proto_utils._add_onnxscript_fn is spy
    model = onnx.load(str(tmp_path / "linear.onnx"))
    assert len(model.graph.initializer) == 2 and [n.op_type for n in model.graph.node] == ["Gemm"]
    with torch.no_grad():
        expected = linear(torch.ones(3, 8)).numpy()
    got = ort.InferenceSession(str(tmp_path / "linear.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.ones((3, 8), dtype=np.float32)})[0]
    assert np.allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize("flags", [[], ["--int8"], ["--int4"], ["--layout", "transformers.js"]])
def test_graphs_past_the_protobuf_limit_keep_their_weights_in_one_data_file(plain_models, tmp_path, monkeypatch,
                                                                            flags):
    """Every rewrite saves a graph too large for one protobuf with its weights in `<graph>.onnx_data` (the limit
    lowered to 0 here, so every graph is one), and the folder still validates, runs, and holds no other file."""
    from typer.testing import CliRunner

    from modelshrink.cli import app
    from modelshrink.onnx import saving
    from modelshrink.runtime.model import load

    monkeypatch.setattr(saving, "EXTERNAL_FROM", 0)
    out = tmp_path / "onnx"
    result = CliRunner().invoke(app, ["export", str(plain_models["bart"]), "-o", str(out), *flags, *FAST])
    assert result.exit_code == 0, result.output
    graphs = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.onnx") if p.name != "search_ops.onnx")
    data = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.onnx_data"))
    assert len(graphs) == 2 and set(data) <= {g + "_data" for g in graphs}  # encoder and merged decoder, no stale
    assert [g for g in graphs if "decoder_model_merged" in g][0] + "_data" in data  # the merge saved it so
    assert not [p for p in out.rglob("*") if p.is_file() and p.suffix not in (".onnx", ".onnx_data", ".json", ".md",
                                                                               ".txt", ".model")], list(out.rglob("*"))
    report = json.loads((out / "export_report.json").read_text())
    on_disk = {g: sum(p.stat().st_size for p in (out / g, out / (g + "_data")) if p.is_file()) for g in graphs}
    assert report["bytes"] == on_disk  # a graph's data file counted with it
    assert len(load(out).summarize(["the quick brown fox"])) == 1


def test_a_graph_the_exporter_wrote_a_file_per_weight_becomes_one_data_file(tmp_path, monkeypatch):
    """Past 2 GB torch's exporter writes each weight to a file named after it; the trace gathers them into the
    graph's one data file (or back into the graph, where it fits), the values unchanged."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from modelshrink.onnx import saving

    rng = np.random.default_rng(0)
    weights = {name: rng.standard_normal((16, 16)).astype(np.float32) for name in ("w1", "w2")}
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"],
                                                                                                 ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
                              [numpy_helper.from_array(v, n) for n, v in weights.items()])
    path = tmp_path / "decoder_model.onnx"
    onnx.save_model(helper.make_model(graph), str(path), save_as_external_data=True, all_tensors_to_one_file=False,
                    size_threshold=0)
    written = sorted(p for p in tmp_path.iterdir() if p != path)
    assert len(written) == 2
    monkeypatch.setattr(saving, "EXTERNAL_FROM", 0)
    saving.consolidate(path, written)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decoder_model.onnx", "decoder_model.onnx_data"]
    loaded = onnx.load(str(path))
    assert all(np.array_equal(numpy_helper.to_array(i), weights[i.name]) for i in loaded.graph.initializer)
    monkeypatch.setattr(saving, "EXTERNAL_FROM", 2_000_000_000)
    saving.consolidate(path, [])  # nothing the exporter wrote: left as it is
    assert (tmp_path / "decoder_model.onnx_data").is_file()


def _two_layers():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32))  # 49 kB


@pytest.mark.parametrize("staged", [False, True])
def test_the_trace_writes_its_weights_itself_one_tensor_at_a_time(tmp_path, monkeypatch, staged):
    """The exporter writes the graph without weights (its own protobuf and bytes held every weight at once, beside
    the model); the weights it traced, constant folding's transposes among them, go to the data file one at a
    time. Within `staged` the graph keeps that file; outside, or once finished, it is one file. Same outputs."""
    import onnx
    import onnxruntime as ort
    import torch

    from modelshrink.onnx import graphs, saving

    written = {}
    attach = saving.attach_weights

    def watched(path, weights):
        written["graph bytes"] = path.stat().st_size
        written["weights"] = sorted(weights)
        return attach(path, weights)

    monkeypatch.setattr(graphs, "attach_weights", watched)
    module, path = _two_layers(), tmp_path / "layers.onnx"
    x = torch.randn(2, 3, 64)  # three dimensions: the exporter's MatMul takes the weight transposed (folded)
    with saving.staged() if staged else contextlib.nullcontext():
        graphs._trace(module, (x,), path, ["x"], ["y"], {"x": {0: "batch", 1: "length"}}, 17)
        assert saving.data_file(path).is_file() == staged
    assert written["graph bytes"] < 2048 and len(written["weights"]) == 4  # no weight went through the exporter
    saving.finish_graph(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["layers.onnx"]
    model = onnx.load(str(path))
    assert [i.name for i in model.graph.input] == ["x"] and len(model.graph.initializer) == 4
    assert "Transpose" not in {n.op_type for n in model.graph.node}  # folded, as the exporter folds them
    with torch.no_grad():
        expected = module(torch.ones(1, 5, 64)).numpy()
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.ones((1, 5, 64), dtype=np.float32)})[0]
    assert np.allclose(got, expected, atol=1e-5)


def test_without_the_exporters_graph_step_the_exporter_writes_the_weights(tmp_path, monkeypatch):
    """Where torch's TorchScript exporter lacks the step the weights are kept from, the trace lets the exporter
    write them, as before."""
    import onnx
    import torch
    from torch.onnx._internal.torchscript_exporter import utils

    from modelshrink.onnx import graphs

    monkeypatch.setattr(utils, "_model_to_graph", None)
    with graphs._weights_kept() as weights:
        assert not weights.kept
    monkeypatch.undo()

    @contextlib.contextmanager
    def not_kept():
        yield graphs._Weights()

    monkeypatch.setattr(graphs, "_weights_kept", not_kept)
    monkeypatch.setattr(graphs, "attach_weights", None)  # never reached
    module, path = _two_layers(), tmp_path / "layers.onnx"
    graphs._trace(module, (torch.randn(2, 3, 64),), path, ["x"], ["y"], {"x": {0: "batch"}}, 17)
    assert len(onnx.load(str(path)).graph.initializer) == 4 and sorted(p.name for p in tmp_path.iterdir()) == [
        "layers.onnx"]
