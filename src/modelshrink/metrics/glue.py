"""GLUE metrics with numpy alone, so `eval` needs no scikit-learn or scipy at run time.

The formulas follow scikit-learn (accuracy_score, f1_score, matthews_corrcoef) and scipy
(pearsonr, spearmanr); the tests check them against those libraries.
"""

from __future__ import annotations

import numpy as np

GLUE_CONVENTIONS: dict[str, str] = {
    "accuracy": "SST-2, MNLI, QNLI, RTE, WNLI; also MRPC and QQP",
    "f1": "MRPC and QQP (positive class 1); macro over classes when more than two",
    "mcc": "CoLA",
    "pearson": "STS-B",
    "spearman": "STS-B",
}


def _pair(predictions, labels) -> tuple[np.ndarray, np.ndarray]:
    predictions, labels = np.asarray(predictions).ravel(), np.asarray(labels).ravel()
    if predictions.size != labels.size:
        raise ValueError(f"{predictions.size} predictions but {labels.size} labels")
    if predictions.size == 0:
        raise ValueError("no predictions to score")
    return predictions, labels


def _confusion(predictions: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(classes, matrix) with matrix[true, predicted] counts over the classes of labels ∪ predictions."""
    classes, index = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
    true, predicted = index[:labels.size], index[labels.size:]
    matrix = np.zeros((classes.size, classes.size), dtype=np.int64)
    np.add.at(matrix, (true, predicted), 1)
    return classes, matrix


def _f1_per_class(matrix: np.ndarray) -> np.ndarray:
    tp = np.diag(matrix).astype(float)
    denominator = matrix.sum(axis=0) + matrix.sum(axis=1)  # = 2tp + fp + fn
    return np.divide(2 * tp, denominator, out=np.zeros_like(tp), where=denominator > 0)


def _mcc(matrix: np.ndarray) -> float:
    # Gorodkin's multiclass generalisation, as scikit-learn computes it; floats avoid int overflow.
    matrix = matrix.astype(float)
    true_sum, predicted_sum = matrix.sum(axis=1), matrix.sum(axis=0)
    n, correct = matrix.sum(), np.trace(matrix)
    cov_tp = correct * n - true_sum @ predicted_sum
    cov_pp = n * n - predicted_sum @ predicted_sum
    cov_tt = n * n - true_sum @ true_sum
    if cov_pp * cov_tt == 0:
        return 0.0
    return float(cov_tp / np.sqrt(cov_tt * cov_pp))


def classification_metrics(predictions, labels) -> dict[str, float]:
    """accuracy, f1 and mcc, each × 100.

    f1 is the binary F1 of class 1 when every label and prediction is 0 or 1 (MRPC, QQP), and the
    macro average over the classes in labels ∪ predictions otherwise. mcc is 0 when undefined
    (a side with a single class).
    """
    predictions, labels = _pair(predictions, labels)
    classes, matrix = _confusion(predictions, labels)
    f1_each = _f1_per_class(matrix)
    if set(classes.tolist()) <= {0, 1}:
        positive = np.flatnonzero(classes == 1)
        f1 = float(f1_each[positive[0]]) if positive.size else 0.0
    else:
        f1 = float(f1_each.mean())
    return {
        "accuracy": 100.0 * float(np.mean(predictions == labels)),
        "f1": 100.0 * f1,
        "mcc": 100.0 * _mcc(matrix),
    }


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    # Test constancy exactly: centring a constant float column can leave rounding noise, not zeros.
    if np.all(x == x[0]) or np.all(y == y[0]):
        return 0.0
    x, y = x - x.mean(), y - y.mean()
    r = (x @ y) / np.sqrt((x @ x) * (y @ y))
    return float(np.clip(r, -1.0, 1.0))


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing the mean of their ranks."""
    values, index, counts = np.unique(x, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)
    return ((last - counts + 1 + last) / 2.0)[index]


def regression_metrics(predictions, labels) -> dict[str, float]:
    """Pearson and Spearman correlation × 100 (Spearman = Pearson of average ranks); 0 if a side is constant."""
    predictions, labels = _pair(predictions, labels)
    predictions, labels = predictions.astype(float), labels.astype(float)
    return {
        "pearson": 100.0 * _pearson(predictions, labels),
        "spearman": 100.0 * _pearson(_average_ranks(predictions), _average_ranks(labels)),
    }
