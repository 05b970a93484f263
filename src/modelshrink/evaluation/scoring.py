"""Scoring for `eval`: summaries (ROUGE with bootstrap intervals, style and bias), translations (sacreBLEU's
BLEU and chrF with corpus-level intervals), labels (GLUE's metrics), and the paired significance test of one
system against another on the same documents.

Each scorer also adds per-document `scores` to the rows, which predictions.jsonl keeps so that a
later `--against` or `--compare` can pair them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from modelshrink.artifacts import read_manifest
from modelshrink.data import unique_keys
from modelshrink.errors import UserError
from modelshrink.metrics import glue, rouge, stats, style, translation
from modelshrink.metrics.names import ROUGE_METRICS, TRANSLATION_METRICS
from modelshrink.options.eval import EvalOptions
from modelshrink.evaluation.predictions import eval_rows, paired_predictions

LogFn = Callable[[str], None]

STYLE_SETTINGS = ("words: lowercase [a-z0-9]+ tokens; novel n-grams and copy bias pooled over the corpus, relative "
                  "to each summary's own document; leading bias: each summary sentence matched to the document "
                  "sentence of highest ROUGE-1 + ROUGE-2 F1, leading when that sentence lies in the first 40% of "
                  "the document's sentences")


def _mean(values: np.ndarray) -> float:
    return round(float(np.mean(values)), 4) if len(values) else 0.0


def _ci(values: np.ndarray, options: EvalOptions) -> list[float]:
    low, high = stats.bootstrap_ci(values, options.resamples, options.seed)
    return [round(low, 4), round(high, 4)]


def score_summaries(rows: list[dict[str, Any]], options: EvalOptions, tokenizer: Any = None,
                    log: LogFn = lambda m: None) -> dict[str, Any]:
    """ROUGE with intervals, style and bias; adds per-document ROUGE to each row."""
    predictions = [r["prediction"] for r in rows]
    references = [r["reference"] for r in rows]
    per_doc = rouge.rouge_per_document(predictions, references)
    metrics: dict[str, Any] = {"task": "summarization", "documents": len(rows)}
    for key in ROUGE_METRICS:
        metrics[key] = _mean(per_doc[key])
    metrics["ci95"] = {key: _ci(per_doc[key], options) for key in ROUGE_METRICS}
    for row, scores in zip(rows, document_scores(per_doc)):
        row["scores"] = scores
    empty = sum(1 for p in predictions if not p.strip())
    metrics["empty_predictions"] = empty
    if empty:
        log(f"warning: {empty} empty predictions (scored 0)")
    if options.limited_length_recall:
        recall = rouge.limited_length_recall_per_document(predictions, references)
        metrics["limited_length_recall"] = {key: _mean(v) for key, v in recall.items()}
        metrics["limited_length_recall_ci95"] = {key: _ci(v, options) for key, v in recall.items()}
    metrics["length_words"] = round(style.length_words(predictions), 3)
    if tokenizer is not None:
        lengths = [len(ids) for ids in tokenizer(predictions, add_special_tokens=False)["input_ids"]]
        metrics["length_tokens"] = round(float(np.mean(lengths)), 3) if lengths else 0.0
    documents = [r["document"] for r in rows]
    if all(isinstance(d, str) for d in documents):
        metrics["novel_ngrams"] = {k: round(v, 3) for k, v in style.novel_ngrams(predictions, documents).items()}
        metrics["copy_bias"] = round(style.copy_bias(predictions, documents), 3)
        metrics["leading_bias"] = round(style.leading_bias(predictions, documents), 3)
        metrics["reference_style"] = {
            "length_words": round(style.length_words(references), 3),
            "novel_ngrams": {k: round(v, 3) for k, v in style.novel_ngrams(references, documents).items()},
            "copy_bias": round(style.copy_bias(references, documents), 3),
            "leading_bias": round(style.leading_bias(references, documents), 3),
        }
    return metrics


def score_translations(rows: list[dict[str, Any]], options: EvalOptions, log: LogFn = lambda m: None) -> dict[str, Any]:
    """Corpus BLEU and chrF with bootstrap intervals (sentences resampled, corpus score recomputed); adds each
    sentence's own BLEU (effective order) and chrF, and the statistics a later paired test sums, to its row."""
    predictions = [r["prediction"] for r in rows]
    statistics = translation.sentence_statistics(predictions, [r["reference"] for r in rows])
    _sentence_scores(rows, statistics)
    metrics: dict[str, Any] = {"task": "translation", "documents": len(rows)}
    metrics.update({k: round(v, 4) for k, v in translation.corpus_scores(statistics).items()})
    ci = translation.bootstrap_ci(statistics, options.resamples, options.seed)
    metrics["ci95"] = {k: [round(low, 4), round(high, 4)] for k, (low, high) in ci.items()}
    empty = sum(1 for p in predictions if not p.strip())
    metrics["empty_predictions"] = empty
    if empty:
        log(f"warning: {empty} empty translations (scored 0)")
    bleu = statistics["bleu"].sum(axis=0)
    # sacreBLEU's BLEU statistics open with the hypothesis and reference lengths (13a tokens)
    metrics["length_ratio"] = round(float(bleu[0] / bleu[1]), 4) if bleu[1] else None
    metrics["length_words"] = round(style.length_words(predictions), 3)
    metrics["signatures"] = translation.signatures()
    return metrics


