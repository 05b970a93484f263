"""Distillation losses as plain functions of tensors (DQ-BART Appendix B; Hinton et al. 2015 KD).

Masks are 0/1 tensors over positions; a masked-out (padding) position never counts, whatever its
values (they are dropped before any arithmetic, so even inf/nan there change nothing). With N the
number of counted positions, V the vocabulary, H the hidden size, A the heads:

    label_smoothed_cross_entropy = mean over labelled tokens of (1-ε)·(-log p_y) + ε·mean_v(-log p_v)
    kd_kl        = T² · (1/N) Σ_pos Σ_v p_T(v) · (log p_T(v) - log p_S(v)),  p = softmax(logits / T)
    kd_mse       = (1/N) Σ_pos (1/V) Σ_v (s_v - t_v)²                       DQ-BART's L_logits
    hidden_mse   = Σ_i (1/(N·H)) Σ_pos Σ_h (S_{i+1} - T_{φ(i)+1})²           L_EHS / L_DHS
    attention_mse = Σ_i (1/(P·A)) Σ_(q,k) Σ_a (S_i - T_{φ(i)})²              L_EA / L_DA / L_CA

where φ = layer_map sends student layer i to the teacher layer it copies, hidden-state tuples
start with the embeddings (so layer i's output is index i + 1) and P counts the (query, key)
pairs whose query and key are both unmasked. Everything is computed in float32.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F


def _mean_over(values: torch.Tensor) -> torch.Tensor:
    # An all-masked batch gives 0 rather than nan, so one empty batch cannot poison training.
    return values.sum() / max(values.shape[0], 1)


def label_smoothed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, smoothing: float = 0.0,
                                 ignore_index: int = -100) -> torch.Tensor:
    """Token-level cross-entropy with label smoothing, averaged over non-ignored tokens."""
    keep = labels != ignore_index
    logits = logits[keep].float()
    return _mean_over(F.cross_entropy(logits, labels[keep], label_smoothing=smoothing, reduction="none"))


def kd_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor,
          temperature: float = 1.0) -> torch.Tensor:
    """T² · KL(teacher || student) of the temperature-softened distributions, averaged over mask."""
    keep = mask.bool()
    student = F.log_softmax(student_logits[keep].float() / temperature, dim=-1)
    teacher = F.log_softmax(teacher_logits[keep].float() / temperature, dim=-1)
    # T² keeps the gradient scale independent of T (Hinton et al. 2015, section 2).
    kl = F.kl_div(student, teacher, log_target=True, reduction="none").sum(-1)
    return temperature ** 2 * _mean_over(kl)


def kd_mse(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error of the logits over the vocabulary, averaged over mask positions."""
    keep = mask.bool()
    diff = student_logits[keep].float() - teacher_logits[keep].float()
    return _mean_over(diff.pow(2).mean(-1))


def _check_layer_map(n_student: int, n_teacher: int, layer_map: Sequence[int]) -> None:
    if len(layer_map) != n_student:
        raise ValueError(f"layer_map has {len(layer_map)} entries for {n_student} student layers")
    bad = [t for t in layer_map if not 0 <= t < n_teacher]
    if bad:
        raise ValueError(f"layer_map points at teacher layers {bad}; the teacher has {n_teacher}")


def hidden_mse(student_hidden: Sequence[torch.Tensor], teacher_hidden: Sequence[torch.Tensor],
               layer_map: Sequence[int], mask: torch.Tensor) -> torch.Tensor:
    """Σ over student layers of the MSE between its output and its teacher layer's output."""
    if student_hidden[0].shape[-1] != teacher_hidden[0].shape[-1]:
        raise ValueError(f"student hidden size {student_hidden[0].shape[-1]} differs from the teacher's "
                         f"{teacher_hidden[0].shape[-1]}")
    _check_layer_map(len(student_hidden) - 1, len(teacher_hidden) - 1, layer_map)
    keep = mask.bool()
    total = student_hidden[0].new_zeros((), dtype=torch.float32)
    for i, t in enumerate(layer_map):
        diff = student_hidden[i + 1][keep].float() - teacher_hidden[t + 1][keep].float()
        total = total + _mean_over(diff.pow(2).mean(-1))
    return total


def attention_mse(student_attn: Sequence[torch.Tensor], teacher_attn: Sequence[torch.Tensor],
                  layer_map: Sequence[int], query_mask: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    """Σ over student layers of the MSE between attention probabilities [batch, heads, query, key],
    averaged over heads and over (query, key) pairs with both positions unmasked."""
    if student_attn[0].shape[1] != teacher_attn[0].shape[1]:
        raise ValueError(f"student has {student_attn[0].shape[1]} attention heads, the teacher "
                         f"{teacher_attn[0].shape[1]}")
    _check_layer_map(len(student_attn), len(teacher_attn), layer_map)
    pairs = query_mask.bool()[:, :, None] & key_mask.bool()[:, None, :]  # [batch, query, key]
    total = student_attn[0].new_zeros((), dtype=torch.float32)
    for i, t in enumerate(layer_map):
        # heads last, so that the pair mask selects [pairs, heads]
        diff = student_attn[i].permute(0, 2, 3, 1)[pairs].float() - teacher_attn[t].permute(0, 2, 3, 1)[pairs].float()
        total = total + _mean_over(diff.pow(2).mean(-1))
    return total
