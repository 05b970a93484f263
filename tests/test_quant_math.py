"""Quantizer and packing arithmetic (DQ-BART §2.1, Appendix A) on hand-worked and random tensors."""

import warnings

import pytest
import torch

from modelshrink.quant.packing import BITS_PER_VALUE, pack, packed_bytes, unpack
from modelshrink.quant.quantizers import (dequantize, fake_quantize, fake_quantize_activation,
                                          quantize_weight, symmetric, ternary)


def _int8(values):
    return torch.tensor(values, dtype=torch.int8)


def test_symmetric_4bit_by_hand():
    # th = 2^3 - 1 = 7, alpha = max|w| / 7 = 1/7; w / alpha = w · 7 = [-7, 4.2, 1.82, 0]
    # -> round -> [-7, 4, 2, 0]. (0.5 would be a bad example: 0.5·7 = 3.5 is a tie, and in float32
    # 0.5 / fl(1/7) = 3.4999998, which rounds to 3.)
    b, alpha = symmetric(torch.tensor([-1.0, 0.6, 0.26, 0.0]), bits=4)
    assert b.dtype == torch.int8 and alpha.dtype == torch.float32 and alpha.dim() == 0
    assert torch.equal(b, _int8([-7, 4, 2, 0]))
    assert alpha.item() == pytest.approx(1 / 7, rel=1e-6)


def test_symmetric_8bit_by_hand():
    # th = 127, alpha = 1/127; w · 127 = [25.4, -50.8, 127, 1.27] -> [25, -51, 127, 1]
    b, alpha = symmetric(torch.tensor([0.2, -0.4, 1.0, 0.01]), bits=8)
    assert torch.equal(b, _int8([25, -51, 127, 1]))
    assert alpha.item() == pytest.approx(1 / 127, rel=1e-6)


def test_symmetric_per_row_against_per_tensor():
    w = torch.tensor([[-1.0, 0.6, 0.26, 0.0],
                      [0.1, -0.4, 0.05, 0.0],
                      [0.0, 0.0, 0.0, 0.0]])
    # Per tensor, alpha = 1/7 for every row: row 1 · 7 = [0.7, -2.8, 0.35, 0] -> [1, -3, 0, 0].
    b, alpha = symmetric(w, bits=4)
    assert alpha.dim() == 0
    assert torch.equal(b, _int8([[-7, 4, 2, 0], [1, -3, 0, 0], [0, 0, 0, 0]]))
    # Per row, row 1 has alpha = 0.4/7: row 1 · 17.5 = [1.75, -7, 0.875, 0] -> [2, -7, 1, 0];
    # the zero row gets alpha = 1 and b = 0.
    b, alpha = symmetric(w, bits=4, per_row=True)
    assert alpha.shape == (3, 1)
    assert torch.equal(b, _int8([[-7, 4, 2, 0], [2, -7, 1, 0], [0, 0, 0, 0]]))
    assert alpha[:, 0].tolist() == pytest.approx([1 / 7, 0.4 / 7, 1.0], rel=1e-6)


def test_zero_tensor_gets_unit_scale():
    for bits in (2, 4, 8):
        b, alpha = quantize_weight(torch.zeros(3, 5), bits)
        assert alpha.item() == 1.0 and not b.any()


def test_ternary_by_hand():
    # mean|w| = (0.9 + 0.6 + 0.1 + 0.05 + 0.3 + 0) / 6 = 1.95 / 6 = 0.325, Δ = 0.7 · 0.325 = 0.2275;
    # |w| > Δ for 0.9, -0.6, 0.3 -> b = [1, -1, 0, 0, 1, 0], alpha = (0.9 + 0.6 + 0.3) / 3 = 0.6.
    b, alpha = ternary(torch.tensor([0.9, -0.6, 0.1, -0.05, 0.3, 0.0]))
    assert b.dtype == torch.int8 and alpha.dim() == 0
    assert torch.equal(b, _int8([1, -1, 0, 0, 1, 0]))
    assert alpha.item() == pytest.approx(0.6, rel=1e-6)


