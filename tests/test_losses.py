"""training/losses.py: each loss against a direct computation, zero for a perfect student, blind to padding."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DOCUMENTS, FAMILIES, SUMMARIES, build

from modelshrink.training.losses import (attention_mse, hidden_mse, kd_kl, kd_mse, label_smoothed_cross_entropy)
from modelshrink.models.shrink import shrink


def _logits(seed=0, shape=(2, 3, 5)):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * 2


MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])


# --- logits losses against hand computations ------------------------------------------------------

def test_kd_kl_matches_hand_computation():
    s, t, T = _logits(0), _logits(1), 2.0
    total, count = 0.0, 0
    for b in range(2):
        for pos in range(3):
            if not MASK[b, pos]:
                continue
            zs = [math.exp(x / T) for x in s[b, pos].tolist()]
            zt = [math.exp(x / T) for x in t[b, pos].tolist()]
            ps = [z / sum(zs) for z in zs]
            pt = [z / sum(zt) for z in zt]
            total += sum(p * math.log(p / q) for p, q in zip(pt, ps))
            count += 1
    expected = T * T * total / count
    assert kd_kl(s, t, MASK, temperature=T).item() == pytest.approx(expected, rel=1e-5)
    # the T² factor: at T = 1 the same sum without it
    assert kd_kl(s, t, MASK, temperature=2.0).item() != pytest.approx(kd_kl(s, t, MASK).item(), rel=1e-3)


def test_kd_kl_is_float32_and_direction_is_teacher_first():
    s, t = _logits(0).half(), _logits(1).half()
    loss = kd_kl(s, t, MASK)
    assert loss.dtype == torch.float32
    pt = torch.softmax(t.float(), -1)
    forward = (pt * (pt.log() - torch.log_softmax(s.float(), -1))).sum(-1)[MASK.bool()].mean()
    assert loss.item() == pytest.approx(forward.item(), rel=1e-5)


def test_kd_mse_matches_hand_computation():
    s, t = _logits(0), _logits(1)
    per_pos = [((s[b, p] - t[b, p]) ** 2).mean().item() for b in range(2) for p in range(3) if MASK[b, p]]
    assert kd_mse(s, t, MASK).item() == pytest.approx(sum(per_pos) / len(per_pos), rel=1e-6)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_label_smoothed_cross_entropy_matches_hand_computation(smoothing):
    logits = _logits(0)
    labels = torch.tensor([[4, 0, -100], [2, -100, -100]])
    total, count = 0.0, 0
    for b in range(2):
        for p in range(3):
            y = labels[b, p].item()
            if y == -100:
                continue
            logp = torch.log_softmax(logits[b, p], -1)
            total += (1 - smoothing) * -logp[y].item() + smoothing * -logp.mean().item()
            count += 1
    loss = label_smoothed_cross_entropy(logits, labels, smoothing=smoothing)
    assert loss.item() == pytest.approx(total / count, rel=1e-6)


def test_label_smoothed_cross_entropy_custom_ignore_index_and_all_ignored():
    logits = _logits(0)
    labels = torch.tensor([[4, 0, 1], [2, 1, 1]])
    expected = label_smoothed_cross_entropy(logits, torch.where(labels == 1, -100, labels))
    assert label_smoothed_cross_entropy(logits, labels, ignore_index=1).item() == pytest.approx(expected.item())
    assert label_smoothed_cross_entropy(logits, torch.full_like(labels, -100)).item() == 0.0


# --- zero for a perfect student, positive otherwise, blind to masked positions ---------------------

def test_logit_losses_zero_for_identical_and_positive_otherwise():
    t = _logits(1)
    assert kd_kl(t.clone(), t, MASK, temperature=2.0).item() == 0.0
    assert kd_mse(t.clone(), t, MASK).item() == 0.0
    s = t.clone()
    s[0, 1, 2] += 1.0
    assert kd_kl(s, t, MASK, temperature=2.0).item() > 0
    assert kd_mse(s, t, MASK).item() > 0


def test_masked_positions_do_not_count():
    s, t = _logits(0), _logits(1)
    changed = s.clone()
    changed[0, 2] = torch.tensor([1e4, float("nan"), float("inf"), -3.0, 0.0])
    changed[1, 1:] = 7.0
    assert torch.equal(kd_kl(changed, t, MASK, 2.0), kd_kl(s, t, MASK, 2.0))
    assert torch.equal(kd_mse(changed, t, MASK), kd_mse(s, t, MASK))
    labels = torch.tensor([[4, 0, -100], [2, -100, -100]])
    assert torch.equal(label_smoothed_cross_entropy(changed, labels, 0.1), label_smoothed_cross_entropy(s, labels, 0.1))

    hidden_t = [_logits(i, (2, 3, 4)) for i in range(3)]
    hidden_s = [h + 0.5 for h in hidden_t]
    moved = [h.clone() for h in hidden_s]
    for h in moved:
        h[0, 2] = 100.0
        h[1, 1:] = float("nan")
    assert torch.equal(hidden_mse(moved, hidden_t, [0, 1], MASK), hidden_mse(hidden_s, hidden_t, [0, 1], MASK))

    attn_t = [torch.softmax(_logits(i, (2, 2, 3, 3)), -1) for i in range(2)]
    attn_s = [torch.softmax(_logits(i + 5, (2, 2, 3, 3)), -1) for i in range(2)]
    moved = [a.clone() for a in attn_s]
    for a in moved:
        a[0, :, 2, :] = 9.0  # masked query
        a[0, :, :, 2] = 9.0  # masked key
        a[1, :, 1:, :] = float("nan")
        a[1, :, :, 1:] = float("nan")
    assert torch.equal(attention_mse(moved, attn_t, [1, 0], MASK, MASK),
                       attention_mse(attn_s, attn_t, [1, 0], MASK, MASK))


def test_hidden_and_attention_mse_match_hand_computation():
    hs = [torch.zeros(1, 3, 2)] + [torch.full((1, 3, 2), float(v)) for v in (1, 2)]
    ht = [torch.zeros(1, 3, 2)] + [torch.full((1, 3, 2), float(v)) for v in (0, 5, 10)]
    mask = torch.tensor([[1, 1, 0]])
    # student layer 0 ↔ teacher layer 2 (value 10): 81; student layer 1 ↔ teacher layer 0 (value 0): 4
    assert hidden_mse(hs, ht, [2, 0], mask).item() == pytest.approx(85.0)

    a_s = [torch.zeros(1, 2, 2, 3)]
    a_t = [torch.zeros(1, 2, 2, 3), torch.zeros(1, 2, 2, 3)]
    a_t[1][0, 0] = torch.tensor([[1.0, 2.0, 100.0], [3.0, 0.0, 100.0]])
    query_mask, key_mask = torch.tensor([[1, 1]]), torch.tensor([[1, 1, 0]])
    # counted pairs: 2 queries x 2 keys, 2 heads; squared errors 1 + 4 + 9 + 0 in head 0
    assert attention_mse(a_s, a_t, [1], query_mask, key_mask).item() == pytest.approx(14 / 8)


def test_size_mismatches_raise():
    with pytest.raises(ValueError, match="hidden size"):
        hidden_mse([torch.zeros(1, 2, 4)] * 2, [torch.zeros(1, 2, 8)] * 2, [0], torch.ones(1, 2))
    with pytest.raises(ValueError, match="heads"):
        attention_mse([torch.zeros(1, 2, 3, 3)], [torch.zeros(1, 4, 3, 3)], [0], torch.ones(1, 3), torch.ones(1, 3))
    with pytest.raises(ValueError, match="layer_map"):
        hidden_mse([torch.zeros(1, 2, 4)] * 3, [torch.zeros(1, 2, 4)] * 3, [0], torch.ones(1, 2))
    with pytest.raises(ValueError, match="layer_map"):
        attention_mse([torch.zeros(1, 2, 3, 3)], [torch.zeros(1, 2, 3, 3)], [1], torch.ones(1, 3), torch.ones(1, 3))


# --- on real (tiny) models ------------------------------------------------------------------------

def _outputs(model, batch):
    with torch.no_grad():
        return model(**batch, output_hidden_states=True, output_attentions=True)


def _all_losses(s, t, batch, enc_map, dec_map):
    enc_mask, dec_mask = batch["attention_mask"], batch["decoder_attention_mask"]
    return {
        "kd_kl": kd_kl(s.logits, t.logits, dec_mask, temperature=2.0),
        "kd_mse": kd_mse(s.logits, t.logits, dec_mask),
        "encoder_hidden": hidden_mse(s.encoder_hidden_states, t.encoder_hidden_states, enc_map, enc_mask),
        "decoder_hidden": hidden_mse(s.decoder_hidden_states, t.decoder_hidden_states, dec_map, dec_mask),
        "encoder_attention": attention_mse(s.encoder_attentions, t.encoder_attentions, enc_map, enc_mask, enc_mask),
        "decoder_attention": attention_mse(s.decoder_attentions, t.decoder_attentions, dec_map, dec_mask, dec_mask),
        "cross_attention": attention_mse(s.cross_attentions, t.cross_attentions, dec_map, dec_mask, enc_mask),
    }


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_model_losses_zero_for_perfect_student_positive_for_shrunk(family):
    teacher, tok = build(family, attn_implementation="eager")
    enc = tok(DOCUMENTS[:3], return_tensors="pt", padding=True)
    dec = tok(SUMMARIES[:3], return_tensors="pt", padding=True)
    assert (enc.attention_mask == 0).any() and (dec.attention_mask == 0).any()  # padding is exercised
    batch = dict(input_ids=enc.input_ids, attention_mask=enc.attention_mask,
                 decoder_input_ids=dec.input_ids, decoder_attention_mask=dec.attention_mask)
    t_out = _outputs(teacher, batch)

    # a student that keeps every layer is the teacher
    same = _outputs(shrink(teacher, [0, 1], [0, 1]), batch)
    for name, loss in _all_losses(same, t_out, batch, [0, 1], [0, 1]).items():
        assert loss.item() == 0.0, name
    assert label_smoothed_cross_entropy(same.logits, dec.input_ids).item() > 0

    # a one-layer student that copies layer 1 cannot reproduce layer 1's output (its input differs)
    small = _outputs(shrink(teacher, [1], [1]), batch)
    for name, loss in _all_losses(small, t_out, batch, [1], [1]).items():
        assert loss.item() > 0, name