def _sentence_scores(rows: list[dict[str, Any]], statistics: dict[str, np.ndarray]) -> None:
    from sacrebleu.metrics import BLEU, CHRF

    scorers = {"bleu": BLEU(effective_order=True), "chrf": CHRF()}  # sacreBLEU's sentence_score settings
    for i, row in enumerate(rows):
        counts = {name: [int(x) for x in stats[i]] for name, stats in statistics.items()}
        row["scores"] = {name: round(float(scorers[name]._compute_score_from_stats(c).score), 4)
                         for name, c in counts.items()}
        row["statistics"] = counts


def score_labels(rows: list[dict[str, Any]], task: str) -> dict[str, Any]:
    predictions = [r["prediction"] for r in rows]
    labels = [r["label"] for r in rows]
    metrics: dict[str, Any] = {"task": task, "documents": len(rows)}
    if task == "classification":
        metrics.update({k: round(v, 4) for k, v in glue.classification_metrics(predictions, labels).items()})
        for row in rows:
            row["scores"] = {"correct": float(row["prediction"] == row["label"])}
    else:
        metrics.update({k: round(v, 4) for k, v in glue.regression_metrics(predictions, labels).items()})
        for row in rows:
            row["scores"] = {"squared_error": float((row["prediction"] - row["label"]) ** 2)}
    metrics["conventions"] = glue.GLUE_CONVENTIONS
    return metrics


# ---------------------------------------------------------------- paired significance

def paired_keys(task: str, row: dict[str, Any]) -> list[str]:
    """The per-document scores two systems are compared on: ROUGE for summaries, else the row's own."""
    return list(ROUGE_METRICS) if task == "summarization" else list(row["scores"])


def paired_corpus_tests(rows: list[dict[str, Any]], other: list[dict[str, Any]], method: str, resamples: int,
                        seed: int) -> dict[str, dict[str, Any]]:
    """Per corpus metric (BLEU, chrF): p of the paired test on the sentences' statistics, the difference of the
    corpus scores and `other`'s corpus score."""
    result: dict[str, dict[str, Any]] = {"p": {}, "delta": {}, "other_scores": {}}
    for key in TRANSLATION_METRICS:
        a = np.array([r["statistics"][key] for r in rows], dtype=np.int64)
        b = np.array([r["statistics"][key] for r in other], dtype=np.int64)
        mine, theirs = (translation.corpus_scores({key: x})[key] for x in (a, b))
        result["p"][key] = round(translation.paired_test(a, b, key, method, resamples, seed), 6)
        result["delta"][key] = round(mine - theirs, 4)
        result["other_scores"][key] = round(theirs, 4)
    return result


