"""ROUGE per document, with rouge-score doing the counting.

Scores are kept per document (not only the corpus mean) so that `stats` can put a bootstrap
interval on them and test two systems against each other on the same documents.
"""

from __future__ import annotations

import re
from importlib.metadata import version

import numpy as np
from rouge_score import rouge_scorer

from modelshrink.metrics.names import ROUGE_METRICS

# Closing quotes and brackets that may sit between the end mark and the whitespace: `He said "no."`
_SENTENCE_END = re.compile(r"""([.!?]["'”’»)\]}]*)\s+""")

SENTENCE_RULE = ("a sentence ends at a line break, and after '.', '!' or '?' (optionally followed by "
                 "closing quotes or brackets) when whitespace follows; no abbreviation handling, so "
                 "'Dr. Smith' is two pieces; pieces are stripped and empty ones dropped")


def split_sentences(text: str) -> list[str]:
    """Split `text` into sentences with a regex, so no tokenizer model has to be downloaded.

    Rule: a sentence ends at a line break, and after '.', '!' or '?' (optionally followed by closing
    quotes or brackets) when whitespace follows. Abbreviations are not recognised ('Dr. Smith'
    splits after 'Dr.'); a period without whitespace after it ('3.5', 'e.g.,') does not split.
    Pieces are stripped of surrounding whitespace and empty pieces are dropped.
    """
    marked = _SENTENCE_END.sub("\\1\n", text)
    return [piece.strip() for piece in marked.splitlines() if piece.strip()]


def _lsum_text(text: str) -> str:
    # rouge-score splits rougeLsum on "\n" only (its nltk splitter needs a downloaded model).
    return "\n".join(split_sentences(text))


def _check_lengths(predictions: list[str], references: list[str]) -> None:
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")


def rouge_per_document(predictions: list[str], references: list[str]) -> dict[str, np.ndarray]:
    """ROUGE-1/2/L/Lsum F1 × 100 of each prediction against its reference, stemming on.

    rouge1/2/L see the texts as given; rougeLsum sees both texts split by `split_sentences` and
    joined with newlines. An empty prediction scores 0.
    """
    _check_lengths(predictions, references)
    # Two scorers rather than one with all four keys: rouge-score computes each key independently,
    # so the numbers are the same, and each text is tokenized once per scorer instead of twice.
    plain = rouge_scorer.RougeScorer(list(ROUGE_METRICS[:3]), use_stemmer=True)
    lsum = rouge_scorer.RougeScorer(["rougeLsum"], use_stemmer=True)
    scores = {key: np.zeros(len(predictions)) for key in ROUGE_METRICS}
    for i, (prediction, reference) in enumerate(zip(predictions, references)):
        for key, score in plain.score(reference, prediction).items():
            scores[key][i] = 100.0 * score.fmeasure
        scores["rougeLsum"][i] = 100.0 * lsum.score(_lsum_text(reference), _lsum_text(prediction))[
            "rougeLsum"].fmeasure
    return scores


def limited_length_recall_per_document(predictions: list[str], references: list[str]) -> dict[str, np.ndarray]:
    """ROUGE-1/2/L recall × 100 after cutting each prediction to its reference's word count.

    This is the New York Times protocol (Durrett et al. 2016, used by PLATE): with recall alone, a
    longer summary could only gain, so the prediction is truncated to as many whitespace-separated
    words as its reference has.
    """
    _check_lengths(predictions, references)
    keys = ROUGE_METRICS[:3]
    scorer = rouge_scorer.RougeScorer(list(keys), use_stemmer=True)
    scores = {key: np.zeros(len(predictions)) for key in keys}
    for i, (prediction, reference) in enumerate(zip(predictions, references)):
        truncated = " ".join(prediction.split()[:len(reference.split())])
        for key, score in scorer.score(reference, truncated).items():
            scores[key][i] = 100.0 * score.recall
    return scores


ROUGE_SETTINGS: dict = {
    "package": "rouge-score",
    "version": version("rouge-score"),
    "use_stemmer": True,
    "scores": "F1 x 100 per document, averaged over documents",
    "limited_length_recall": "recall x 100 after truncating the prediction to the reference's "
                             "whitespace word count (NYT protocol)",
    "tokenizer": "rouge-score default: lowercase, runs of [a-z0-9] (other characters separate tokens), "
                 "Porter stemmer on tokens longer than 3 characters",
    "rougeLsum_sentence_split": SENTENCE_RULE,
}
