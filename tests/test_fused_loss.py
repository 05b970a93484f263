"""The fused linear cross-entropy: the loss and gradients of the unfused head, and distill trains alike with it
on and off, in every family."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from conftest import DOCUMENTS, FAMILIES, SUMMARIES, TRANSLATORS, build, launch_command, train_log_lines, translator, \
    write_jsonl
from modelshrink.models import lm_head
from modelshrink.training.losses import label_smoothed_cross_entropy, linear_cross_entropy
from modelshrink.steps.distill import DistillOptions, distill


def _problem(bias=True):
    """hidden [2, 37, 16], weight [50, 16], bias [50], labels with 9 ignored: 65 counted tokens."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 37, 16, generator=g).requires_grad_()
    weight = torch.randn(50, 16, generator=g).mul_(0.5).requires_grad_()
    bias_t = torch.randn(50, generator=g).requires_grad_() if bias else None
    labels = torch.randint(0, 50, (2, 37), generator=g)
    labels[0, 30:] = -100
    labels[1, :2] = -100
    return hidden, weight, bias_t, labels


def _loss_and_grads(loss_fn, hidden, weight, bias, labels):
    leaves = [t for t in (hidden, weight, bias) if t is not None]
    loss = loss_fn(hidden, weight, bias, labels)
    return loss, torch.autograd.grad(loss, leaves)


def _unfused(smoothing):
    def loss(hidden, weight, bias, labels):  # the definition: F.cross_entropy of the logits
        logits = F.linear(hidden, weight, bias).flatten(0, 1)
        return F.cross_entropy(logits.float(), labels.flatten(), ignore_index=-100, label_smoothing=smoothing)
    return loss


def _fused(smoothing, chunk, drop=None):
    def loss(hidden, weight, bias, labels):
        return linear_cross_entropy(hidden, weight, bias, labels, label_smoothing=smoothing, chunk_tokens=chunk,
                                    drop_ignored=drop)
    return loss


# drop_ignored: True takes the ignored tokens out first (a device read: the CPU's default), False weighs them 0 with
# every token going through (no device read: the GPU's default); both must be the unfused loss
DROP = pytest.mark.parametrize("drop", [True, False], ids=["dropped", "weighed-0"])


@pytest.mark.parametrize("chunk", [5, 7, 64, 4096])  # of 65 counted tokens: 13 × 5; 9 × 7 + 2; 64 + 1; one short chunk
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("bias", [True, False])
@DROP
def test_float32_loss_and_gradients_equal_the_unfused_head(chunk, smoothing, bias, drop):
    problem = _problem(bias=bias)
    loss, grads = _loss_and_grads(_fused(smoothing, chunk, drop), *problem)
    want_loss, want_grads = _loss_and_grads(_unfused(smoothing), *problem)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=1e-6)
    for got, want in zip(grads, want_grads):  # hidden, weight (and bias)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    # distill's own unfused loss reads the same
    hidden, weight, bias_t, labels = problem
    torch.testing.assert_close(loss, label_smoothed_cross_entropy(F.linear(hidden, weight, bias_t), labels, smoothing))


@pytest.mark.parametrize("chunk", [7, 4096])
@DROP
def test_bf16_autocast_loss_and_gradients_are_close_to_the_unfused_head(chunk, drop):
    problem = _problem()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, grads = _loss_and_grads(_fused(0.1, chunk, drop), *problem)
        want_loss, want_grads = _loss_and_grads(_unfused(0.1), *problem)
    assert loss.dtype == torch.float32 and all(g.dtype == torch.float32 for g in grads)  # the leaves' own dtypes
    torch.testing.assert_close(loss, want_loss, rtol=1e-2, atol=1e-2)
    for got, want in zip(grads, want_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=2e-2 * float(want.abs().max()))
    # and the head's matmul really ran in bf16: float32 gives another loss
    fp32_loss, _ = _loss_and_grads(_fused(0.1, chunk), *problem)
    assert loss != fp32_loss


@DROP
def test_ignored_tokens_change_nothing_and_none_gives_zero(drop):
    hidden, weight, bias, labels = _problem()
    loss, grads = _loss_and_grads(_fused(0.1, 7, drop), hidden, weight, bias, labels)
    poisoned = hidden.detach().clone()
    poisoned[labels == -100] = float("nan")  # padding positions: dropped, or weighed 0, before any arithmetic
    poisoned.requires_grad_()
    loss2, grads2 = _loss_and_grads(_fused(0.1, 7, drop), poisoned, weight, bias, labels)
    assert torch.equal(loss, loss2) and torch.equal(grads[1], grads2[1]) and torch.equal(grads[2], grads2[2])
    assert torch.equal(grads2[0][labels == -100], torch.zeros(9, 16))
    empty, empty_grads = _loss_and_grads(_fused(0.1, 7, drop), hidden, weight, bias, torch.full_like(labels, -100))
    assert float(empty.detach()) == 0.0 and all(float(g.abs().sum()) == 0.0 for g in empty_grads)
    with torch.no_grad():
        again = linear_cross_entropy(hidden, weight, bias, labels, label_smoothing=0.1, chunk_tokens=7,
                                     drop_ignored=drop)
    assert torch.equal(again, loss)