def test_ternary_per_row_against_per_tensor():
    w = torch.tensor([[0.9, -0.6, 0.1, -0.05, 0.3, 0.0],
                      [0.02, -0.01, 0.0, 0.0, 0.0, 0.03],
                      [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    # Per tensor: mean|w| = (1.95 + 0.06) / 18 = 0.111667, Δ = 0.078167; row 0's 0.9, -0.6, 0.1
    # and 0.3 exceed it, nothing in row 1 does; alpha = (0.9 + 0.6 + 0.1 + 0.3) / 4 = 0.475.
    b, alpha = ternary(w)
    assert torch.equal(b, _int8([[1, -1, 1, 0, 1, 0], [0] * 6, [0] * 6]))
    assert alpha.item() == pytest.approx(0.475, rel=1e-6)
    # Per row: row 0 as in test_ternary_by_hand; row 1 mean|w| = 0.06 / 6 = 0.01, Δ = 0.007,
    # 0.02, -0.01, 0.03 exceed it, alpha = 0.06 / 3 = 0.02; the zero row gets alpha = 1, b = 0.
    b, alpha = ternary(w, per_row=True)
    assert alpha.shape == (3, 1)
    assert torch.equal(b, _int8([[1, -1, 0, 0, 1, 0], [1, -1, 0, 0, 0, 1], [0] * 6]))
    assert alpha[:, 0].tolist() == pytest.approx([0.6, 0.02, 1.0], rel=1e-6)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_fake_quantize_value_and_straight_through_gradient(bits):
    w = torch.randn(6, 10, generator=torch.Generator().manual_seed(bits), requires_grad=True)
    for per_row in (False, True):
        out = fake_quantize(w, bits, per_row)
        # Exactly the weight that would be saved, not an ulp off.
        assert torch.equal(out, dequantize(*quantize_weight(w, bits, per_row)))
        w.grad = None
        out.sum().backward()
        assert torch.equal(w.grad, torch.ones_like(w))


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_fake_quantize_is_the_saved_weight_bit_for_bit(bits):
    """The fused forward (codes times scales formed in place, issue 54) gives exactly the float32 bits of
    dequantizing the saved integers: zero rows, zeros' sign, tiny and large scales, per tensor and per row."""
    generator = torch.Generator().manual_seed(bits)
    for scale in (1e-30, 1e-3, 1.0, 300.0):
        w = torch.randn(37, 53, generator=generator) * scale
        w[3] = 0.0
        w[5, :7] = -0.0
        w[8] = -w[8].abs()  # a row of negatives: its codes 0 must come out +0.0, as dequantized int8 zeros do
        for per_row in (False, True):
            out = fake_quantize(w, bits, per_row)
            saved = dequantize(*quantize_weight(w, bits, per_row))
            assert torch.equal(out.view(torch.int32), saved.view(torch.int32)), (scale, per_row)
    half = torch.randn(16, 24, generator=generator).to(torch.bfloat16)
    assert torch.equal(fake_quantize(half, bits, True), dequantize(*quantize_weight(half, bits, True)).bfloat16())


def test_fake_quantize_activation_is_round_to_the_max_abs_step_bit_for_bit():
    """The activation's forward value is round(x / alpha) · alpha with alpha = max|x| / th, whichever way max|x|
    is found (min and max here, without a tensor of |x|): every bit, a negative maximum, bf16 in, all zeros."""
    generator = torch.Generator().manual_seed(0)
    for x in (torch.randn(4, 33, 17, generator=generator) * 5, -torch.rand(50, generator=generator) - 3,
              torch.zeros(6), (torch.randn(8, 9, generator=generator) * 2).bfloat16()):
        for bits in (8, 4):
            th = 2 ** (bits - 1) - 1
            xf = x.float()
            max_abs = xf.abs().amax()
            alpha = torch.where(max_abs > 0, max_abs / th, 1.0)
            expected = (torch.round(xf / alpha).clamp(-th, th) * alpha + 0.0).to(x.dtype)  # + 0.0: no -0.0
            out = fake_quantize_activation(x, bits)
            assert out.dtype == x.dtype
            assert torch.equal(out.float().view(torch.int32), expected.float().view(torch.int32)), (x.shape, bits)


def test_fake_quantize_activation_traced_for_export_gives_the_training_values():
    """Under the ONNX exporter's tracing the rounding takes the form `modelshrink.onnx.rounding` reads
    (an Add of Sub(x, x)); its values are those of the straight-through node training uses, bit for bit."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, 11, generator=generator) * 4
    for clip in (None, 2.5):
        with warnings.catch_warnings():  # torch.jit.trace is deprecated, but it is what the exporter runs
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(lambda t, c=clip: fake_quantize_activation(t, 8, c), (x,))
        assert "aten::sub" in str(traced.graph) and "aten::add" in str(traced.graph)
        fresh = torch.randn(3, 7, 11, generator=generator) * 4
        assert torch.equal(traced(fresh).view(torch.int32), fake_quantize_activation(fresh, 8, clip).view(torch.int32))


def test_fake_quantize_activation_dynamic_range():
    x = torch.tensor([-2.0, 0.5, 1.0, 0.0], requires_grad=True)
    out = fake_quantize_activation(x, bits=8)
    # alpha = 2 / 127: -2 stays -2 exactly, everything is on the grid and within alpha/2 of x.
    alpha = 2 / 127
    assert out[0].item() == -2.0
    assert torch.allclose(out / alpha, torch.round(out / alpha), atol=1e-4)
    assert (out - x).abs().max().item() <= alpha / 2 + 1e-6
    out.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


def test_fake_quantize_activation_clip_zeroes_gradient_outside():
    x = torch.tensor([-3.0, -1.0, 0.3, 1.0, 2.5], requires_grad=True)
    out = fake_quantize_activation(x, bits=8, clip=1.0)
    assert out[0].item() == -1.0 and out[-1].item() == 1.0  # clamped to ±clip
    assert out[2].item() == pytest.approx(round(0.3 * 127) / 127, rel=1e-6)
    out.sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]  # 1 inside and on ±clip, 0 beyond


def test_fake_quantize_activation_clip_scales_by_the_clamped_maximum():
    """The DQ-BART authors' rule: clamp, then the dynamic max-abs step of what is left; a tensor inside the clip
    is quantized exactly as without it, one with outliers on the grid of clip / th."""
    inside = torch.tensor([-0.5, 0.1, 0.25])
    assert torch.equal(fake_quantize_activation(inside, clip=2.5), fake_quantize_activation(inside))
    outliers = torch.tensor([-30.0, 0.011, 1.3, 12.0])
    out = fake_quantize_activation(outliers, clip=2.5)
    step = torch.tensor(2.5) / 127
    assert torch.equal(out, torch.round(outliers.clamp(-2.5, 2.5) / step) * step)
    # without the clip the step is 30 / 127: 0.011 rounds to 0 and 1.3 to a coarse level
    assert fake_quantize_activation(outliers)[1].item() == 0.0 and out[1].item() != 0.0


def test_fake_quantize_activation_rejects_bad_clip():
    for clip in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError):
            fake_quantize_activation(torch.ones(3), clip=clip)


def _random_weights(seed):
    g = torch.Generator().manual_seed(seed)
    for shape in [(1, 1), (1, 7), (5, 13), (64, 30), (3, 600)]:
        for scale in (1e-30, 0.02, 3e5):
            yield torch.randn(shape, generator=g) * scale
    yield torch.randn(4, 9, generator=g).masked_fill(torch.arange(4).unsqueeze(1) == 2, 0.0)  # a zero row
    yield torch.randint(-3, 4, (8, 8), generator=g).float() / 3  # many exact ties


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 7, 8])
def test_requantizing_dequantized_weights_is_exact(bits):
    for w in _random_weights(bits):
        for per_row in (False, True):
            b, alpha = quantize_weight(w, bits, per_row)
            b2, alpha2 = quantize_weight(dequantize(b, alpha), bits, per_row)
            assert torch.equal(b2, b) and torch.equal(alpha2, alpha), (tuple(w.shape), per_row)
            # Also for a one-dimensional view of the same weight (per tensor).
            b3, alpha3 = quantize_weight(dequantize(b, alpha).reshape(-1), bits)
            if not per_row:
                assert torch.equal(b3, b.reshape(-1)) and torch.equal(alpha3, alpha)


@pytest.mark.parametrize("bits", [3, 4, 8])
def test_requantizing_is_exact_for_many_row_scales(bits):
    # Row maxima spread over many mantissas: exactness rests on fl(fl(a·th)/th) == a for every
    # scale a = fl(max/th); an alpha not computed as that quotient comes back an ulp off for ~11%
    # of values at 4 bits.
    g = torch.Generator().manual_seed(0)
    w = torch.rand(20000, 3, generator=g) * torch.rand(20000, 1, generator=g) * 10
    b, alpha = quantize_weight(w, bits, per_row=True)
    b2, alpha2 = quantize_weight(dequantize(b, alpha), bits, per_row=True)
    assert torch.equal(b2, b) and torch.equal(alpha2, alpha)


def test_bad_bit_widths_are_rejected():
    w = torch.randn(4, 4)
    for bits in (1, 9):
        for call in (lambda: quantize_weight(w, bits), lambda: symmetric(w, bits),
                     lambda: fake_quantize(w, bits), lambda: fake_quantize_activation(w, bits),
                     lambda: pack(torch.zeros(4, dtype=torch.int8), bits),
                     lambda: packed_bytes(4, bits)):
            with pytest.raises(ValueError):
                call()
    with pytest.raises(ValueError):
        symmetric(w, 2)  # 2 bits is ternary, not symmetric
    with pytest.raises(ValueError):
        quantize_weight(torch.randn(2, 3, 4), 4, per_row=True)


@pytest.mark.parametrize("bits", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("numel", [0, 1, 2, 4, 5, 7, 11, 1001])
def test_pack_round_trip(bits, numel):
    th = 2 ** (bits - 1) - 1
    g = torch.Generator().manual_seed(numel * 10 + bits)
    values = torch.randint(-th, th + 1, (numel,), generator=g).to(torch.int8)
    if numel >= 2:
        values[0], values[-1] = -th, th  # the extremes of the range
    packed = pack(values, bits)
    assert packed.dtype == torch.uint8 and packed.dim() == 1
    assert packed.numel() == packed_bytes(numel, bits)
    assert torch.equal(unpack(packed, bits, numel), values)


def test_pack_takes_any_shape_in_row_major_order():
    b = torch.tensor([[1, -1, 0], [0, 1, 1]], dtype=torch.int8)
    for bits in (2, 4, 8):
        assert torch.equal(unpack(pack(b, bits), bits, b.numel()).view(2, 3), b)
        assert torch.equal(unpack(pack(b.t(), bits), bits, b.numel()).view(3, 2), b.t())


def test_pack_layouts_by_hand():
    # 4 bits: -1 is nibble 0xF, 3 is 0x3; value 0 in the low nibble -> byte 0x3F = 63.
    assert pack(_int8([-1, 3]), 4).tolist() == [0x3F]
    # Ternary: trits (v + 1) = [2, 1, 0, 1, 2] -> 2 + 1·3 + 0·9 + 1·27 + 2·81 = 194; the tail of
    # [1] is padded with value 0: 2 + 1·3 + 1·9 + 1·27 + 1·81 = 122.
    assert pack(_int8([1, 0, -1, 0, 1, 1]), 2).tolist() == [194, 122]
    assert pack(_int8([-127, 127]), 8).tolist() == [129, 127]


def test_ternary_density():
    trits = torch.randint(-1, 2, (1_000_000,), generator=torch.Generator().manual_seed(1)).to(torch.int8)
    packed = pack(trits, 2)
    assert packed.numel() == packed_bytes(1_000_000, 2) == 200_000
    assert 8 * packed.numel() / trits.numel() == BITS_PER_VALUE[2] == 1.6
    assert torch.equal(unpack(packed, 2, trits.numel()), trits)


def test_bits_per_value_matches_packed_bytes():
    for bits, density in BITS_PER_VALUE.items():
        assert packed_bytes(1000, bits) * 8 / 1000 == density


def test_pack_and_unpack_refuse_invalid_data():
    with pytest.raises(ValueError):
        pack(_int8([4]), 3)  # 3-bit codes lie in [-3, 3]
    with pytest.raises(ValueError):
        pack(_int8([-128]), 8)
    with pytest.raises(ValueError):
        pack(_int8([2]), 2)
    with pytest.raises(ValueError):
        pack(torch.tensor([1, 0]), 4)  # int64, not int8
    with pytest.raises(ValueError):
        unpack(pack(_int8([1, 0, -1]), 2), 2, 6)  # 6 trits need 2 bytes, not 1
    with pytest.raises(ValueError):
        unpack(torch.tensor([250], dtype=torch.uint8), 2, 5)  # not a base-3 byte
    with pytest.raises(ValueError):
        unpack(pack(_int8([7, -7]), 4), 3, 2)  # 4-bit data read as 3-bit
