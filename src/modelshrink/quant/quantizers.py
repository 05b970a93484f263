"""Weight and activation quantizers of DQ-BART (Li et al. 2022, §2.1 and Appendix A).

A weight w is replaced by alpha · b, with b a small integer tensor (int8) and alpha a float32 scale:

    bits 3..8  symmetric linear:  th = 2^(bits-1) - 1,  alpha = max|w| / th,
                                  b = clamp(round(w / alpha), -th, th)
    bits 2     ternary (TWN):     Δ = 0.7 · mean|w|,  b = sign(w) where |w| > Δ else 0,
                                  alpha = mean of |w| over the entries with |w| > Δ

Granularity: per tensor (alpha is a 0-d tensor) or per row (alpha has shape [rows, 1]; a row is
dim 0 of a 2-D weight: one output feature of nn.Linear, one token of an embedding). A tensor or
row that is all zeros gets alpha = 1 and b = 0. round() is torch.round, i.e. halves go to the even
integer; scales and divisions are float32, as on the device the model runs on.

Re-quantizing a dequantized weight gives back exactly the same (b, alpha), for every bit width and
both granularities, so a model saved as (b, alpha) and reloaded computes exactly what it computed
in memory. For symmetric quantization this holds because alpha is exactly the float32 quotient
max|w| / th (see `_scale`); for ternary, because alpha is averaged in float64 (see `ternary`).
Both need alpha kept in float32 (a scale stored in half precision no longer round-trips). Inputs
must be finite; behaviour on inf/nan or on magnitudes near float32's maximum is unspecified.

`fake_quantize` and `fake_quantize_activation` are the training-time forms: the forward value is
the quantized one, the gradient passes straight through (STE), because DQ-BART and TernaryBERT
train the full-precision latent weights.
"""

from __future__ import annotations

import torch

from modelshrink.quant.spec import code_threshold

_FLOAT32_TINY = torch.finfo(torch.float32).tiny


def _threshold(bits: int) -> int:
    if bits not in range(3, 9):
        raise ValueError(f"symmetric quantization takes 3 to 8 bits (2 bits is ternary), got {bits!r}")
    return code_threshold(bits)


def _check_per_row(w: torch.Tensor, per_row: bool) -> None:
    if per_row and w.dim() != 2:
        raise ValueError(f"per-row quantization needs a 2-D weight, got shape {tuple(w.shape)}")


def _scale(max_abs: torch.Tensor, th: int) -> torch.Tensor:
    # Re-quantizing alpha·b finds max|w'| = fl(alpha·th) and the scale fl(fl(alpha·th)/th). That
    # is alpha again exactly when alpha = fl(m/th) is itself a float32 quotient by th: checked for
    # every float32 m in [1, 2) and th = 3..127, and division commutes with powers of two, so it
    # holds for every normal m. An arbitrary float32 alpha is not that lucky (~11% come back an
    # ulp off at 4 bits), so the scale must stay exactly this quotient, computed in float32.
    alpha = max_abs / th
    # Zero rows, and scales below float32's smallest normal (where round(w / alpha) loses
    # precision and the argument above is unchecked) are treated as zero: alpha = 1, b = 0.
    return torch.where(alpha >= _FLOAT32_TINY, alpha, torch.ones_like(alpha))


def _max_abs(w: torch.Tensor, per_row: bool) -> torch.Tensor:
    if w.numel() == 0:  # amax refuses empty reductions
        return w.new_zeros((w.shape[0], 1) if per_row else ())
    return w.abs().amax(dim=1, keepdim=True) if per_row else w.abs().amax()