def test_off_a_gpu_the_ignored_tokens_are_dropped_and_on_one_weighed_without_a_device_read(monkeypatch):
    """The default follows the device: dropping needs the count of kept tokens on the host (a boolean index), a
    wait for a GPU every micro-batch; there every token goes through. Checked on the CPU: the weighed path traces
    whole under torch.compile (fullgraph fails on any read of a device value), the dropping one cannot."""
    hidden, weight, bias, labels = _problem()
    assert torch.equal(linear_cross_entropy(hidden, weight, bias, labels),
                       linear_cross_entropy(hidden, weight, bias, labels, drop_ignored=True))  # the CPU's default
    torch._dynamo.reset()
    weighed = torch.compile(_fused(0.0, 7, False), backend="eager", fullgraph=True)
    torch.testing.assert_close(weighed(hidden, weight, bias, labels), _fused(0.0, 7, False)(hidden, weight, bias,
                                                                                             labels))
    dropped = torch.compile(_fused(0.0, 7, True), backend="eager", fullgraph=True)
    with pytest.raises(Exception):  # data-dependent shape: a graph break, refused under fullgraph
        dropped(hidden, weight, bias, labels)
    torch._dynamo.reset()


# ---------------------------------------------------------------- the head of each family

def _model(family, tmp_path):
    if family in TRANSLATORS:
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        folder = translator(family, tmp_path / family)
        return AutoModelForSeq2SeqLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    return build(family)


@pytest.mark.parametrize("family", FAMILIES + sorted(TRANSLATORS))
def test_the_bypassed_forward_returns_what_the_head_reads(family, tmp_path):
    model, tok = _model(family, tmp_path)
    if hasattr(model, "final_logits_bias"):  # zeros as initialised: make the constant bias count
        model.final_logits_bias.normal_()
    batch = tok(DOCUMENTS[:3], return_tensors="pt", padding=True)
    inputs = dict(**batch, decoder_input_ids=tok(SUMMARIES[:3], return_tensors="pt", padding=True)["input_ids"])
    head = lm_head.find(model)
    assert head is not None and head.linear is model.get_output_embeddings()
    with torch.no_grad():
        logits = model(**inputs).logits
        with lm_head.bypassed(head):
            hidden = model(**inputs).logits
        assert hidden.shape[-1] == head.weight.shape[1] != logits.shape[-1]
        assert model.get_output_embeddings() is head.linear and model(**inputs).logits.shape == logits.shape  # back
        torch.testing.assert_close(F.linear(hidden, head.weight, head.bias()), logits, rtol=1e-5, atol=1e-5)


def test_a_quantized_head_keeps_the_logits():
    from modelshrink.quant.modules import quantize_model
    from modelshrink.quant.spec import QuantSpec

    model, _ = build("bart")
    quantize_model(model, QuantSpec(weight_bits=8, embedding_bits=8, activation_bits=8))
    assert lm_head.find(model) is None


# ---------------------------------------------------------------- distill, on and off

@pytest.fixture
def pairs(tmp_path):
    rows = [{"id": i, "document": d, "summary": s} for i, (d, s) in enumerate(zip(DOCUMENTS, SUMMARIES))]
    rows += [{"id": 100 + i, "document": d, "summary": s} for i, (d, s) in enumerate(zip(DOCUMENTS[:4], SUMMARIES[:4]))]
    return write_jsonl(tmp_path / "pairs.jsonl", rows)  # 16 pairs


