"""Summary style and bias statistics from PLATE (Zhang et al., "Attention Temperature Matters in
Abstractive Summarization Distillation"): how much a summary copies from its document (novel
n-grams, copy bias), where in the document its sentences come from (leading bias), and its length.

Percentages are pooled over the corpus (counts summed over all documents, then divided), so long
summaries weigh more than short ones.
"""

from __future__ import annotations

import re

import numpy as np
from rouge_score import rouge_scorer, tokenizers

from modelshrink.metrics.rouge import split_sentences

_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    """Tokens for n-gram statistics: runs matching `[a-z0-9]+` in the lowercased text (no stemming)."""
    return _WORD.findall(text.lower())


def ngrams(tokens, n: int) -> list[tuple]:
    """The n-grams of `tokens` in order, repeats kept."""
    return list(zip(*(tokens[i:] for i in range(n))))


def _check_pairs(summaries: list[str], documents: list[str]) -> None:
    if len(summaries) != len(documents):
        raise ValueError(f"{len(summaries)} summaries but {len(documents)} documents")


def _novel_and_total(summaries: list[str], documents: list[str], n: int) -> tuple[int, int]:
    novel = total = 0
    for summary, document in zip(summaries, documents):
        seen = set(ngrams(words(document), n))
        grams = ngrams(words(summary), n)
        total += len(grams)
        novel += sum(gram not in seen for gram in grams)
    return novel, total


def novel_ngrams(summaries: list[str], documents: list[str], orders=(1, 2, 3, 4)) -> dict[str, float]:
    """Percent of summary n-grams, per order, that appear nowhere in their own document (pooled)."""
    _check_pairs(summaries, documents)
    result = {}
    for n in orders:
        novel, total = _novel_and_total(summaries, documents, n)
        result[str(n)] = 100.0 * novel / total if total else 0.0
    return result


def copy_bias(summaries: list[str], documents: list[str]) -> float:
    """Percent of summary 4-grams (pooled) that also occur in their document; 0.0 without any."""
    _check_pairs(summaries, documents)
    novel, total = _novel_and_total(summaries, documents, 4)
    return 100.0 * (total - novel) / total if total else 0.0


class _DocumentTokenizer(tokenizers.Tokenizer):
    """rouge-score's default tokenizer (stemming on) that remembers the texts of one document.

    Every summary sentence is scored against every document sentence, and Porter-stemming the same
    sentences again costs about two thirds of each score; `forget` bounds the memory per document.
    """

    def __init__(self) -> None:
        self._tokenizer = tokenizers.DefaultTokenizer(use_stemmer=True)
        self._seen: dict[str, list[str]] = {}

    def tokenize(self, text: str) -> list[str]:
        if text not in self._seen:
            self._seen[text] = self._tokenizer.tokenize(text)
        return self._seen[text]

    def forget(self) -> None:
        self._seen.clear()


def leading_bias(summaries: list[str], documents: list[str], lead: float = 0.4) -> float:
    """Percent of summary sentences (pooled) whose best-matching document sentence is in the lead.

    Each summary sentence is matched to the document sentence with the highest ROUGE-1 F1 + ROUGE-2
    F1 (rouge-score, stemming on; ties go to the earliest sentence). Document sentence i (0-based)
    of n is in the lead when (i + 1) / n <= lead, and the first sentence always is. Sentences come
    from `split_sentences`. A summary sentence that shares no word with any sentence of its document
    (or whose document has no sentences) has no position to be matched to and is left out of the
    share; otherwise an entirely novel sentence would tie at zero and count as leading.
    """
    _check_pairs(summaries, documents)
    if not 0.0 <= lead <= 1.0:
        raise ValueError(f"lead must be a fraction of the document between 0 and 1, got {lead}")
    tokenizer = _DocumentTokenizer()
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2"], tokenizer=tokenizer)
    leading = total = 0
    for summary, document in zip(summaries, documents):
        tokenizer.forget()
        doc_sentences = split_sentences(document)
        for sentence in split_sentences(summary):
            if not doc_sentences:
                continue
            similarity = [sum(s.fmeasure for s in scorer.score(sentence, candidate).values())
                          for candidate in doc_sentences]
            if max(similarity) == 0.0:
                continue
            total += 1
            best = int(np.argmax(similarity))  # argmax returns the first of equal maxima
            if best == 0 or (best + 1) / len(doc_sentences) <= lead:
                leading += 1
    return 100.0 * leading / total if total else 0.0


def length_words(summaries: list[str]) -> float:
    """Mean number of whitespace-separated words per summary; 0.0 for no summaries."""
    return float(np.mean([len(s.split()) for s in summaries])) if summaries else 0.0
