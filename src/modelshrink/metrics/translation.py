"""BLEU and chrF of translations by sacreBLEU, with bootstrap intervals and paired tests at the corpus level.

BLEU and chrF are corpus metrics: the n-gram counts of every sentence are summed before the score is taken,
so a corpus's BLEU is not the mean of its sentences' BLEU. Each sentence's sufficient statistics (sacreBLEU's
own: BLEU's matches and totals per order and the two lengths; chrF's hypothesis, reference and matching
n-gram counts per order) are kept, and every resample sums them and scores the sum with sacreBLEU, as its own
`--confidence` and `--paired-ar` do. The defaults are sacreBLEU's (BLEU: 13a tokenization, exponential
smoothing; chrF: character 6-grams, β = 2); the signature of each is recorded with the scores.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from modelshrink.metrics.stats import SIGNIFICANCE_METHODS


def _scorers() -> dict[str, Any]:
    from sacrebleu.metrics import BLEU, CHRF

    return {"bleu": BLEU(), "chrf": CHRF()}


def signatures() -> dict[str, str]:
    """sacreBLEU's signature of each metric (one reference per sentence; its version included)."""
    out = {}
    for name, scorer in _scorers().items():
        scorer.corpus_score(["a"], [["a"]])  # a signature names the reference count, known after scoring
        out[name] = str(scorer.get_signature())
    return out


def sentence_statistics(hypotheses: list[str], references: list[str]) -> dict[str, np.ndarray]:
    """Per metric, [sentences, statistics] of integer counts (one reference per sentence)."""
    return {name: np.asarray(scorer._extract_corpus_statistics(hypotheses, [references]), dtype=np.int64)
            .reshape(len(hypotheses), -1) for name, scorer in _scorers().items()}


def _score(scorer: Any, totals: np.ndarray) -> float:
    return float(scorer._compute_score_from_stats([int(x) for x in totals]).score)


def corpus_scores(statistics: dict[str, np.ndarray]) -> dict[str, float]:
    """BLEU and chrF (0-100) of the whole corpus, from its sentences' statistics."""
    scorers = _scorers()
    return {name: _score(scorers[name], stats.sum(axis=0)) for name, stats in statistics.items()}


def bootstrap_ci(statistics: dict[str, np.ndarray], resamples: int = 1000, seed: int = 0,
                 confidence: float = 0.95) -> dict[str, tuple[float, float]]:
    """Percentile bootstrap interval of each corpus score (sentences resampled with replacement)."""
    scorers = _scorers()
    n = next(iter(statistics.values())).shape[0]
    rng = np.random.default_rng(seed)
    draws = [rng.integers(0, n, size=n) for _ in range(resamples)]
    tail = 100.0 * (1.0 - confidence) / 2.0
    out = {}
    for name, stats in statistics.items():
        scores = [_score(scorers[name], stats[idx].sum(axis=0)) for idx in draws]
        low, high = np.percentile(scores, [tail, 100.0 - tail])
        out[name] = (float(low), float(high))
    return out


def paired_test(a: np.ndarray, b: np.ndarray, metric: str, method: str = "permutation", resamples: int = 10000,
                seed: int = 0) -> float:
    """Two-sided p that systems a and b ([sentences, statistics] of one metric on the same sentences) differ
    in corpus score. `permutation` (approximate randomization, sacreBLEU's --paired-ar) swaps each sentence's
    pair of outputs at random; `bootstrap` resamples sentences and centres the resampled difference on the
    observed one. Both add one to numerator and denominator, so p is never 0; identical systems give p = 1."""
    if method not in SIGNIFICANCE_METHODS:
        raise ValueError(f"unknown method {method!r}; expected one of {', '.join(SIGNIFICANCE_METHODS)}")
    if a.shape != b.shape:
        raise ValueError(f"paired statistics need the same sentences, got {a.shape} and {b.shape}")
    scorer = _scorers()[metric]
    total_a, total_b, diff = a.sum(axis=0), b.sum(axis=0), b - a
    observed = _score(scorer, total_a) - _score(scorer, total_b)
    rng = np.random.default_rng(seed)
    n = a.shape[0]
    extreme = 0
    for _ in range(resamples):
        if method == "permutation":
            moved = diff[rng.random(n) < 0.5].sum(axis=0)  # the swapped sentences' counts change sides
            stat = abs(_score(scorer, total_a + moved) - _score(scorer, total_b - moved))
        else:
            idx = rng.integers(0, n, size=n)
            stat = abs(_score(scorer, a[idx].sum(axis=0)) - _score(scorer, b[idx].sum(axis=0)) - observed)
        extreme += stat >= abs(observed) - 1e-9
    return (1 + extreme) / (resamples + 1)