def paired_tests(rows: list[dict[str, Any]], other: list[dict[str, Any]], keys: list[str], method: str,
                 resamples: int, seed: int) -> dict[str, dict[str, Any]]:
    """Per key: p of the paired test of `rows` against `other` (the same documents in the same order),
    the difference of their means, and `other`'s mean."""
    result: dict[str, dict[str, Any]] = {"p": {}, "delta": {}, "other_scores": {}}
    for key in keys:
        a = np.array([r["scores"][key] for r in rows])
        b = np.array([r["scores"][key] for r in other])
        result["p"][key] = round(stats.paired_test(a, b, method, resamples, seed), 6)
        result["delta"][key] = round(float(a.mean() - b.mean()), 4)
        result["other_scores"][key] = round(float(b.mean()), 4)
    return result


def document_scores(per_doc: dict[str, Any]) -> list[dict[str, float]]:
    """Each document's ROUGE, rounded as predictions.jsonl stores it. Both sides of a paired test
    go through here, so a system compared with itself has identical scores (p = 1)."""
    count = len(per_doc[ROUGE_METRICS[0]])
    return [{key: round(float(per_doc[key][i]), 4) for key in ROUGE_METRICS} for i in range(count)]


def against(rows: list[dict[str, Any]], task: str, options: EvalOptions) -> dict[str, Any]:
    """Paired significance test against OTHER (an eval artifact, or predictions of the same documents)."""
    other_path = Path(options.against)
    manifest = read_manifest(other_path) if other_path.is_dir() else None
    ids = unique_keys([r["id"] for r in rows])
    if manifest is not None and manifest.get("kind") == "eval":
        other = eval_rows(other_path)
    else:
        other = paired_predictions(options.against, rows, options)
        scored = [other[i] for i in ids if i in other]
        if len(scored) == len(ids):
            if task == "translation":
                _sentence_scores(scored, translation.sentence_statistics(
                    [str(r["prediction"] or "") for r in scored], [r["reference"] for r in scored]))
            elif task == "summarization":
                per_doc = rouge.rouge_per_document([str(r["prediction"] or "") for r in scored],
                                                   [r["reference"] for r in scored])
                for r, scores in zip(scored, document_scores(per_doc)):
                    r["scores"] = scores
            else:
                score_labels(scored, task)
    if len(other) != len(rows) or set(other) != set(ids):
        missing = [i for i in ids if i not in other][:3]
        raise UserError(f"--against {options.against} has {len(other)} documents, this run {len(rows)}; the ids "
                        f"must be the same" + (f" (missing there: {', '.join(missing)})" if missing else ""))
    paired = [other[i] for i in ids]
    if task == "translation":
        if any("statistics" not in r for r in paired):
            raise UserError(f"--against {options.against} holds no translation scores (an evaluation of another "
                            "task?): compare translations with translations")
        tests = paired_corpus_tests(rows, paired, options.significance, options.significance_resamples, options.seed)
    else:
        keys = paired_keys(task, rows[0])
        if any(key not in (r.get("scores") or {}) for r in paired for key in keys):
            raise UserError(f"--against {options.against} holds no {', '.join(keys)} scores for these documents (an "
                            f"evaluation of another task?): compare {task} with {task}")
        tests = paired_tests(rows, paired, keys, options.significance, options.significance_resamples, options.seed)
    result: dict[str, Any] = {"other": str(other_path), "method": options.significance,
                              "resamples": options.significance_resamples, "seed": options.seed, **tests}
    result["significant_at_0.05"] = {k: p < 0.05 for k, p in result["p"].items()}
    # how many outputs a change (quantization, export, another device) left word for word as they were
    result["same_predictions"] = sum(r["prediction"] == o["prediction"] for r, o in zip(rows, paired))
    return result