def _has_gradient(name):
    """A key projection's bias has none (softmax ignores a constant per query): its gradient is float noise, which
    differs with the order of the sums, and AdamW scales that noise up to steps of size lr."""
    return not name.endswith(("k_proj.bias", "key.bias"))


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_distill_loss_gives_the_same_gradients_with_and_without_the_fused_loss(family):
    from types import SimpleNamespace

    from modelshrink.training.seq2seq import make_collate, make_loss, tokenize_pairs

    model, tok = build(family)
    rows = [SimpleNamespace(document=d, reference=s) for d, s in zip(DOCUMENTS[:4], SUMMARIES[:4])]
    batch = make_collate(tok.pad_token_id)(tokenize_pairs(rows, tok, 64, 64))
    grads = {}
    for fused in (True, False):
        options = DistillOptions(data="pairs", student="model", max_steps=1, fused_cross_entropy=fused)
        model.zero_grad()
        loss, _ = make_loss(options, None, None)(model, batch)
        loss.backward()
        grads[fused] = (loss, {n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    (loss, fused), (want_loss, plain) = grads[True], grads[False]
    torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=1e-6)
    assert sorted(fused) == sorted(plain) and model.get_output_embeddings().weight.grad is not None
    for name, grad in fused.items():
        if _has_gradient(name):
            torch.testing.assert_close(grad, plain[name], rtol=1e-4, atol=1e-5 * float(plain[name].abs().max()),
                                       msg=name)


def _run(pairs, out, **kw):
    """train_log entries and saved weights of a 4-step run."""
    options = DistillOptions(data=str(pairs), batch_size=4, device="cpu", log_every=1, max_steps=4, lr=1e-3, **kw)
    out = distill(options, out)
    return train_log_lines(out), load_file(out / "model.safetensors")


def _both(pairs, tmp_path, **kw):
    """The same run with the fused loss on and off."""
    return tuple(_run(pairs, tmp_path / f"fused-{fused}", fused_cross_entropy=fused, **kw) for fused in (True, False))


def _assert_same_weights(weights, want, atol):
    assert sorted(weights) == sorted(want)
    for name, value in weights.items():
        if _has_gradient(name):
            torch.testing.assert_close(value, want[name], rtol=0, atol=atol, msg=name)


def _assert_same_losses(log, want_log, rel):
    keys = ("step", "ce", "loss", "kd_hidden")
    losses = [{k: e[k] for k in keys if k in e} for e in log if "ce" in e]
    want = [{k: e[k] for k in keys if k in e} for e in want_log if "ce" in e]
    assert len(losses) == 4 and [sorted(e) for e in losses] == [sorted(e) for e in want]
    for got, expected in zip(losses, want):
        for key in got:
            assert got[key] == pytest.approx(expected[key], rel=rel), (key, got, expected)


def _assert_same_training(fused, plain, rel=1e-5, atol=1e-4):
    _assert_same_losses(fused[0], plain[0], rel)
    _assert_same_weights(fused[1], plain[1], atol)


def _distance(weights, other):
    return max(float((value - other[name]).abs().max()) for name, value in weights.items() if _has_gradient(name))


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_distill_trains_the_same_with_and_without_the_fused_loss(family, plain_models, pairs, tmp_path):
    _assert_same_training(*_both(pairs, tmp_path, student=str(plain_models[family])))


@pytest.mark.slow
def test_hidden_state_distillation_with_the_fused_loss_and_a_headless_teacher(saved_models, pairs, tmp_path):
    _assert_same_training(*_both(pairs, tmp_path, teacher=str(saved_models["t5"]), decoder_layers=1, kd_hidden=1.0))


@pytest.mark.slow
def test_bf16_distill_with_the_fused_loss_is_as_close_to_fp32_as_without(saved_models, pairs, tmp_path):
    """bf16 rounds the gradients (to about 0.5%) in a different order with the fused loss, and AdamW turns that
    into steps of size lr on small gradients: the runs are compared through their distance to float32's."""
    fused, plain = _both(pairs, tmp_path, student=str(saved_models["bart"]), precision="bf16")
    _, fp32 = _run(pairs, tmp_path / "fp32", student=str(saved_models["bart"]), fused_cross_entropy=False)
    _assert_same_losses(fused[0], plain[0], rel=2e-3)
    assert _distance(fused[1], fp32) <= 1.5 * _distance(plain[1], fp32)


@pytest.mark.slow
def test_two_processes_train_the_same_with_and_without_the_fused_loss(saved_models, pairs, tmp_path):
    """Under DDP (find_unused_parameters) the head's parameters must count as used in the forward: BERT's head
    bias is used nowhere else."""
    runs = []
    for flag in ("--fused-cross-entropy", "--no-fused-cross-entropy"):
        out = tmp_path / flag
        cmd = launch_command(2, "distill", pairs, "-o", out, "--student", saved_models["bert2bert"], "--max-steps", 4,
                             "--batch-size", 2, "--lr", "1e-3", "--log-every", 1, "--device", "cpu", flag)
        result = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                                timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        runs.append((train_log_lines(out), load_file(out / "model.safetensors")))
    _assert_same_training(*runs)


def test_the_fused_loss_asked_for_beside_kd_logits_is_one_line():
    """Its default (None) means "wherever exact", so an explicit --fused-cross-entropy can be told from it and
    refused where it cannot hold: --kd-logits compares the logits the fused loss never makes."""
    from modelshrink.errors import UserError

    with pytest.raises(UserError, match="--fused-cross-entropy never holds the logits that --kd-logits kl compares"):
        DistillOptions(data="pairs", teacher="t", max_steps=1, kd_logits="kl", fused_cross_entropy=True)
    assert DistillOptions(data="pairs", teacher="t", max_steps=1, kd_logits="kl").fused_cross_entropy is None
    DistillOptions(data="pairs", teacher="t", max_steps=1, kd_logits="kl", fused_cross_entropy=False)  # off is always exact
