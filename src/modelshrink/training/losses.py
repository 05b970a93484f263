"""Distillation losses as plain functions of tensors (DQ-BART Appendix B; Hinton et al. 2015 KD).

Masks are 0/1 tensors over positions; a masked-out (padding) position never counts, whatever its
values (they are left out before any arithmetic, so even inf/nan there change nothing). Eagerly the kept
positions are taken out (no arithmetic on padding); under torch.compile the masked ones are zeroed instead, so
that no shape depends on a mask and nothing splits the compiled graph. With N the
number of counted positions, V the vocabulary, H the hidden size, A the heads:

    label_smoothed_cross_entropy = mean over labelled tokens of (1-ε)·(-log p_y) + ε·mean_v(-log p_v)
    kd_kl        = T² · (1/N) Σ_pos Σ_v p_T(v) · (log p_T(v) - log p_S(v)),  p = softmax(logits / T)
    kd_mse       = (1/N) Σ_pos (1/V) Σ_v (s_v - t_v)²                       DQ-BART's L_logits
    hidden_mse   = Σ_i (1/(N·H)) Σ_pos Σ_h (S_{i+1} - T_{φ(i)+1})²           L_EHS / L_DHS
    attention_mse = Σ_i (1/(P·A)) Σ_(q,k) Σ_a (S_i - T_{φ(i)})²              L_EA / L_DA / L_CA

where φ = layer_map sends student layer i to the teacher layer it copies, hidden-state tuples
start with the embeddings (so layer i's output is index i + 1) and P counts the (query, key)
pairs whose query and key are both unmasked. Everything is computed in float32.

`linear_cross_entropy` is label_smoothed_cross_entropy of `hidden @ weight.T + bias` that never holds
more than one chunk of tokens' logits (a fused linear cross-entropy; the LM head's logits are
[tokens, vocabulary], gigabytes at a 50k vocabulary).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F


def _kept(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The positions of `values` [*keep.shape, ...] that `keep` keeps: eagerly `values[keep]`; under torch.compile,
    where a shape read from a mask would split the graph, `values` with the others set to 0."""
    if torch.compiler.is_compiling():
        return values.masked_fill(~keep.reshape(keep.shape + (1,) * (values.dim() - keep.dim())), 0)
    return values[keep]


