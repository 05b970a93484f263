"""PNG figures (matplotlib, optional extra `plot`): cross-attention heatmaps and position bars, quality vs
footprint, accuracy bars."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from modelshrink.errors import UserError


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UserError("PNG figures need matplotlib: pip install 'modelshrink[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def attention_heatmap(weights: np.ndarray, source_tokens: Sequence[str], summary_tokens: Sequence[str],
                      path: Path, title: str) -> Path:
    """Cross attention of one document (summary tokens × document tokens), as PLATE's Fig. 1."""
    plt = _pyplot()
    height = max(2.5, 0.22 * len(summary_tokens) + 1.5)
    width = max(6.0, min(40.0, 0.12 * len(source_tokens) + 2.0))
    fig, ax = plt.subplots(figsize=(width, height))
    image = ax.imshow(weights, aspect="auto", cmap="viridis", interpolation="nearest", vmin=0.0)
    ax.set_yticks(range(len(summary_tokens)), summary_tokens, fontsize=7)
    step = max(1, len(source_tokens) // 60)
    ax.set_xticks(range(0, len(source_tokens), step), list(source_tokens)[::step], rotation=90, fontsize=6)
    ax.set_xlabel("document token")
    ax.set_ylabel("summary token")
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.02)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def quality_vs_footprint(points: Sequence[tuple[str, float, float]], path: Path, metric: str) -> Path:
    """Quality (y) against bytes on disk (x, MB, log scale), one labelled point per system (DQ-BART Fig. 1)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for label, size_bytes, score in points:
        ax.scatter(size_bytes / 1e6, score, s=36)
        ax.annotate(label, (size_bytes / 1e6, score), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("size on disk (MB, log scale)")
    ax.set_ylabel(metric)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(f"{metric} against footprint")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def accuracy_bars(rows: Sequence[tuple[str, float]], path: Path, title: str, reference: float | None = None,
                  errors: Sequence[float] | None = None) -> Path:
    """Validation accuracy of several runs as bars (ACKD's Fig. 3), with the teacher as a line and,
    given `errors`, one standard deviation over seeds as error bars."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(1.1 * len(rows) + 2, 3.6))
    names, values = [r[0] for r in rows], [r[1] for r in rows]
    bars = ax.bar(range(len(rows)), values, color="#4c72b0", yerr=errors, capsize=4 if errors else 0)
    for bar, value, error in zip(bars, values, errors or [0.0] * len(values)):  # the label clears the error bar
        ax.text(bar.get_x() + bar.get_width() / 2, value + error + 0.1, f"{value:.2f}", ha="center", va="bottom",
                fontsize=8)
    if reference is not None:
        ax.axhline(reference, color="#c44e52", linestyle="--", linewidth=1, label=f"teacher {reference:.2f}")
        ax.legend(loc="lower right", fontsize=8)
    low = min(values + ([reference] if reference is not None else []))
    high = max(values + ([reference] if reference is not None else []))
    ax.set_ylim(max(0.0, low - 3), min(100.0, high + max(errors or [0.0]) + 1.5))
    ax.set_xticks(range(len(rows)), names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def position_bars(groups: Sequence[tuple[str, Sequence[float]]], bins: Sequence[str], path: Path, title: str) -> Path:
    """Share of evident cross-attention weights per document-position bin, one bar group per
    setting (PLATE's Fig. 2)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 3.8))
    width = 0.8 / max(1, len(groups))
    x = np.arange(len(bins))
    for i, (name, shares) in enumerate(groups):
        ax.bar(x + (i - (len(groups) - 1) / 2) * width, shares, width, label=name)
    ax.set_xticks(x, list(bins))
    ax.set_xlabel("normalised position in the document")
    ax.set_ylabel("share of evident weights (%)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
