"""Cross-attention statistics taken at the attention temperature a model generates with (PLATE
Fig. 1 and 2): `pseudolabel --attention-stats` at the teacher's λ, and `eval` with the same λ options."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from modelshrink.errors import UserError
from modelshrink.steps.evaluate import EvalOptions, evaluate
from modelshrink.generation.plate import row_lambda
from modelshrink.steps.pseudolabel import PseudolabelOptions, pseudolabel

from conftest import read_rows


def _entropy(weights: np.ndarray) -> np.ndarray:
    return -(weights * np.log(np.clip(weights, 1e-12, None))).sum(axis=-1)


def test_recorded_weights_are_those_of_the_lambda(saved_models):
    """Attention at λ = 4 is softmax(z / 2): every row's entropy is at least λ = 1's (entropy grows
    with the temperature), and some grow strictly."""
    from modelshrink.generation.attention_stats import cross_attention
    from modelshrink.models.loading import load_seq2seq
    from modelshrink.generation.plate import attention_temperature, lambdas_by_kind

    model, tok, family = load_seq2seq(str(saved_models["bart"]), "model", False, "cpu")
    enc = tok(["the cat sat on the mat and looked at the dog", "a short one"], padding=True, return_tensors="pt")
    sequences = torch.tensor([[2, 0, 31, 40, 41, 2], [2, 0, 50, 2, 1, 1]])
    cold = cross_attention(model, enc["input_ids"], enc["attention_mask"], sequences)
    with attention_temperature(family.attention_modules(model), lambdas_by_kind(4.0)):
        warm = cross_attention(model, enc["input_ids"], enc["attention_mask"], sequences)
    for c, w in zip(cold, warm):
        assert c.shape == w.shape
        assert (_entropy(w) >= _entropy(c) - 1e-5).all() and (_entropy(w) > _entropy(c) + 1e-3).any()


def test_pseudolabel_attention_stats_at_the_teachers_lambda_match_eval(saved_models, docs_jsonl, tmp_path):
    pytest.importorskip("matplotlib")
    teacher = str(saved_models["bart"])
    stats = {}
    for lam in (1.0, 16.0):
        pl = pseudolabel(PseudolabelOptions(teacher=teacher, data=str(docs_jsonl), device="cpu", lam=lam,
                                            attention_stats=True, attention_plot="doc-2"), tmp_path / f"pl-{lam}")
        manifest = json.loads((pl / "modelshrink.json").read_text())
        stats[lam] = manifest["metrics"]["attention"]
        assert sum(stats[lam]["evident_share_by_bin"]) == pytest.approx(100.0, abs=0.01)
        assert manifest["resolved"]["attention_plot"] == "attention-doc-2.png"
        assert (pl / "attention-doc-2.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert all("_attention" not in r for r in read_rows(pl))  # the feed for distill stays clean
    # A far softer attention leaves fewer weights above 0.15.
    assert stats[16.0]["evident_share_of_all_weights"] < stats[1.0]["evident_share_of_all_weights"]

    # eval at the same λ writes the same summaries and measures the same attention.
    path, metrics = evaluate(EvalOptions(model=teacher, data=str(docs_jsonl), device="cpu", lam=16.0,
                                         attention_stats=True, latency_docs=0), tmp_path / "eval-16")
    assert metrics["attention"] == stats[16.0]
    predictions = [json.loads(x)["prediction"] for x in (path / "predictions.jsonl").read_text().splitlines()]
    assert predictions == [r["summary"] for r in read_rows(tmp_path / "pl-16.0")]
    assert json.loads((path / "modelshrink.json").read_text())["resolved"]["lambda_by_kind"] == {
        "encoder_self": 16.0, "decoder_self": 16.0, "decoder_cross": 16.0}


def test_eval_draws_the_same_per_document_lambda_as_pseudolabel(saved_models, docs_jsonl, tmp_path):
    teacher = str(saved_models["t5"])
    pl = pseudolabel(PseudolabelOptions(teacher=teacher, data=str(docs_jsonl), device="cpu", lambda_range=(1.0, 3.0),
                                        seed=5), tmp_path / "pl")
    path, _ = evaluate(EvalOptions(model=teacher, data=str(docs_jsonl), device="cpu", lambda_range=(1.0, 3.0), seed=5,
                                   attention_stats=True, latency_docs=1), tmp_path / "e")
    rows = [json.loads(x) for x in (path / "predictions.jsonl").read_text().splitlines()]
    assert [r["lambda"] for r in rows] == [row_lambda(5, i, 1.0, 3.0) for i in range(len(rows))]
    assert [r["prediction"] for r in rows] == [r["summary"] for r in read_rows(pl)]


@pytest.mark.parametrize("case", ["pseudolabel plot id", "eval plot id", "predictions file", "classifier",
                                  "range reversed", "range and lambda"])
def test_refused_before_anything_is_written(case, saved_models, classifier_path, docs_jsonl, tmp_path):
    out = tmp_path / "out"
    teacher = str(saved_models["bart"])
    calls = {
        "pseudolabel plot id": (lambda: pseudolabel(PseudolabelOptions(teacher=teacher, data=str(docs_jsonl),
                                                                       attention_plot="no-such-doc"), out),
                                "no document with id 'no-such-doc'"),
        "eval plot id": (lambda: evaluate(EvalOptions(model=teacher, data=str(docs_jsonl), attention_plot="nope"), out),
                         "no document with id 'nope'"),
        "predictions file": (lambda: evaluate(EvalOptions(data=str(docs_jsonl), lam=2.0), out),
                             "--lambda sets the attention temperature a model generates at"),
        "classifier": (lambda: evaluate(EvalOptions(model=str(classifier_path), data=str(docs_jsonl),
                                                    lambda_cross=2.0), out), "--lambda-cross applies to summarization"),
        "range reversed": (lambda: EvalOptions(model=teacher, data=str(docs_jsonl), lambda_range=(2.0, 1.0)),
                           "A <= B"),
        "range and lambda": (lambda: EvalOptions(model=teacher, data=str(docs_jsonl), lambda_range=(1.0, 2.0), lam=2.0),
                             "exclude each other"),
    }
    call, message = calls[case]
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        call()
    assert not out.exists() and not list(tmp_path.glob(".out*"))


def test_help_lists_the_temperature_options_on_both_steps():
    from typer.testing import CliRunner

    from modelshrink.cli import app

    for step in ("pseudolabel", "eval"):
        text = CliRunner().invoke(app, [step, "--help"], env={"COLUMNS": "200"}).output
        for flag in ("--lambda ", "--lambda-range", "--lambda-cross", "--attention-stats", "--attention-plot"):
            assert flag in text, (step, flag)
