"""Sinusoidal position tables (Marian, Pegasus) are computed in the exported graphs, not stored in each of them
(issue 55: tables that are a function of their shape are not stored); a table the formula does not give back is
traced as stored."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import translator
from modelshrink.onnx.positions import computable, computed_positions


def _marian(tmp_path: Path):
    from transformers import AutoModelForSeq2SeqLM

    return AutoModelForSeq2SeqLM.from_pretrained(translator("marian", tmp_path / "marian"))


def test_the_context_computes_the_stored_rows_and_restores_the_modules(tmp_path):
    model = _marian(tmp_path)
    tables = [m for m in model.modules() if callable(getattr(m, "create_weight", None))]
    assert len(tables) == 2 and all(computable(m) for m in tables)
    classes = [type(m) for m in tables]
    positions = torch.tensor([[0, 1, 7, 79]])
    with computed_positions(model) as changed:
        assert changed == 2
        for m in tables:
            rows = torch.nn.Embedding.forward(m, positions)  # the class's own lookup: now computed
            assert torch.allclose(rows, m.weight[positions], atol=1e-5) and rows.dtype == torch.float32
    assert [type(m) for m in tables] == classes and not any(hasattr(m, "_frequencies") for m in tables)
    with torch.no_grad():  # a table that no longer holds the sinusoids is looked up as it is
        tables[0].weight[3] += 0.5
    assert not computable(tables[0]) and computable(tables[1])
    with computed_positions(model) as changed:
        assert changed == 1


@pytest.mark.slow  # an export: see CONTRIBUTING.md, the fast loop
def test_a_marian_export_stores_no_position_table_and_generates_pytorchs_tokens(tmp_path):
    import onnx

    from modelshrink.options.export import ExportOptions
    from modelshrink.steps.export import export_model

    teacher = translator("marian", tmp_path / "marian")
    folder, report = export_model(ExportOptions(model=str(teacher)), tmp_path / "onnx")
    assert report["validation"]["generation"]["equal"], report["validation"]["generation"]
    rows, width = _marian(tmp_path).model.encoder.embed_positions.weight.shape
    for graph in ("encoder_model.onnx", "decoder_model_merged.onnx"):
        shapes, ops = _contents(onnx.load(str(folder / graph)).graph)
        assert (rows, width) not in shapes and {"Sin", "Cos"} <= ops, graph


def _contents(graph) -> tuple[set, set]:
    """The shapes of every initializer and the op types of every node of a graph and its subgraphs (If branches)."""
    import onnx

    shapes, ops = {tuple(t.dims) for t in graph.initializer}, set()
    for node in graph.node:
        ops.add(node.op_type)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                more = _contents(attribute.g)
                shapes, ops = shapes | more[0], ops | more[1]
    return shapes, ops
