"""PLATE: attention temperature at inference (Zhang et al., "Attention Temperature Matters in
Abstractive Summarization Distillation", section 3.3).

Raising the temperature of an attention module from sqrt(d) to sqrt(λ·d) divides its logits by
sqrt(λ). Attention logits are linear in the query, so the same effect is had by scaling the query
projection's weight and bias by 1/sqrt(λ): no extra work per token, and exact whatever attention
kernel runs (eager, SDPA, flash) and whether or not the family scales by 1/sqrt(d) (T5 does not).
T5 also adds a learned relative position bias to the logits; it is computed once per stack from
the first layer's embedding and shared, so scaling that embedding by 1/sqrt(λ) completes the fold.

A λ drawn per document cannot live in the weights. `attention_temperature` then installs forward
hooks that scale each row's queries (and T5's bias) by that row's 1/sqrt(λ). Generation repeats
each document's rows `num_beams` times next to each other (`repeat_interleave`) and reorders beams
only within a document, so a per-document scale expands to the current batch the same way.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

import torch

from modelshrink.families import ATTENTION_KINDS, AttentionModule


class RowScale:
    """Per-document query scales 1/sqrt(λ_i), expanded to whatever batch a module sees."""

    def __init__(self) -> None:
        self.scale: torch.Tensor | None = None

    def set(self, lambdas: torch.Tensor | list[float]) -> None:
        lambdas = torch.as_tensor(lambdas, dtype=torch.float32)
        if (lambdas <= 0).any():
            raise ValueError("every λ must be > 0")
        self.scale = lambdas.rsqrt()

    def for_batch(self, batch: int, like: torch.Tensor) -> torch.Tensor:
        if self.scale is None:
            raise RuntimeError("RowScale.set() must be called before the forward pass")
        n = self.scale.numel()
        if batch % n:
            raise RuntimeError(f"batch of {batch} rows does not expand {n} documents")
        scale = self.scale if batch == n else self.scale.repeat_interleave(batch // n)
        return scale.to(device=like.device, dtype=like.dtype)


def _wide(t: torch.Tensor) -> torch.Tensor:
    """`t` in at least float32: a half-precision model's scaling is computed in float32, then cast."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _view_rows(scale: torch.Tensor, ndim: int) -> torch.Tensor:
    return scale.view(-1, *([1] * (ndim - 1)))


@contextmanager
def attention_temperature(modules: list[AttentionModule],
                          lambdas: Mapping[str, float | None]) -> Iterator[RowScale | None]:
    """Apply λ per attention kind for the duration of the block; restores the exact weights after.

    `lambdas` maps each of ATTENTION_KINDS to a fixed λ (folded into the weights; 1.0 changes
    nothing) or to None (per-document λ: the block receives a RowScale to `set` before each batch).
    """
    unknown = set(lambdas) - set(ATTENTION_KINDS)
    if unknown:
        raise ValueError(f"unknown attention kinds {sorted(unknown)}; expected {ATTENTION_KINDS}")
    for kind, lam in lambdas.items():
        if lam is not None and not lam > 0:
            raise ValueError(f"λ for {kind} must be > 0, got {lam}")
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    handles = []
    patched = []
    rows = RowScale() if any(lambdas.get(k, 1.0) is None for k in ATTENTION_KINDS) else None
    try:
        with torch.no_grad():
            for m in modules:
                lam = lambdas.get(m.kind, 1.0)
                if lam is None:
                    handles.append(m.query.register_forward_hook(_row_query_hook(rows)))
                    if m.position_bias is not None:
                        patched.append(_patch_row_bias(m.module, rows, handles))
                elif lam != 1.0:
                    factor = 1.0 / math.sqrt(lam)
                    params = [m.query.weight] + ([m.query.bias] if m.query.bias is not None else [])
                    if m.position_bias is not None:
                        params.append(m.position_bias.weight)
                    for p in params:  # scaled in float32, then cast: a half-precision model gets the same λ
                        saved.append((p, p.detach().clone()))
                        p.copy_(_wide(p) * factor)
        yield rows
    finally:
        with torch.no_grad():
            for p, original in saved:
                p.copy_(original)
        for h in handles:
            h.remove()
        for module in patched:
            del module.compute_bias  # drop the instance attribute; the class method shows again


def _row_query_hook(rows: RowScale):
    def hook(module, inputs, output):
        scale = rows.for_batch(output.shape[0], _wide(output))
        return (_wide(output) * _view_rows(scale, output.dim())).to(output.dtype)

    return hook


def _patch_row_bias(attention: torch.nn.Module, rows: RowScale, handles: list) -> torch.nn.Module:
    """Scale T5's relative position bias per row. The bias has no batch axis, so a pre-hook notes
    the batch size of the call and the scaled bias gains one ([batch, heads, q, k])."""
    seen = {"batch": None}

    def note_batch(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        seen["batch"] = hidden.shape[0]

    handles.append(attention.register_forward_pre_hook(note_batch, with_kwargs=True))
    original = attention.compute_bias

    def compute_bias(*args, **kwargs):
        bias = original(*args, **kwargs)
        scale = rows.for_batch(seen["batch"], _wide(bias))
        return (_wide(bias) * _view_rows(scale, bias.dim())).to(bias.dtype)

    attention.compute_bias = compute_bias
    return attention


def lambdas_by_kind(lam: float | None = None, enc: float | None = None, dec: float | None = None,
                    cross: float | None = None, per_row: bool = False) -> dict[str, float | None]:
    """Resolve the command-line λ options: a per-kind value wins; otherwise the per-document draw
    (`per_row`, marked None) or the global `lam` (default 1.0)."""
    base = None if per_row else (1.0 if lam is None else lam)
    return {
        "encoder_self": enc if enc is not None else base,
        "decoder_self": dec if dec is not None else base,
        "decoder_cross": cross if cross is not None else base,
    }


def lambdas_of(options: Any) -> dict[str, float | None]:
    """`lambdas_by_kind` for a step's TemperatureOptions."""
    return lambdas_by_kind(options.lam, options.lambda_enc, options.lambda_dec, options.lambda_cross,
                           per_row=options.lambda_range is not None)


def row_lambda(seed: int, index: int, low: float, high: float) -> float:
    """λ ~ U[low, high] for document `index`: a function of (seed, index) alone, so the draw does
    not depend on batching, window order, the process or where a resumed run restarts."""
    return float(np.random.default_rng([seed, index]).uniform(low, high))


def batch_lambdas(options: Any, indices: Sequence[int]) -> list[float]:
    """Each document's λ (the drawn one under --lambda-range, else --lambda or 1.0), in batch order."""
    if options.lambda_range is not None:
        return [row_lambda(options.seed, i, *options.lambda_range) for i in indices]
    return [1.0 if options.lam is None else options.lam] * len(indices)