def symmetric(w: torch.Tensor, bits: int, per_row: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric linear quantization: returns (b int8 in [-th, th], alpha float32), th = 2^(bits-1)-1.

    alpha = max|w| / th per tensor (0-d) or per row ([rows, 1]); a zero tensor/row gets alpha = 1.
    """
    th = _threshold(bits)
    _check_per_row(w, per_row)
    w = w.detach().float()
    alpha = _scale(_max_abs(w, per_row), th)
    b = torch.round(w / alpha).clamp_(-th, th).to(torch.int8)
    return b, alpha


def ternary(w: torch.Tensor, per_row: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """TWN ternarization: returns (b int8 in {-1, 0, 1}, alpha float32).

    Δ = 0.7 · mean|w|; b = sign(w) where |w| > Δ else 0; alpha = mean of |w| where |w| > Δ
    (1 where no entry exceeds Δ, which happens only for an all-zero tensor/row).
    """
    _check_per_row(w, per_row)
    w = w.detach().float()
    absw = w.abs()
    dims = dict(dim=1, keepdim=True) if per_row else {}
    # float64 sums: a dequantized ternary weight holds k copies of alpha, and k·alpha is exact in
    # float64 (for k < 2^29), so its mean is exactly alpha again; float32 sums drift by ulps.
    count_all = max(w.shape[1] if per_row else w.numel(), 1)
    # Δ is compared in float32 whatever the granularity, so per-row and per-tensor agree on ties.
    delta = (0.7 * absw.sum(dtype=torch.float64, **dims) / count_all).float()
    keep = absw > delta
    kept = keep.sum(dtype=torch.float64, **dims)
    total = torch.where(keep, absw, 0.0).sum(dtype=torch.float64, **dims)
    alpha = torch.where(kept > 0, total / kept.clamp(min=1), 1.0).float()
    b = (torch.sign(w) * keep).to(torch.int8)
    return b, alpha


def quantize_weight(w: torch.Tensor, bits: int, per_row: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, alpha) for a weight: bits 2 is ternary (TWN), 3..8 symmetric; anything else is a ValueError."""
    if bits not in range(2, 9):
        raise ValueError(f"weight quantization takes 2 (ternary) to 8 bits, got {bits!r}")
    return ternary(w, per_row) if bits == 2 else symmetric(w, bits, per_row)


def dequantize(b: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """alpha · b as float32 (alpha broadcasts: 0-d per tensor, [rows, 1] per row)."""
    return alpha.float() * b.float()


def _fake_weight(w: torch.Tensor, bits: int, per_row: bool) -> torch.Tensor:
    """dequantize(*quantize_weight(w, bits, per_row)) in w's dtype, bit for bit, in fewer passes over w.

    The same arithmetic as `symmetric` and `ternary` (the same scales, the same float64 sums, the same roundings);
    the integer codes are never materialised: a code times its scale is formed in place, and `+ 0.0` turns the
    -0.0 a negative weight rounded to code 0 would give into the +0.0 that dequantizing the int8 code 0 gives."""
    if bits not in range(2, 9):
        raise ValueError(f"weight quantization takes 2 (ternary) to 8 bits, got {bits!r}")
    _check_per_row(w, per_row)
    wf = w.float()
    if wf.numel() == 0:
        return w.clone()
    dims = dict(dim=1, keepdim=True) if per_row else {}
    if bits == 2:
        absw = wf.abs()
        count_all = max(wf.shape[1] if per_row else wf.numel(), 1)
        delta = (0.7 * absw.sum(dtype=torch.float64, **dims) / count_all).float()
        keep = absw > delta
        kept = keep.sum(dtype=torch.int32, **dims).double()  # counts: exact in int32 and in float64
        total = absw.mul_(keep).sum(dtype=torch.float64, **dims)  # |w| kept, +0.0 elsewhere: ternary's sum
        alpha = torch.where(kept > 0, total / kept.clamp(min=1), 1.0).float()
        q = torch.where(keep, alpha, 0.0).copysign_(wf)
    else:
        th = _threshold(bits)
        low, high = torch.aminmax(wf, **dims)  # max|w| without a tensor of |w|
        alpha = _scale(torch.maximum(-low, high), th)
        q = torch.round(wf / alpha).clamp_(-th, th).mul_(alpha)
    return q.add_(0.0).to(w.dtype)


# Straight-through estimators: forward the quantized value, computed without autograd; backward the gradient
# unchanged. One node each instead of `q + (x - x.detach())`'s subtraction and addition, which cost two more
# passes over every weight and activation each forward; and the forward value is exactly q.
class _FakeWeight(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, bits, per_row):
        return _fake_weight(w, bits, per_row)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class _FakeActivation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, th):
        return _fake_activation(x, th)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def fake_quantize(w: torch.Tensor, bits: int, per_row: bool = False) -> torch.Tensor:
    """dequantize(quantize_weight(w)) in the forward pass, identity gradient to w (STE).

    The result has w's dtype; for float32 w it equals dequantize(*quantize_weight(w)) bit for bit.
    """
    return _FakeWeight.apply(w, bits, per_row)


def _fake_activation(x: torch.Tensor, th: int) -> torch.Tensor:
    xf = x.float()
    low, high = torch.aminmax(xf) if xf.numel() else (xf.new_zeros(()), xf.new_zeros(()))
    max_abs = torch.maximum(-low, high)  # max|x| without a tensor of |x|
    alpha = torch.where(max_abs > 0, max_abs / th, 1.0)
    # + 0.0: the +0.0 that `q + (x - x.detach())` made of a code 0 of a negative x (and the export's form makes)
    return torch.round(xf / alpha).clamp_(-th, th).mul_(alpha).add_(0.0).to(x.dtype)


def fake_quantize_activation(x: torch.Tensor, bits: int = 8, clip: float | None = None) -> torch.Tensor:
    """Symmetric per-tensor quantization of an activation, with a straight-through gradient.

    th = 2^(bits-1) - 1 (bits 3..8; DQ-BART uses 8). The step is alpha = max|x| / th, measured on
    this very tensor at each call (dynamic); an all-zero tensor stays zero. With clip=c > 0, x is
    first clamped to [-c, c] and the step measured on the clamped tensor, as the DQ-BART authors'
    quantizer does (TernaryBERT's, c = 2.5): alpha = c / th whenever some |x| reaches c, smaller
    when none does; the gradient is 1 for |x| <= c and 0 beyond. Without clip nothing is clamped
    and the gradient is 1 everywhere. The output is round(x / alpha) · alpha (halves to even) in
    x's dtype, computed in float32.
    """
    th = _threshold(bits)
    if clip is not None:
        if not 0 < float(clip) < float("inf"):
            raise ValueError(f"activation clip must be a positive finite number, got {clip!r}")
        clip = float(clip)
        x = x.clamp(-clip, clip)  # clamp's gradient is 0 outside [-clip, clip], 1 on and inside
    if torch.jit.is_tracing():  # the ONNX export: the graph `modelshrink.onnx.rounding` finds and rewrites
        return _traced_activation(x, th)
    return _FakeActivation.apply(x, th)


def _traced_activation(x: torch.Tensor, th: int) -> torch.Tensor:
    """The same values as `_FakeActivation`, written as the exporter's tracing needs them: `q + (x - x.detach())`
    (Add of Sub(x, x), by which `modelshrink.onnx.rounding.straight_through` knows a rounding) with
    q = clip(round(x / α), -th, th) · α, α from max|x|."""
    with torch.no_grad():
        xf = x.detach().float()
        max_abs = xf.abs().amax() if xf.numel() else xf.new_zeros(())
        alpha = torch.where(max_abs > 0, max_abs / th, 1.0)
        q = (torch.round(xf / alpha).clamp_(-th, th) * alpha).to(x.dtype)
    return q + (x - x.detach())
