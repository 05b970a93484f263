"""benchmarks/weight_rounding.py: quantize's rounding error per kind of weight, per tensor and per row; an outlier
costs a per-tensor scale what a per-row one does not pay."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import BertConfig, BertModel

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_rounding_errors_see_what_an_outlier_costs_one_scale_a_tensor(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import weight_rounding

    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=64))
    with torch.no_grad():  # one outlier in one feed-forward row, as trained BERTs have
        model.encoder.layer[0].output.dense.weight[3, 5] = 50 * model.encoder.layer[0].output.dense.weight.std()
    found = weight_rounding.rounding_errors(model)
    assert {"attention", "ffn", "embeddings"} <= set(found)
    ffn, attention = found["ffn"], found["attention"]
    assert ffn["peak"] > 25 > 5 > attention["peak"]
    # the outlier's tensor at 4 bits: one scale for it all rounds most weights to 0; per row only its row pays
    assert ffn[(4, "tensor")] > 2 * ffn[(4, "row")] and attention[(4, "tensor")] < 1.5 * attention[(4, "row")]
    for r in found.values():  # more bits never round worse, at either granularity
        for granularity in ("tensor", "row"):
            assert r[(8, granularity)] < r[(4, granularity)] < 1
    lines = weight_rounding.table(found)
    cells = [line.replace("\\|", "").count("|") for line in lines]  # \| is a bar inside a cell
    assert len(lines) == 2 + len(found) and cells == [3 + 6 + 1] * len(lines)
