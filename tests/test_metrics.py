"""Metric functions of `modelshrink eval`: checked against rouge-score, scikit-learn and scipy, and
on small examples worked out by hand."""

from __future__ import annotations

import json
from importlib.metadata import version

import numpy as np
import pytest
from rouge_score import rouge_scorer

from modelshrink.metrics.glue import GLUE_CONVENTIONS, classification_metrics, regression_metrics
from modelshrink.metrics.names import ROUGE_METRICS
from modelshrink.metrics.rouge import (ROUGE_SETTINGS, limited_length_recall_per_document, rouge_per_document,
                                       split_sentences)
from modelshrink.metrics.stats import SIGNIFICANCE_METHODS, bootstrap_ci, paired_test
from modelshrink.metrics.style import copy_bias, leading_bias, length_words, ngrams, novel_ngrams, words

PAIRS = [  # (prediction, reference)
    ("The cat sat on the mat. It was happy.", "A cat was sitting on the mat! The cat looked happy."),
    ("Police arrested two men on Tuesday.\nThey were charged with theft.",
     'Two men were arrested by police. "They stole cars," officials said. Charges followed.'),
    ("Stocks rose 3.5 percent in early trading", "Shares climbed 3.5% in early trading on Monday."),
    ("", "An empty prediction scores zero."),
    ("Running runners ran quickly?! Yes (they did.) Then stopped.", "The runner runs quickly. They stopped."),
]


# --- ROUGE ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("The cat sat. The dog ran!  Did it? Yes.", ["The cat sat.", "The dog ran!", "Did it?", "Yes."]),
    ('He said "stop." Then he left.', ['He said "stop."', "Then he left."]),
    ("(It rained.) We stayed in. 'Fine!' she said.", ["(It rained.)", "We stayed in.", "'Fine!'", "she said."]),
    ("first line\nsecond line\r\n\n   third  ", ["first line", "second line", "third"]),
    ("Wait... what?! Really", ["Wait...", "what?!", "Really"]),
    ("Pi is 3.14 today.Next no space", ["Pi is 3.14 today.Next no space"]),
    ("One; two: three, four", ["One; two: three, four"]),
    ("", []),
    ("  \n \n", []),
])
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_rouge_matches_rouge_score():
    predictions, references = zip(*PAIRS)
    scores = rouge_per_document(list(predictions), list(references))
    scorer = rouge_scorer.RougeScorer(list(ROUGE_METRICS), use_stemmer=True)
    for i, (prediction, reference) in enumerate(PAIRS):
        direct = scorer.score(reference, prediction)
        for key in ("rouge1", "rouge2", "rougeL"):
            assert scores[key][i] == pytest.approx(100 * direct[key].fmeasure, abs=1e-9), (key, i)
        lsum = scorer.score("\n".join(split_sentences(reference)), "\n".join(split_sentences(prediction)))
        assert scores["rougeLsum"][i] == pytest.approx(100 * lsum["rougeLsum"].fmeasure, abs=1e-9), i
    assert set(scores) == set(ROUGE_METRICS)
    assert all(scores[key][3] == 0.0 for key in ROUGE_METRICS)  # the empty prediction
    # Sentence splitting changes rougeLsum: one unsplit line would give rougeLsum == rougeL.
    assert scores["rougeLsum"][0] != pytest.approx(scores["rougeL"][0])


def test_rouge_length_mismatch():
    with pytest.raises(ValueError):
        rouge_per_document(["a"], ["a", "b"])
    with pytest.raises(ValueError):
        limited_length_recall_per_document(["a", "b"], ["a"])


def test_limited_length_recall_truncates_to_reference_length():
    reference = "the cat sat on the mat"  # 6 words
    prediction = "the cat sat here today now the cat sat on the mat"  # 12 words: cut to the first 6
    short = "the cat"  # shorter than the reference: not padded
    scores = limited_length_recall_per_document([prediction, short], [reference, reference])
    assert set(scores) == {"rouge1", "rouge2", "rougeL"}
    # Kept: "the cat sat here today now". Unigrams: the, cat, sat match 3 of the reference's 6 → 50.
    # Bigrams: "the cat", "cat sat" match 2 of 5 → 40. LCS "the cat sat" = 3 of 6 → 50.
    assert scores["rouge1"][0] == pytest.approx(50.0)
    assert scores["rouge2"][0] == pytest.approx(40.0)
    assert scores["rougeL"][0] == pytest.approx(50.0)
    # Untruncated, the prediction contains the whole reference: recall would be 100.
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    assert scorer.score(reference, prediction)["rouge1"].recall == 1.0
    truncated = scorer.score(reference, "the cat sat here today now")
    for key in scores:
        assert scores[key][0] == pytest.approx(100 * truncated[key].recall)
    # "the cat": 2 of 6 unigrams, 1 of 5 bigrams, LCS 2 of 6.
    assert scores["rouge1"][1] == pytest.approx(100 * 2 / 6)
    assert scores["rouge2"][1] == pytest.approx(100 * 1 / 5)
    assert scores["rougeL"][1] == pytest.approx(100 * 2 / 6)


