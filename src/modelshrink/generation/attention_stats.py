"""Where a summarizer's cross attention looks (PLATE section 5, Fig. 1 and 2).

An attention weight is *evident* when it exceeds 0.15. Source positions are normalised to (0, 1]
over the document's real tokens and cut into five equal bins; for each document we take the share
of its evident weights (over all layers, heads and generated tokens) in each bin, then average over
documents. Two corpus shares are reported, since they differ by orders of magnitude: evident weights by
count (of all weights: at most 6 of a row's weights can pass 0.15, so on long documents this is tiny)
and by attention mass (the part of each row's sum of 1 that evident weights carry). The weights are
those of a teacher-forced pass over the generated sequence, which are the weights generation itself
used at each step (eager attention, so they can be returned).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import torch

EVIDENT = 0.15
BINS = 5


@contextmanager
def eager_attention(model: Any) -> Iterator[None]:
    """Fused kernels (SDPA, flash) do not return attention weights; eager does."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


def _generated_steps(sequence: torch.Tensor, eos_id: int | None) -> int:
    """Decoder steps that produced a token: up to and including the first end-of-sequence."""
    tokens = sequence[1:]
    if eos_id is not None:
        hits = (tokens == eos_id).nonzero()
        if len(hits):
            return int(hits[0]) + 1
    return len(tokens)


def cross_attention(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    sequences: torch.Tensor) -> list[np.ndarray]:
    """Per document: cross-attention weights [layers, heads, steps, source tokens], padding removed."""
    eos = model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    with eager_attention(model), torch.inference_mode():
        out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=sequences[:, :-1],
                    output_attentions=True)
    stacked = torch.stack(out.cross_attentions, dim=1).float()  # [batch, layers, heads, steps, source]
    result = []
    for b in range(stacked.shape[0]):
        source = attention_mask[b].bool()
        steps = _generated_steps(sequences[b], eos)
        result.append(stacked[b][:, :, :steps][..., source].cpu().numpy())
    return result


def evident_bins(weights: np.ndarray) -> tuple[np.ndarray | None, int, int, float, float]:
    """(share of the document's evident weights per position bin, evident count, all count, the attention mass the
    evident weights carry, all attention mass)."""
    n_source = weights.shape[-1]
    positions = (np.arange(n_source) + 1) / n_source  # (0, 1]
    bin_of = np.minimum((np.ceil(positions * BINS) - 1).astype(int), BINS - 1)
    evident = weights > EVIDENT
    per_position = evident.reshape(-1, n_source).sum(axis=0)
    counts = np.bincount(bin_of, weights=per_position, minlength=BINS)
    total = int(counts.sum())
    return ((counts / total if total else None), total, int(weights.size), float(weights[evident].sum()),
            float(weights.sum()))


def summarize_bins(per_doc: list[tuple]) -> dict[str, Any]:
    shares = [d[0] for d in per_doc if d[0] is not None]
    evident = sum(d[1] for d in per_doc)
    total = sum(d[2] for d in per_doc)
    mean = np.mean(shares, axis=0) if shares else np.zeros(BINS)
    masses = [d[3:5] for d in per_doc if len(d) >= 5]  # rows written before the mass was recorded have none
    mass = sum(m for m, _ in masses), sum(t for _, t in masses)
    return {
        "evident_threshold": EVIDENT,
        "bins": [f"({i / BINS:.1f}, {(i + 1) / BINS:.1f}]" for i in range(BINS)],
        "evident_share_by_bin": [round(float(x) * 100, 3) for x in mean],
        "evident_share_of_all_weights": round(100 * evident / total, 3) if total else 0.0,
        "evident_share_of_attention_mass": (round(100 * mass[0] / mass[1], 3) if mass[1] else None),
        "documents_with_evident_weights": len(shares),
        "definition": "per document, the share (%) of its cross-attention weights > 0.15 (all layers, heads and "
                      "generated tokens) whose source position, normalised to (0, 1], falls in each bin; mean over "
                      "documents",
    }


def plot_file(doc_id: str) -> str:
    """The PNG name of one document's heatmap (characters outside [A-Za-z0-9-_.] become _)."""
    return "attention-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in doc_id) + ".png"


class AttentionRecorder:
    """What `--attention-stats` and `--attention-plot` ask of a generating step, batch by batch.

    `record` is called inside the step's attention-temperature block, right after a batch was
    generated, so the weights are those of the λ the summaries were written with. Per-row shares go
    into each row as "_attention" (which survives part files and resumes); `summary` pops them all
    and averages. The heatmap of the document `plot_id` is written to `folder`."""

    def __init__(self, stats: bool, plot_id: str | None, folder: Any, tokenizer: Any) -> None:
        self.stats, self.plot_id, self.folder, self.tokenizer = stats, plot_id, folder, tokenizer
        self.plot_name = None if plot_id is None else plot_file(plot_id)

    def record(self, model: Any, rows: list[dict[str, Any]], doc_ids: list[str], lambdas: list[float],
               input_ids: torch.Tensor, attention_mask: torch.Tensor, sequences: torch.Tensor) -> None:
        plot_row = doc_ids.index(self.plot_id) if self.plot_id in doc_ids else None
        if not self.stats and plot_row is None:
            return
        weights = cross_attention(model, input_ids, attention_mask, sequences)
        if self.stats:
            for row, w in zip(rows, weights):
                shares, *counts = evident_bins(w)
                row["_attention"] = [None if shares is None else shares.tolist(), *counts]
        if plot_row is not None:
            from modelshrink.figures import attention_heatmap

            b, mask = plot_row, attention_mask[plot_row].bool()
            attention_heatmap(weights[b].mean(axis=(0, 1)),
                              self.tokenizer.convert_ids_to_tokens(input_ids[b][mask].tolist()),
                              self.tokenizer.convert_ids_to_tokens(sequences[b][1:1 + weights[b].shape[2]].tolist()),
                              self.folder / self.plot_name,
                              f"cross attention at λ = {lambdas[b]:g} (mean over layers and heads), "
                              f"document {self.plot_id}")

    def summary(self, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The corpus statistics (None without --attention-stats); removes "_attention" from the rows."""
        recorded = [tuple(r.pop("_attention")) for r in rows if "_attention" in r]
        return summarize_bins(recorded) if self.stats else None
