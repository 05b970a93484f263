"""`modelshrink eval`: model and predictions modes, significance, attention, classifiers, compare."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conftest import DOCUMENTS, SUMMARIES, write_jsonl
from modelshrink.artifacts import read_manifest, staging_path
from modelshrink.cli import app
from modelshrink.errors import UserError
from modelshrink.steps.evaluate import EvalOptions, evaluate

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def rows_of(path):
    return [json.loads(line) for line in (path / "predictions.jsonl").read_text().splitlines()]


def _preds(tmp_path, name, predictions, ids=None):
    ids = ids or [f"doc-{i}" for i in range(len(predictions))]
    return write_jsonl(tmp_path / name, [{"id": i, "prediction": p} for i, p in zip(ids, predictions)])


@pytest.mark.slow
def test_model_mode_and_predictions_mode_agree(saved_models, docs_jsonl, tmp_path):
    model_path, metrics = evaluate(EvalOptions(data=str(docs_jsonl), model=str(saved_models["bart"]), device="cpu",
                                               latency_docs=2, batch_size=4), tmp_path / "model")
    assert metrics["task"] == "summarization" and metrics["documents"] == len(DOCUMENTS)
    again_path, again = evaluate(EvalOptions(data=str(model_path / "predictions.jsonl")), tmp_path / "file")
    for key in ("rouge1", "rouge2", "rougeL", "rougeLsum", "length_words", "novel_ngrams", "copy_bias",
                "leading_bias", "ci95"):
        assert metrics[key] == again[key], key
    assert [r["id"] for r in rows_of(model_path)] == [f"doc-{i}" for i in range(len(DOCUMENTS))]
    eff = metrics["efficiency"]
    assert eff["parameters"] > 0 and eff["bytes_on_disk"] == (saved_models["bart"] / "model.safetensors").stat().st_size
    assert eff["latency_items"] == 2 and eff["latency_ms_p90"] >= eff["latency_ms_p50"] > 0
    assert metrics["settings"]["generation"]["num_beams"] == 2  # from the model's generation config
    assert metrics["length_tokens"] > 0
    manifest = read_manifest(model_path)
    assert manifest["kind"] == "eval" and manifest["metrics"]["rouge1"] == metrics["rouge1"]


def test_an_eval_artifact_is_scored_again_from_its_predictions(saved_models, docs_jsonl, tmp_path):
    first, metrics = evaluate(EvalOptions(data=str(docs_jsonl), model=str(saved_models["bart"]), device="cpu",
                                          latency_docs=0, batch_size=4), tmp_path / "first")
    result = invoke("eval", first, "-o", tmp_path / "again", "--against", first, "--json", "--quiet")
    assert result.exit_code == 0, result.output
    again = json.loads(result.stdout.strip().splitlines()[-1])
    assert [again[k] for k in ("rouge1", "rouge2", "rougeL")] == [metrics[k] for k in ("rouge1", "rouge2", "rougeL")]
    assert again["against"]["p"]["rouge1"] == 1.0 and again["against"]["delta"]["rouge1"] == 0.0
    assert read_manifest(tmp_path / "again")["options"]["data"] == str(first / "predictions.jsonl")


def test_pseudolabel_artifact_is_scored_summary_against_reference(saved_models, docs_jsonl, tmp_path):
    from modelshrink.steps.pseudolabel import PseudolabelOptions, pseudolabel

    pl = pseudolabel(PseudolabelOptions(teacher=str(saved_models["t5"]), data=str(docs_jsonl), device="cpu"),
                     tmp_path / "pl")
    _, metrics = evaluate(EvalOptions(data=str(pl)), tmp_path / "e")
    pl_rows = [json.loads(x) for x in (pl / "data.jsonl").read_text().splitlines()]
    assert [r["prediction"] for r in rows_of(tmp_path / "e")] == [r["summary"] for r in pl_rows]
    assert [r["reference"] for r in rows_of(tmp_path / "e")] == SUMMARIES


def test_perfect_system_scores_100_and_beats_a_weak_one_significantly(docs_jsonl, tmp_path):
    perfect = _preds(tmp_path, "perfect.jsonl", SUMMARIES)
    weak = _preds(tmp_path, "weak.jsonl", [d.split()[0] for d in DOCUMENTS])
    _, weak_metrics = evaluate(EvalOptions(data=str(weak), references=str(docs_jsonl)), tmp_path / "weak")
    _, metrics = evaluate(EvalOptions(data=str(perfect), references=str(docs_jsonl), against=str(tmp_path / "weak"),
                                      limited_length_recall=True), tmp_path / "perfect")
    assert metrics["rouge1"] == 100.0 and metrics["ci95"]["rouge1"] == [100.0, 100.0]
    assert metrics["limited_length_recall"]["rouge1"] == 100.0
    assert all(p < 0.01 for p in metrics["against"]["p"].values())
    assert metrics["against"]["other_scores"]["rouge1"] == weak_metrics["rouge1"]
    assert metrics["against"]["same_predictions"] == 0
    _, same = evaluate(EvalOptions(data=str(weak), references=str(docs_jsonl), against=str(weak)), tmp_path / "same")
    assert all(p == 1.0 for p in same["against"]["p"].values())
    assert same["against"]["same_predictions"] == len(DOCUMENTS)
    one = _preds(tmp_path, "one.jsonl", SUMMARIES[:1] + [d.split()[0] for d in DOCUMENTS[1:]])
    _, half = evaluate(EvalOptions(data=str(one), references=str(docs_jsonl), against=str(tmp_path / "weak")),
                       tmp_path / "one")
    assert half["against"]["same_predictions"] == len(DOCUMENTS) - 1


def test_empty_prediction_scores_zero_is_counted_and_warned(docs_jsonl, tmp_path):
    preds = _preds(tmp_path, "p.jsonl", [""] + SUMMARIES[1:])
    messages = []
    _, metrics = evaluate(EvalOptions(data=str(preds), references=str(docs_jsonl)), tmp_path / "e",
                          log=messages.append)
    assert metrics["empty_predictions"] == 1 and rows_of(tmp_path / "e")[0]["scores"]["rouge1"] == 0.0
    assert any("1 empty prediction" in m for m in messages)


def test_attention_stats_and_plot(saved_models, docs_jsonl, tmp_path):
    pytest.importorskip("matplotlib")
    path, metrics = evaluate(EvalOptions(data=str(docs_jsonl), model=str(saved_models["bart"]), device="cpu",
                                         attention_stats=True, attention_plot="doc-3", latency_docs=0),
                             tmp_path / "e")
    att = metrics["attention"]
    assert len(att["evident_share_by_bin"]) == 5 and att["documents_with_evident_weights"] > 0
    assert sum(att["evident_share_by_bin"]) == pytest.approx(100.0, abs=0.01)
    assert 0 < att["evident_share_of_all_weights"] <= 100
    # by mass, not count: a row's evident weights carry more than 0.15 each of its sum of 1, so on documents of
    # more than 1 / 0.15 tokens their mass share is the larger
    assert att["evident_share_of_all_weights"] < att["evident_share_of_attention_mass"] <= 100
    png = path / "attention-doc-3.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_attention_bins_by_hand():
    import numpy as np

    from modelshrink.generation.attention_stats import evident_bins

    weights = np.zeros((1, 1, 2, 10))  # 10 source tokens: bin k holds tokens 2k and 2k+1
    weights[0, 0, 0, [0, 1, 9]] = 0.3  # two evident weights in bin 0, one in bin 4
    weights[0, 0, 1, 4] = 0.15  # not evident: the threshold is strict
    weights[0, 0, 1, 5] = 0.5  # bin 2
    shares, evident, total, mass, all_mass = evident_bins(weights)
    assert shares.tolist() == [0.5, 0.0, 0.25, 0.0, 0.25] and evident == 4 and total == 20
    assert mass == pytest.approx(0.3 * 3 + 0.5) and all_mass == pytest.approx(0.3 * 3 + 0.15 + 0.5)


@pytest.fixture
def sentiment_jsonl(tmp_path):
    rows = [{"id": f"s{i}", "sentence": d, "label": i % 2} for i, d in enumerate(DOCUMENTS)]
    return write_jsonl(tmp_path / "sentiment.jsonl", rows)


def test_classifier_model_mode_and_predictions_mode_agree(classifier_path, sentiment_jsonl, tmp_path):
    path, metrics = evaluate(EvalOptions(data=str(sentiment_jsonl), model=str(classifier_path), device="cpu",
                                         latency_docs=2), tmp_path / "m")
    assert metrics["task"] == "classification" and {"accuracy", "f1", "mcc"} <= set(metrics)
    assert "conventions" in metrics and metrics["efficiency"]["parameters"] > 0
    _, again = evaluate(EvalOptions(data=str(path / "predictions.jsonl")), tmp_path / "f")
    assert {k: again[k] for k in ("accuracy", "f1", "mcc")} == {k: metrics[k] for k in ("accuracy", "f1", "mcc")}


def test_regression_predictions(tmp_path):
    data = write_jsonl(tmp_path / "r.jsonl", [{"id": i, "prediction": i * 0.5 + (i % 3) * 0.1, "label": i * 0.7}
                                              for i in range(10)])
    _, metrics = evaluate(EvalOptions(data=str(data)), tmp_path / "e")
    assert metrics["task"] == "regression" and metrics["spearman"] == pytest.approx(100.0)


def test_compare_table_significance_and_figure(saved_models, docs_jsonl, tmp_path):
    pytest.importorskip("matplotlib")
    from modelshrink.evaluation.compare import compare

    a, _ = evaluate(EvalOptions(data=str(docs_jsonl), model=str(saved_models["bart"]), device="cpu",
                                latency_docs=0), tmp_path / "a")
    b, _ = evaluate(EvalOptions(data=str(docs_jsonl), model=str(saved_models["t5"]), device="cpu", latency_docs=0),
                    tmp_path / "b")
    path, result = compare([str(a), str(b)], tmp_path / "cmp")
    assert [s["name"] for s in result["systems"]] == ["a", "b"]
    assert result["systems"][0]["p_vs_first"] == {} and set(result["systems"][1]["p_vs_first"]) == {
        "rouge1", "rouge2", "rougeL", "rougeLsum"}
    assert (path / "quality-vs-footprint.png").read_bytes()[:4] == b"\x89PNG"
    cli = invoke("eval", "--compare", saved_models["bart"], b, "--data", docs_jsonl, "-o", tmp_path / "cmp2",
                 "--latency-docs", "0")
    assert cli.exit_code == 0, cli.stderr
    assert json.loads((tmp_path / "cmp2" / "comparison.json").read_text())["systems"][0]["name"] == "bart"


def test_json_output_has_the_promised_keys(saved_models, docs_jsonl, classifier_path, sentiment_jsonl, tmp_path):
    result = invoke("eval", saved_models["bart"], docs_jsonl, "-o", tmp_path / "e", "--json", "--latency-docs", "0")
    assert result.exit_code == 0, result.stderr
    metrics = json.loads(result.stdout)
    assert {"rouge1", "rouge2", "rougeL", "rougeLsum", "novel_ngrams", "length_words", "ci95"} <= set(metrics)
    assert set(metrics["novel_ngrams"]) == {"1", "2", "3", "4"}
    result = invoke("eval", classifier_path, sentiment_jsonl, "-o", tmp_path / "c", "--json", "--latency-docs", "0")
    assert result.exit_code == 0, result.stderr
    assert {"accuracy", "f1", "mcc"} <= set(json.loads(result.stdout))
    plain = invoke("eval", tmp_path / "e" / "predictions.jsonl", "-o", tmp_path / "p")
    assert plain.exit_code == 0 and plain.stdout == f"{tmp_path / 'p'}\n"


def test_reference_size_gives_the_compression_ratio(saved_models, docs_jsonl, tmp_path):
    _, metrics = evaluate(EvalOptions(data=str(docs_jsonl), model=str(saved_models["bart"]), device="cpu",
                                      latency_docs=0, reference_size=str(saved_models["t5"])), tmp_path / "e")
    eff = metrics["efficiency"]

    def weights(folder) -> int:  # the bytes of the weights files themselves, as the shell counts them
        return sum(p.stat().st_size for p in folder.glob("*.safetensors"))

    bart, t5 = weights(saved_models["bart"]), weights(saved_models["t5"])
    assert bart > 0 and t5 > 0 and (eff["bytes_on_disk"], eff["reference_bytes_on_disk"]) == (bart, t5)
    assert eff["compression_ratio"] == pytest.approx(t5 / bart, abs=1e-4)


def _assert_bad(args, *fragments, out):
    result = invoke("eval", *args, "-o", out)
    assert result.exit_code == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: ") and all(f in lines[-1] for f in fragments), result.stderr
    assert not out.exists() and not staging_path(out).exists()


def test_bad_input(saved_models, classifier_path, docs_jsonl, sentiment_jsonl, tmp_path):
    out = tmp_path / "out"
    short = _preds(tmp_path, "short.jsonl", SUMMARIES[:5])
    _assert_bad([short, "--references", docs_jsonl], "predictions (5) and references (12) do not match", out=out)
    renamed = _preds(tmp_path, "renamed.jsonl", SUMMARIES, ids=[f"x-{i}" for i in range(12)])
    _assert_bad([renamed, "--references", docs_jsonl], "do not match by id", "no reference for x-0", out=out)
    no_ref = write_jsonl(tmp_path / "noref.jsonl", [{"id": 1, "prediction": "a", "document": "b"}])
    _assert_bad([no_ref], "no reference column", "columns found: id, prediction, document", out=out)
    _assert_bad([classifier_path, sentiment_jsonl, "--limited-length-recall"],
                "--limited-length-recall applies to summarization", "classification", out=out)
    _assert_bad([classifier_path, sentiment_jsonl, "--num-beams", "4"], "--num-beams applies to summarization",
                out=out)
    _assert_bad([saved_models["bart"], docs_jsonl, "--label-column", "label"],
                "--label-column applies to classification", out=out)
    three = write_jsonl(tmp_path / "three.jsonl", [{"sentence": "a b", "label": 3}])
    _assert_bad([classifier_path, three], "has label 3", "2 classes", out=out)
    _assert_bad([saved_models["bart"]], "is a model; give the data", out=out)
    _assert_bad([short, "--references", docs_jsonl, "--attention-stats"], "needs a model", out=out)
    for generator in ("static", "transformers"):  # a predictions file runs no search
        _assert_bad([short, "--references", docs_jsonl, "--generator", generator], f"--generator {generator}",
                    "needs a model", out=out)
    other = _preds(tmp_path, "other.jsonl", SUMMARIES[:3])
    _assert_bad([short, "--references", docs_jsonl, "--against", other], out=out)


def test_against_with_mismatched_ids(docs_jsonl, tmp_path):
    preds = _preds(tmp_path, "p.jsonl", SUMMARIES)
    other = _preds(tmp_path, "o.jsonl", SUMMARIES[:6])
    with pytest.raises(UserError, match="--against .* has 6 documents, this run 12"):
        evaluate(EvalOptions(data=str(preds), references=str(docs_jsonl), against=str(other)), tmp_path / "e")
    assert not (tmp_path / "e").exists()


def test_a_system_against_itself_has_p_one(docs_jsonl, tmp_path):
    """Per-document scores that do not round evenly (whole documents scored against short summaries):
    both sides of the paired test must be scored alike, or p drifts below 1."""
    own = _preds(tmp_path, "own.jsonl", DOCUMENTS)
    result = runner.invoke(app, ["eval", str(own), "--references", str(docs_jsonl), "--against", str(own), "-o",
                                 str(tmp_path / "e"), "--json"])
    assert result.exit_code == 0, result.stderr
    against = json.loads(result.stdout)["against"]
    assert all(p == 1.0 for p in against["p"].values()) and all(d == 0 for d in against["delta"].values())
    artifact = runner.invoke(app, ["eval", str(own), "--references", str(docs_jsonl), "--against",
                                   str(tmp_path / "e"), "-o", str(tmp_path / "e2"), "--json"])
    assert all(p == 1.0 for p in json.loads(artifact.stdout)["against"]["p"].values())