def test_rouge_settings_are_json():
    settings = json.loads(json.dumps(ROUGE_SETTINGS))
    assert settings["package"] == "rouge-score"
    assert settings["version"] == version("rouge-score")
    assert settings["use_stemmer"] is True
    assert "line break" in settings["rougeLsum_sentence_split"]


# --- bootstrap interval and significance -------------------------------------------------------

def test_bootstrap_ci_deterministic_and_contains_mean():
    values = np.random.default_rng(3).normal(40.0, 10.0, size=100)
    low, high = bootstrap_ci(values, seed=7)
    assert (low, high) == bootstrap_ci(values, seed=7)
    assert (low, high) != bootstrap_ci(values, seed=8)
    assert low < values.mean() < high
    # The standard error is 10 / sqrt(100) = 1, so a 95% interval is about ±1.96 wide.
    assert 3.0 < high - low < 5.0


def test_bootstrap_ci_narrows_with_more_data():
    rng = np.random.default_rng(0)
    small, large = rng.normal(0, 1, size=25), rng.normal(0, 1, size=2500)
    width_small = np.subtract(*bootstrap_ci(small)[::-1])
    width_large = np.subtract(*bootstrap_ci(large)[::-1])
    assert width_large < width_small / 5  # 10x the documents: about 1/10 the width


def test_bootstrap_ci_single_value_and_confidence():
    assert bootstrap_ci([42.0]) == (42.0, 42.0)
    values = np.random.default_rng(1).normal(size=50)
    narrow, wide = bootstrap_ci(values, confidence=0.5), bootstrap_ci(values, confidence=0.99)
    assert wide[0] < narrow[0] < narrow[1] < wide[1]
    with pytest.raises(ValueError):
        bootstrap_ci([])


def _planted_difference():
    rng = np.random.default_rng(1)
    a = rng.normal(40.0, 10.0, size=200)
    return a, a - 5.0 + rng.normal(0.0, 2.0, size=200)


@pytest.mark.parametrize("method", SIGNIFICANCE_METHODS)
def test_paired_test_finds_planted_difference(method):
    a, b = _planted_difference()
    p = paired_test(a, b, method=method)
    assert p < 0.01
    assert p == pytest.approx(1 / 10001)  # no resample reaches a 5-point mean difference
    assert paired_test(b, a, method=method) == p  # two-sided


@pytest.mark.parametrize("method", SIGNIFICANCE_METHODS)
def test_paired_test_same_system_gives_one(method):
    a, _ = _planted_difference()
    assert paired_test(a, a.copy(), method=method) == 1.0


@pytest.mark.parametrize("method", SIGNIFICANCE_METHODS)
def test_paired_test_no_true_difference(method):
    # Seed 0: a paired t-test gives p ≈ 0.34 on these, and so do both resampling tests.
    rng = np.random.default_rng(0)
    base = rng.normal(40.0, 10.0, size=200)
    a, b = base + rng.normal(0.0, 3.0, size=200), base + rng.normal(0.0, 3.0, size=200)
    p = paired_test(a, b, method=method, seed=0)
    assert 0.05 < p < 1.0
    assert p == paired_test(a, b, method=method, seed=0)


def test_paired_test_permutation_counts_sign_flips():
    # d = (1, 1): of the four sign patterns, (+,+) and (-,-) reach |mean| = 1, so p ≈ 0.5.
    assert paired_test([1.0, 1.0], [0.0, 0.0], resamples=20000) == pytest.approx(0.5, abs=0.02)