def _mean_over(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Σ values (per kept position, from `_kept` inputs) / the number of kept positions. An all-masked batch gives
    0 rather than nan, so one empty batch cannot poison training."""
    if torch.compiler.is_compiling():
        return values.sum() / keep.sum().clamp(min=1)
    return values.sum() / max(values.shape[0], 1)


def label_smoothed_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, smoothing: float = 0.0,
                                 ignore_index: int = -100) -> torch.Tensor:
    """Token-level cross-entropy with label smoothing, averaged over non-ignored tokens."""
    keep = labels != ignore_index
    # compiled, every token stays and the ignored ones get 0 from cross_entropy's own ignore_index
    labels = labels.flatten() if torch.compiler.is_compiling() else labels[keep]
    losses = F.cross_entropy(_kept(logits, keep).float().flatten(0, -2), labels, ignore_index=ignore_index,
                             label_smoothing=smoothing, reduction="none")
    return _mean_over(losses, keep)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         labels: torch.Tensor, *, ignore_index: int = -100, label_smoothing: float = 0.0,
                         chunk_tokens: int = 4096, compute_dtype: torch.dtype | None = None,
                         drop_ignored: bool | None = None) -> torch.Tensor:
    """label_smoothed_cross_entropy(hidden @ weight.T + bias, labels, ...) without materialising the logits:
    they are made `chunk_tokens` tokens at a time and dropped once the chunk's loss and gradients are
    taken. `hidden` is [..., H], `weight` [V, H], `bias` [V] or None, `labels` hidden's leading shape.

    The matmul runs in `compute_dtype` (default: the autocast dtype where autocast is on, else the
    inputs' own), the softmax in float32, as a head under autocast followed by `.float()` would.

    `drop_ignored` (default: off a GPU) takes the ignored tokens out first, so that they cost nothing; that needs
    their count on the host, a device read. On a GPU every token goes through and the ignored ones are weighed 0:
    a little arithmetic on padding (few tokens under a token budget) instead of a wait for the device every
    micro-batch (CONTRIBUTING: a training step reads nothing from the device).
    """
    keep = labels != ignore_index
    if drop_ignored is None:
        drop_ignored = hidden.device.type != "cuda"
    if drop_ignored:
        hidden, labels, rows = hidden[keep], labels[keep], None
        count = labels.shape[0]
    else:
        hidden, labels, rows = hidden.flatten(0, -2), labels.flatten(), keep.flatten()
        count = rows.sum()
    if compute_dtype is None:
        device = hidden.device.type
        compute_dtype = (torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device)
                         else torch.promote_types(hidden.dtype, weight.dtype))
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    total = _LinearCrossEntropy.apply(hidden, weight, bias, labels, rows, label_smoothing, chunk_tokens,
                                      compute_dtype, needs_grad)
    return total / (count.clamp(min=1) if rows is not None else max(count, 1))


class _LinearCrossEntropy(torch.autograd.Function):
    """Σ over tokens of the label-smoothed cross-entropy of hidden @ weight.T + bias.

    The gradients are taken in the forward, chunk by chunk, while each chunk's logits are at hand, and
    kept until backward scales them by the incoming gradient: three matmuls of [tokens, H] by [H, V], as
    the unfused head costs, where recomputing the logits in backward would cost four. What waits for
    backward is the size of the inputs (hidden's and the weight's gradients), never the logits.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, rows, smoothing, chunk_tokens, compute_dtype, needs_grad):
        wanted = ctx.needs_input_grad[:3] if needs_grad else (False, False, False)
        total = hidden.new_zeros((), dtype=torch.float32)
        grad_hidden, grad_weight, grad_bias = [], None, None
        with torch.autocast(hidden.device.type, enabled=False):  # dtypes are chosen here, not by autocast
            weight_c = weight.to(compute_dtype)
            for start in range(0, hidden.shape[0], chunk_tokens):
                hidden_c = hidden[start:start + chunk_tokens].to(compute_dtype)
                rows_c = None if rows is None else rows[start:start + chunk_tokens]
                if rows_c is not None:  # an ignored token's state (padding: any value, nan too) reaches no sum
                    hidden_c = torch.where(rows_c[:, None], hidden_c, 0.0)
                loss, dlogits = _chunk(hidden_c, weight_c, bias, labels[start:start + chunk_tokens], smoothing,
                                       any(wanted), rows_c)
                total += loss
                if wanted[2]:
                    grad_bias = _add(grad_bias, dlogits.sum(0))
                if wanted[0] or wanted[1]:
                    dlogits = dlogits.to(compute_dtype)  # the matmuls' dtype, as autocast's backward would
                if wanted[0]:
                    grad_hidden.append(dlogits @ weight_c)
                if wanted[1]:
                    grad_weight = _add(grad_weight, dlogits.T @ hidden_c)
                del dlogits  # before the next chunk's logits are made
        if hidden.shape[0] == 0:  # no token counted: zero gradients, as the unfused loss gives (DDP waits for them)
            grad_weight, grad_bias = (torch.zeros_like(t, dtype=torch.float32) if want else None
                                      for t, want in zip((weight, bias), wanted[1:]))
        ctx.grads = (_rows(grad_hidden, hidden) if wanted[0] else None, grad_weight, grad_bias)
        ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        if ctx.grads is None:  # freed below, as autograd frees saved tensors after a backward
            raise RuntimeError("Trying to backward through linear_cross_entropy a second time")
        # in place: these are this function's own tensors, and a weight-sized copy is a pass over memory
        scaled = [g.mul_(grad_total).to(dtype) if g is not None else None for g, dtype in zip(ctx.grads, ctx.dtypes)]
        ctx.grads = None  # the loss tensor may live on into the next forward; its gradients need not
        return (*scaled, None, None, None, None, None, None)


def _chunk(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
           smoothing: float, with_grad: bool, rows: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One chunk's summed loss, (1−ε)·(−log p_y) + ε·mean_v(−log p_v) as F.cross_entropy smooths, and with
    `with_grad` its gradient by the logits, softmax − (1−ε)·onehot(y) − ε/V, in float32. `rows` (bool): the
    tokens that count; the others (an ignored label, any value) add 0 to both."""
    if rows is not None:
        labels = labels.clamp(min=0)  # an ignored label indexes something; its row is weighed 0 below
    logits = (hidden @ weight.T).float()
    if bias is not None:
        logits += bias
    # Everything in place on this one [chunk, V] tensor, each sum read before the next step overwrites it.
    logits -= logits.amax(-1, keepdim=True)  # so that exp cannot overflow
    picked, mean = logits.gather(1, labels[:, None]).squeeze(1), logits.mean(-1)
    probs = logits.exp_()
    sum_exp = probs.sum(-1)
    per_token = sum_exp.log() - (1.0 - smoothing) * picked - smoothing * mean
    loss = (per_token if rows is None else torch.where(rows, per_token, 0.0)).sum()
    if not with_grad:
        return loss, None
    probs /= sum_exp[:, None]
    probs[torch.arange(len(labels), device=labels.device), labels] -= 1.0 - smoothing
    if smoothing:
        probs -= smoothing / probs.shape[-1]
    if rows is not None:
        probs.masked_fill_(~rows[:, None], 0.0)  # (not a product: an ignored row's value may be anything)
    return loss, probs


def _rows(parts: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """The chunks' rows as one tensor (no copy for a single chunk; zero rows for none)."""
    if len(parts) == 1:
        return parts[0]
    return torch.cat(parts) if parts else torch.zeros_like(like)


def _add(total: torch.Tensor | None, part: torch.Tensor) -> torch.Tensor:
    """Sum over chunks in float32; the first chunk's part starts it (no zero-filled buffer to add into)."""
    part = part.float()
    return part if total is None else total.add_(part)


def kd_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor,
          temperature: float = 1.0) -> torch.Tensor:
    """T² · KL(teacher || student) of the temperature-softened distributions, averaged over mask."""
    keep = mask.bool()
    student = F.log_softmax(_kept(student_logits, keep).float() / temperature, dim=-1)
    teacher = F.log_softmax(_kept(teacher_logits, keep).float() / temperature, dim=-1)
    # T² keeps the gradient scale independent of T (Hinton et al. 2015, section 2). A zeroed position's two
    # distributions are the same uniform one, so its KL is exactly 0.
    kl = F.kl_div(student, teacher, log_target=True, reduction="none").sum(-1)
    return temperature ** 2 * _mean_over(kl, keep)


def kd_mse(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error of the logits over the vocabulary, averaged over mask positions."""
    keep = mask.bool()
    diff = _kept(student_logits, keep).float() - _kept(teacher_logits, keep).float()
    return _mean_over(diff.pow(2).mean(-1), keep)


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
        diff = _kept(student_hidden[i + 1], keep).float() - _kept(teacher_hidden[t + 1], keep).float()
        total = total + _mean_over(diff.pow(2).mean(-1), keep)
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
        diff = (_kept(student_attn[i].permute(0, 2, 3, 1), pairs).float()
                - _kept(teacher_attn[t].permute(0, 2, 3, 1), pairs).float())
        total = total + _mean_over(diff.pow(2).mean(-1), pairs)
    return total
