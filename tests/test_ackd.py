"""ACKD's loss terms against direct computations; the storage; gradients; the ablation switches."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from modelshrink.training.ackd import (ACKDObjective, DiscriminationPredictor, FeatureStorage, contrastive_loss,
                              feature_layer_pairs, kd_loss, layer_features, patient_loss)
from modelshrink.errors import UserError


def _direct_acdl(zs, zt, labels, bank=None, bank_labels=None, w=None, negatives="sum", tau=1.0):
    """Eq. 3 written out sample by sample (NEG summed, or averaged over the negatives; cosines / τ)."""
    keys = list(zt) + (list(bank) if bank is not None else [])
    key_labels = list(labels.tolist()) + (bank_labels.tolist() if bank_labels is not None else [])
    total = 0.0
    for i in range(len(zs)):
        cos = lambda a, b: float(torch.dot(a, b) / (a.norm() * b.norm()))  # noqa: E731
        pos = math.exp(cos(zs[i], zt[i]) / tau)
        terms = [math.exp(cos(zs[i], k) / tau) for k, y in zip(keys, key_labels) if y != labels[i]]
        neg = sum(terms) / (len(terms) if negatives == "mean" and terms else 1)
        if w is not None:
            neg /= float(w[i])
        total += -math.log(pos / (pos + neg))
    return total / len(zs)


@pytest.fixture
def tensors():
    g = torch.Generator().manual_seed(0)
    zs, zt = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    labels = torch.tensor([0, 1, 0, 2, 1])
    bank, bank_labels = torch.randn(6, 4, generator=g), torch.tensor([0, 0, 1, 2, 2, 1])
    w = torch.tensor([0.3, 0.9, 0.5, 0.7, 0.2])
    return zs, zt, labels, bank, bank_labels, w


def test_acdl_matches_the_direct_computation(tensors):
    zs, zt, labels, bank, bank_labels, w = tensors
    got = contrastive_loss(zs, zt, labels, bank, bank_labels, w)
    assert float(got) == pytest.approx(_direct_acdl(zs, zt, labels, bank, bank_labels, w), rel=1e-5)
    assert float(contrastive_loss(zs, zt, labels)) == pytest.approx(_direct_acdl(zs, zt, labels), rel=1e-5)


@pytest.mark.parametrize("negatives, tau", [("mean", 1.0), ("sum", 0.1), ("mean", 0.07)])
def test_acdl_readings_match_the_direct_computation(tensors, negatives, tau):
    zs, zt, labels, bank, bank_labels, w = tensors
    got = contrastive_loss(zs, zt, labels, bank, bank_labels, w, negatives=negatives, tau=tau)
    want = _direct_acdl(zs, zt, labels, bank, bank_labels, w, negatives=negatives, tau=tau)
    assert float(got) == pytest.approx(want, rel=1e-5)
    assert float(got) != pytest.approx(float(contrastive_loss(zs, zt, labels, bank, bank_labels, w)), rel=1e-3)
    with pytest.raises(UserError, match="--negatives must be one of sum, mean"):
        contrastive_loss(zs, zt, labels, negatives="max")


def test_mean_pooled_features_ignore_padding():
    g = torch.Generator().manual_seed(0)
    hidden = [torch.randn(2, 4, 3, generator=g) for _ in range(3)]
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    cls = layer_features(hidden, [0, 2])
    assert torch.equal(cls[1], hidden[2][:, 0])
    mean = layer_features(hidden, [0, 2], "mean", mask)
    assert torch.allclose(mean[1][0], hidden[2][0].mean(0)) and torch.allclose(mean[1][1], hidden[2][1, :2].mean(0))
    padded = [h.clone() for h in hidden]
    padded[2][1, 2:] = 100.0  # what sits under the padding changes nothing
    assert torch.allclose(layer_features(padded, [2], "mean", mask)[0], mean[1])
    with pytest.raises(UserError, match="--feature-pooling must be one of cls, mean"):
        layer_features(hidden, [0], "max")


def test_acdl_with_unit_weights_is_cdl(tensors):
    zs, zt, labels, bank, bank_labels, _ = tensors
    cdl = contrastive_loss(zs, zt, labels, bank, bank_labels)
    assert torch.allclose(contrastive_loss(zs, zt, labels, bank, bank_labels, torch.ones(5)), cdl)
    # 1/w > 1 makes every negative count more
    assert contrastive_loss(zs, zt, labels, bank, bank_labels, torch.full((5,), 0.5)) > cdl


def test_only_other_class_samples_are_negatives(tensors):
    zs, zt, labels, bank, bank_labels, _ = tensors
    base = contrastive_loss(zs, zt, labels, bank, bank_labels)
    # Moving a stored feature whose label is 0 changes only class-1/2 samples' losses, and moving
    # the bank entry of a label no sample has changes nothing.
    same = bank.clone()
    same[0] = torch.randn(4)
    per_sample = lambda b: torch.stack([contrastive_loss(zs[i:i + 1], zt[i:i + 1], labels[i:i + 1], b,  # noqa: E731
                                                         bank_labels) for i in range(5)])
    changed = per_sample(same) != per_sample(bank)
    assert changed.tolist() == [y != 0 for y in labels.tolist()]
    ghost = contrastive_loss(zs, zt, labels, torch.cat([bank, torch.randn(1, 4)]), torch.cat([bank_labels,
                                                                                          torch.tensor([0])]))
    assert not torch.allclose(ghost, base)
    # One class everywhere: no negatives, no loss.
    assert float(contrastive_loss(zs, zt, torch.zeros(5, dtype=torch.long))) == 0.0


def test_storage_keeps_the_newest_in_order_with_labels():
    storage = FeatureStorage(layers=2, hidden_size=3, size=7)
    pushed_features, pushed_labels = [], []
    for step, n in enumerate([3, 4, 5, 9]):
        f = [torch.full((n, 3), float(100 * step + i)) + torch.arange(n)[:, None] for i in range(2)]
        labels = torch.arange(n) + 10 * step
        storage.push(f, labels)
        pushed_features.append(torch.stack(f))
        pushed_labels.append(labels)
        everything = torch.cat(pushed_features, dim=1)
        expected = everything[:, -7:]
        got, got_labels = storage.contents()
        assert len(storage) == min(7, everything.shape[1])
        assert torch.equal(got, expected) and torch.equal(got_labels, torch.cat(pushed_labels)[-7:])
    assert not storage.features.requires_grad
    # Buffers: in the state dict (checkpoints and exact resume), and they follow .to().
    assert {"features", "labels", "count"} <= set(storage.state_dict())


def test_layer_pairs_follow_pkd():
    assert [t for _, t in feature_layer_pairs(12, 6, "skip")] == [2, 4, 6, 8, 10]
    assert feature_layer_pairs(6, 3, "skip") == [(1, 2), (2, 4)]
    assert feature_layer_pairs(12, 6, "last") == [(1, 7), (2, 8), (3, 9), (4, 10), (5, 11)]
    assert feature_layer_pairs(6, 3, "copied", [0, 3, 5]) == [(1, 1), (2, 4), (3, 6)]
    assert feature_layer_pairs(6, 1, "skip") == []
    with pytest.raises(UserError, match="copied"):
        feature_layer_pairs(6, 3, "copied")
    with pytest.raises(UserError, match="--feature-map"):
        feature_layer_pairs(6, 3, "middle")


def test_kd_and_patient_loss_by_hand():
    s, t = torch.tensor([[1.0, 2.0, 0.5]]), torch.tensor([[0.2, 1.0, 3.0]])
    p, q = F.softmax(t / 4, -1), F.softmax(s / 4, -1)
    assert float(kd_loss(s, t, 4.0)) == pytest.approx(float((p * (p / q).log()).sum()) * 16, rel=1e-5)
    a, b = [torch.tensor([[3.0, 4.0]])], [torch.tensor([[1.0, 0.0]])]
    assert float(patient_loss(a, b)) == pytest.approx(((0.6 - 1) ** 2 + 0.8 ** 2) / 2, rel=1e-6)


def _tiny(layers=3, seed=0):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config).eval()


def _batch():
    g = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(5, 30, (6, 7), generator=g), "attention_mask": torch.ones(6, 7, dtype=torch.long),
            "labels": torch.tensor([0, 1, 0, 1, 1, 0]), "contrast_labels": torch.tensor([0, 1, 0, 1, 1, 0])}


def _objective(student, **kw):
    torch.manual_seed(3)
    return ACKDObjective(student, [(1, 2), (2, 4)], alpha=0.3, beta=20.0, gamma=0.5, temperature=2.0, **kw)


def test_gradients_reach_student_and_predictor_not_teacher_or_storage():
    from modelshrink.steps.contrastive import make_loss

    teacher, student = _tiny(5, seed=0), _tiny(3, seed=1)
    objective = _objective(student).train()
    loss_fn = make_loss(teacher, objective.pairs)
    loss_fn(objective, _batch())  # fills the storage
    loss, parts = loss_fn(objective, _batch())
    loss.backward()
    assert len(objective.storage) == 12
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in objective.predictors.parameters())
    assert student.bert.encoder.layer[0].attention.self.query.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in teacher.parameters())
    assert objective.storage.features.grad is None and not objective.storage.features.requires_grad
    assert set(parts) == {"ce", "kd", "pt", "acdl", "sar_w", "loss"}


def test_each_switch_removes_exactly_its_term():
    from modelshrink.steps.contrastive import make_loss

    teacher = _tiny(5, seed=0)
    batch = _batch()

    def run(**switches):
        objective = _objective(_tiny(3, seed=1), **switches).eval()  # eval: the storage stays empty
        return make_loss(teacher, objective.pairs)(objective, batch)

    full, parts = run()
    alpha, beta, gamma = 0.3, 20.0, 0.5
    full = full.detach()
    assert float(full) == pytest.approx(float(alpha * parts["ce"] + (1 - alpha) * parts["kd"] + beta * parts["pt"]
                                              + gamma * parts["acdl"]), rel=1e-5)
    for switch, term in (("kd", (1 - alpha) * parts["kd"]), ("pt", beta * parts["pt"]),
                         ("acdl", gamma * parts["acdl"])):
        without, without_parts = run(**{switch: False})
        assert switch not in without_parts
        assert float(without.detach()) == pytest.approx(float(full - term), rel=1e-5)
    # Without SAR the term is CDL (w = 1): the same features, no predictor.
    no_sar, no_sar_parts = run(sar=False)
    assert no_sar_parts["acdl"] < parts["acdl"]  # 1/w > 1 weighs negatives up
    expected = full - gamma * parts["acdl"] + gamma * no_sar_parts["acdl"]
    assert float(no_sar.detach()) == pytest.approx(float(expected), rel=1e-5)


def test_without_storage_negatives_come_from_the_batch_only():
    from modelshrink.steps.contrastive import make_loss

    teacher = _tiny(5, seed=0)
    batch = _batch()
    with_storage = _objective(_tiny(3, seed=1), sar=False).train()
    without = _objective(_tiny(3, seed=1), sar=False, storage_size=None).train()
    assert without.storage is None
    loss_fn = make_loss(teacher, with_storage.pairs)
    first = [loss_fn(m, batch)[1]["acdl"] for m in (with_storage, without)]
    assert torch.allclose(first[0], first[1])  # the storage starts empty
    second = [loss_fn(m, batch)[1]["acdl"] for m in (with_storage, without)]
    assert not torch.allclose(second[0], second[1])  # now it holds the first batch's negatives


def test_predictor_depth():
    p = DiscriminationPredictor(8, depth=3, width=5)
    assert sum(isinstance(m, torch.nn.Linear) for m in p.modules()) == 3
    w = p(torch.randn(4, 8))
    assert w.shape == (4,) and bool(((w > 0) & (w < 1)).all())
    with pytest.raises(UserError):
        DiscriminationPredictor(8, depth=0)


def test_the_readings_reach_the_loss_the_objective_trains_on():
    from modelshrink.steps.contrastive import make_loss

    teacher, batch = _tiny(5, seed=0), _batch()
    batch["attention_mask"][1, 4:] = 0  # a padded sentence: the mean must skip its padding

    def parts(pooling="cls", **kw):
        objective = _objective(_tiny(3, seed=1), sar=False, storage_size=None, pooling=pooling, **kw).eval()
        return make_loss(teacher, objective.pairs, pooling)(objective, batch)[1], objective

    cls, _ = parts()
    mean, objective = parts("mean")
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        s = objective.student(**inputs, output_hidden_states=True).hidden_states
        t = teacher(**inputs, output_hidden_states=True).hidden_states
    zs = layer_features(s, [1, 2], "mean", batch["attention_mask"])
    zt = layer_features(t, [2, 4], "mean", batch["attention_mask"])
    assert float(mean["pt"]) == pytest.approx(float(patient_loss(zs, zt)), rel=1e-5)
    acdl = sum(contrastive_loss(a, b, batch["labels"]) for a, b in zip(zs, zt))
    assert float(mean["acdl"]) == pytest.approx(float(acdl), rel=1e-5)
    assert float(mean["pt"]) != pytest.approx(float(cls["pt"]), rel=1e-3)
    hot, _ = parts(negatives="mean", contrast_temperature=0.1)
    assert float(hot["acdl"]) != pytest.approx(float(cls["acdl"]), rel=1e-3)
    assert float(hot["pt"]) == pytest.approx(float(cls["pt"]), rel=1e-6)  # PT does not see τ or NEG's reduction