def test_paired_test_rejects_bad_input():
    with pytest.raises(ValueError):
        paired_test([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        paired_test([1.0], [2.0], method="t-test")


# --- style and bias ----------------------------------------------------------------------------

def test_words_and_ngrams():
    assert words("The CAT's 2 mats!") == ["the", "cat", "s", "2", "mats"]
    assert ngrams(["a", "b", "c"], 2) == [("a", "b"), ("b", "c")]
    assert ngrams(["a"], 2) == []


def test_novel_ngrams_and_copy_bias_pooled():
    documents = ["The cat sat on the mat.", "Dogs bark loudly."]
    summaries = ["the cat sat on a mat", "Dogs BARK loudly"]
    # Pair 1, summary "the cat sat on a mat" against "the cat sat on the mat":
    #   1-grams: only "a" is new           → 1 of 6
    #   2-grams: "on a", "a mat" are new   → 2 of 5
    #   3-grams: "sat on a", "on a mat"    → 2 of 4
    #   4-grams: "cat sat on a", "sat on a mat" → 2 of 3
    # Pair 2 is copied (case does not matter): 0 of 3, 0 of 2, 0 of 1, and no 4-grams.
    # Pooled: 1/9, 2/7, 2/5, 2/3 (a mean of per-document percentages would give 8.33 for 1-grams).
    novel = novel_ngrams(summaries, documents)
    assert novel == pytest.approx({"1": 100 / 9, "2": 200 / 7, "3": 40.0, "4": 200 / 3})
    # Copied 4-grams: "the cat sat on" is the 1 of 3.
    assert copy_bias(summaries, documents) == pytest.approx(100 / 3)


def test_novel_ngrams_counts_repeats_and_handles_no_ngrams():
    # Summary 1-grams "x", "x", "the": "the" is in the document, both "x" are not → 2 of 3.
    assert novel_ngrams(["x x the"], ["the"], orders=(1,)) == {"1": pytest.approx(200 / 3)}
    # "the", "the", "x": repeats of a copied word count as copied → 1 of 3.
    assert novel_ngrams(["the the x"], ["the"], orders=(1,)) == {"1": pytest.approx(100 / 3)}
    # Two words make no 3- or 4-grams: those orders report 0.0, and so does copy bias.
    novel = novel_ngrams(["brand new"], ["something else entirely here"])
    assert novel == {"1": 100.0, "2": 100.0, "3": 0.0, "4": 0.0}
    assert copy_bias(["brand new"], ["something else entirely here"]) == 0.0


def test_leading_bias_hand_worked():
    document = ("The mayor opened a new bridge on Monday. Traffic in the city centre had been heavy for years. "
                "Local shops expect more customers this winter. Critics said the project cost too much money. "
                "The weather was sunny and warm all week.")
    summary = "The mayor opened a bridge. Critics said it cost too much. The weather was sunny."
    # Five document sentences; with lead 0.4, indices 0 and 1 lead ((i + 1) / 5 <= 0.4).
    # The summary's sentences match indices 0 (leading), 3 and 4 (not) → 1 of 3.
    assert leading_bias([summary], [document]) == pytest.approx(100 / 3)
    # A two-sentence document: index 0 gives (0 + 1) / 2 = 0.5 > 0.4, but the first sentence always leads.
    short_doc, short_summary = "Rain fell all day. The river rose quickly.", "Rain fell all day."
    assert leading_bias([short_summary], [short_doc]) == 100.0
    assert leading_bias(["The river rose."], [short_doc]) == 0.0
    # Pooled over both pairs: (1 + 1) leading of (3 + 1) sentences.
    assert leading_bias([summary, short_summary], [document, short_doc]) == pytest.approx(50.0)
    # With the whole document as the lead, every sentence leads.
    assert leading_bias([summary], [document], lead=1.0) == 100.0


def test_leading_bias_ties_go_to_earliest_sentence():
    # "Cats purr." matches sentences 0 and 2 equally: the earliest (0) wins, so it leads.
    assert leading_bias(["Cats purr."], ["Cats purr. Dogs bark. Cats purr."]) == 100.0
    # Index 2 of 3 alone would not lead: (2 + 1) / 3 = 1 > 0.4.
    assert leading_bias(["Owls hoot."], ["Cats purr. Dogs bark. Owls hoot."]) == 0.0
    assert leading_bias([], []) == 0.0
    assert leading_bias([""], ["Some document."]) == 0.0


def test_leading_bias_leaves_out_sentences_with_no_match():
    # "Owls hoot." shares no word with the document: it has no position, so only "Dogs bark." (index 1
    # of 3, (1 + 1) / 3 > 0.4, not leading) counts: 0 of 1, not 1 of 2 as a tie at sentence 0 would give.
    assert leading_bias(["Owls hoot. Dogs bark."], ["Cats purr. Dogs bark. Cats sleep."]) == 0.0
    assert leading_bias(["Owls hoot."], ["Cats purr. Dogs bark."]) == 0.0


def test_length_words():
    # (3 + 1 + 5) / 3: newlines separate words too.
    assert length_words(["one two three", "four", "  five six\nseven eight nine "]) == pytest.approx(3.0)
    assert length_words([]) == 0.0


def test_style_length_mismatch():
    with pytest.raises(ValueError):
        novel_ngrams(["a"], [])
    with pytest.raises(ValueError):
        leading_bias(["a"], ["a", "b"])


# --- GLUE --------------------------------------------------------------------------------------

def test_classification_metrics_match_sklearn():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    for trial in range(5):
        labels, predictions = rng.integers(0, 2, size=60), rng.integers(0, 2, size=60)
        got = classification_metrics(predictions, labels)
        assert got["accuracy"] == pytest.approx(100 * metrics.accuracy_score(labels, predictions), abs=1e-6)
        assert got["f1"] == pytest.approx(100 * metrics.f1_score(labels, predictions), abs=1e-6)
        assert got["mcc"] == pytest.approx(100 * metrics.matthews_corrcoef(labels, predictions), abs=1e-6)
        # Three classes (MNLI-like); predictions use a class the labels never do on some trials.
        labels, predictions = rng.integers(0, 3, size=60), rng.integers(0, 3 + trial % 2, size=60)
        got = classification_metrics(predictions, labels)
        assert got["accuracy"] == pytest.approx(100 * metrics.accuracy_score(labels, predictions), abs=1e-6)
        assert got["f1"] == pytest.approx(100 * metrics.f1_score(labels, predictions, average="macro"), abs=1e-6)
        assert got["mcc"] == pytest.approx(100 * metrics.matthews_corrcoef(labels, predictions), abs=1e-6)


def test_classification_metrics_edge_cases():
    # Labels {1, 2} are not {0, 1}: macro F1. Class 1: tp 1, fp 0, fn 1 → 2/3; class 2: tp 1, fp 1, fn 0 → 2/3.
    assert classification_metrics([1, 2, 2], [1, 1, 2])["f1"] == pytest.approx(200 / 3)
    # One predicted class: MCC is undefined and reported as 0; F1 of class 1 is 0.
    constant = classification_metrics([0, 0, 0, 0], [0, 1, 0, 1])
    assert constant == {"accuracy": 50.0, "f1": 0.0, "mcc": 0.0}
    assert classification_metrics([1, 0, 1], [1, 0, 1]) == {"accuracy": 100.0, "f1": 100.0, "mcc": 100.0}
    with pytest.raises(ValueError):
        classification_metrics([0, 1], [0])


def test_regression_metrics_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 11, size=80) / 2.0  # STS-B-like 0..5 in halves: many ties
    predictions = np.round(labels + rng.normal(0, 1.0, size=80), 1)  # ties on the prediction side too
    got = regression_metrics(predictions, labels)
    assert got["pearson"] == pytest.approx(100 * stats.pearsonr(predictions, labels)[0], abs=1e-6)
    assert got["spearman"] == pytest.approx(100 * stats.spearmanr(predictions, labels)[0], abs=1e-6)
    continuous = rng.normal(size=80)
    got = regression_metrics(continuous, labels)
    assert got["spearman"] == pytest.approx(100 * stats.spearmanr(continuous, labels)[0], abs=1e-6)


def test_regression_metrics_constant_side_is_zero():
    assert regression_metrics([0.1, 0.1, 0.1], [1.0, 2.0, 3.0]) == {"pearson": 0.0, "spearman": 0.0}
    assert regression_metrics([3.0, 1.0, 2.0], [1.0, 2.0, 3.0])["spearman"] == pytest.approx(-50.0)


def test_glue_conventions_name_every_metric():
    names = set(classification_metrics([0, 1], [0, 1])) | set(regression_metrics([0.0, 1.0], [0.0, 1.0]))
    assert names == set(GLUE_CONVENTIONS)
    assert "CoLA" in GLUE_CONVENTIONS["mcc"]
