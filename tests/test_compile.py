"""--compile: the training step's forward pass and loss under torch.compile train as the eager ones do (distill,
distillation-aware quantize, contrastive), and a run records that it compiled. The graph plumbing is checked with
torch's aot_eager backend (the same capture and autograd split as inductor, without generating code, so that the
comparison is exact and the test fast)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from torch._dynamo.utils import counters

from conftest import DOCUMENTS, SUMMARIES, train_log_lines, write_jsonl
from modelshrink.artifacts import read_manifest
from modelshrink.options.distill import DistillOptions
from modelshrink.options.quantize import QuantizeOptions
from modelshrink.quant.model import WEIGHTS_NAME
from modelshrink.steps.distill import distill


@pytest.fixture
def pairs(tmp_path):
    rows = [{"id": i, "document": d, "summary": s} for i, (d, s) in enumerate(zip(DOCUMENTS, SUMMARIES))]
    return write_jsonl(tmp_path / "pairs.jsonl", rows)


@pytest.fixture
def aot_eager(monkeypatch):
    import torch._dynamo

    import modelshrink.training.loop as loop

    monkeypatch.setattr(loop, "COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _losses(folder):
    return [(e["step"], e["loss"]) for e in train_log_lines(folder) if "loss" in e]


def _same_run(eager, compiled, rel=1e-5, atol=1e-5, weights="model.safetensors"):
    want_log, got_log = _losses(eager), _losses(compiled)
    assert len(want_log) == 4 and [step for step, _ in got_log] == [step for step, _ in want_log]
    assert [loss for _, loss in got_log] == pytest.approx([loss for _, loss in want_log], rel=rel)
    want, got = load_file(eager / weights), load_file(compiled / weights)
    assert sorted(got) == sorted(want)
    for name, value in got.items():
        if name.endswith("k_proj.bias"):  # no gradient (softmax ignores it): float noise, which AdamW scales up
            continue
        if value.is_floating_point():
            torch.testing.assert_close(value, want[name], rtol=0, atol=atol, msg=name)
        else:  # a quantize artifact's integer codes
            assert torch.equal(value, want[name]), name
    assert read_manifest(compiled)["resolved"]["compile"] is True
    # one graph a step: nothing splits it (a shape read from a mask, transformers' first-call hook installation)
    assert not counters["graph_break"], list(counters["graph_break"])
    assert read_manifest(eager)["resolved"]["compile"] is False


def _distill(pairs, out, **kw):
    options = DistillOptions(data=str(pairs), batch_size=4, device="cpu", log_every=1, max_steps=4, lr=1e-3, **kw)
    return distill(options, out)


@pytest.mark.slow
def test_distill_compiled_trains_as_eager_with_the_plain_cross_entropy(saved_models, pairs, tmp_path, aot_eager):
    """Distillation with every word-level term (KL on the logits, hidden states, attention) from a teacher with
    one decoder layer copied. The fused LM-head loss is a chunked custom-autograd path not checked under
    torch.compile: a compiled run takes the plain cross-entropy, so it trains as the eager run with
    --no-fused-cross-entropy."""
    args = dict(teacher=str(saved_models["bart"]), decoder_layers=1, kd_logits="kl", kd_hidden=1.0, kd_attention=1.0)
    _same_run(_distill(pairs, tmp_path / "eager", fused_cross_entropy=False, **args),
              _distill(pairs, tmp_path / "compiled", compile=True, **args))


def test_the_fused_loss_asked_for_beside_compile_is_one_line():
    from modelshrink.errors import UserError

    with pytest.raises(UserError, match="--fused-cross-entropy is not compiled"):
        DistillOptions(data="pairs", student="s", max_steps=1, compile=True, fused_cross_entropy=True)
    DistillOptions(data="pairs", student="s", max_steps=1, compile=True, fused_cross_entropy=False)


@pytest.mark.slow
def test_contrastive_fine_tuning_compiled_trains_as_eager(classifier_path, tmp_path, aot_eager):
    from modelshrink.steps.contrastive import ContrastiveOptions, contrastive

    words = ("good fine great nice", "bad poor awful dull")
    rows = [{"id": i, "sentence": f"{words[i % 2]} {i}", "label": i % 2} for i in range(32)]
    data = write_jsonl(tmp_path / "sentiment.jsonl", rows)
    kw = dict(data=str(data), student=str(classifier_path), max_steps=4, log_every=1, lr=1e-3, batch_size=8,
              device="cpu")
    _same_run(contrastive(ContrastiveOptions(**kw), tmp_path / "eager"),
              contrastive(ContrastiveOptions(**kw, compile=True), tmp_path / "compiled"))


@pytest.mark.slow
def test_ackd_compiled_trains_as_eager(tmp_path, aot_eager):
    """ACKD with every term (KD, PT, A-CDL with SAR) and a storage that fills and wraps around within the run: the
    same losses and weights as eager, in one graph (the storage is read whole under compile, its empty slots
    labelled -1, so its growing size neither splits the graph nor recompiles it)."""
    from conftest import bert_tokenizer, save_classifier
    from modelshrink.steps.contrastive import ContrastiveOptions, contrastive

    torch.manual_seed(0)
    teacher = save_classifier(tmp_path / "teacher", bert_tokenizer(), layers=4)
    words = ("good fine great nice", "bad poor awful dull")
    rows = [{"id": i, "sentence": f"{words[i % 2]} {i}", "label": i % 2} for i in range(32)]
    data = write_jsonl(tmp_path / "sentiment.jsonl", rows)
    kw = dict(data=str(data), teacher=str(teacher), layers=2, storage_size=20, max_steps=4, log_every=1, lr=1e-3,
              batch_size=8, device="cpu")
    _same_run(contrastive(ContrastiveOptions(**kw), tmp_path / "eager"),
              contrastive(ContrastiveOptions(**kw, compile=True), tmp_path / "compiled"))


@pytest.mark.slow
def test_quantize_compiled_trains_as_eager(saved_models, pairs, tmp_path, aot_eager):
    """Distillation-aware quantization, ternary and 8-bit groups, the logits and attention terms, two micro-batches
    a step: the same losses, latent weights and integer codes as eager, in one graph a step (each micro-batch's
    graph makes its own fake-quantized weights: one cached by the first could not be backpropagated through
    again by the second). The hidden-state term is checked in float64 below: in float32 its gradient sums in another
    order compiled, and that rounding, amplified by the fake quantization, moves the losses from the 2nd step."""
    from modelshrink.steps.quantize import quantize

    kw = dict(model=str(saved_models["bart"]), data=str(pairs), bits="2-2-8,cross_attention=8", device="cpu",
              max_steps=4, batch_size=4, grad_accum=2, log_every=1, lr=1e-3, kd_hidden=0.0, encoder_layers=1, decoder_layers=1)
    _same_run(quantize(QuantizeOptions(**kw), tmp_path / "eager"),
              quantize(QuantizeOptions(**kw, compile=True), tmp_path / "compiled"), weights=WEIGHTS_NAME)


@pytest.mark.slow
def test_the_hidden_state_term_compiled_is_the_eager_computation_in_float64(aot_eager):
    """A fake-quantized 2-2-8 BART with the hidden-state MSE, 6 AdamW steps in float64: the compiled losses and
    latent weights equal eager's to 1e-12 (in float32 they part from the 2nd step: the gradient of a hidden state
    that feeds both the next layer and the loss is summed in another order, a 1e-7 difference that AdamW scales
    up where the gradient is near 0, and a weight that crosses a rounding boundary moves a whole step)."""
    from conftest import build
    from modelshrink.quant.modules import quantize_model
    from modelshrink.quant.spec import QuantSpec
    from modelshrink.training.loop import install_output_hooks

    torch.manual_seed(0)
    ids, labels, targets = torch.randint(4, 40, (4, 12)), torch.randint(4, 40, (4, 7)), torch.randn(3, 4, 12, 32)

    def loss_fn(model):
        out = model(input_ids=ids, labels=labels, output_hidden_states=True)
        return out.loss + sum(((h - t) ** 2).mean() for h, t in zip(out.encoder_hidden_states, targets.double()))

    runs = []
    for compile in (False, True):
        model = build("bart", wide=False)[0]
        quantize_model(model, QuantSpec(2, 2, 8))
        model.double().train()
        install_output_hooks(model)  # as the training loop does before it compiles
        step = torch.compile(loss_fn, backend="aot_eager") if compile else loss_fn
        optimizer, losses = torch.optim.AdamW(model.parameters(), lr=1e-3), []
        for _ in range(6):
            loss = step(model)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        runs.append((losses, {n: p.detach().clone() for n, p in model.named_parameters()}))
    (eager, eager_weights), (compiled, compiled_weights) = runs
    assert compiled == pytest.approx(eager, rel=1e-12, abs=0)
    for name, value in eager_weights.items():
        torch.testing.assert_close(compiled_weights[name], value, rtol=0, atol=1e-12, msg=name)
    assert not counters["graph_break"], list(counters["graph_break"])


@pytest.mark.slow
def test_fake_quantization_compiled_by_inductor_is_bit_identical():
    """Inductor's generated code quantizes as the eager functions do, bit for bit: weights at 2 (ternary), 3, 4
    and 8 bits per tensor and per row, activations with and without a clip."""
    import torch._dynamo

    from modelshrink.quant.quantizers import fake_quantize, fake_quantize_activation

    torch._dynamo.reset()
    weights = torch.compile(fake_quantize, backend="inductor", dynamic=False)
    activations = torch.compile(fake_quantize_activation, backend="inductor", dynamic=False)
    generator = torch.Generator().manual_seed(0)
    for bits in (2, 3, 4, 8):
        for per_row in (False, True):
            for scale in (1e-3, 1.0, 30.0):
                w = torch.randn(64, 48, generator=generator) * scale
                assert torch.equal(weights(w, bits, per_row), fake_quantize(w, bits, per_row)), (bits, per_row, scale)
    for clip in (None, 2.5):
        x = torch.randn(4, 16, 32, generator=generator) * 3
        assert torch.equal(activations(x, 8, clip), fake_quantize_activation(x, 8, clip)), clip
    torch._dynamo.reset()


def test_compile_is_an_option_of_every_step_that_trains():
    from modelshrink.options.contrastive import ContrastiveOptions
    from modelshrink.options.train import TrainOptions

    for options in (TrainOptions, DistillOptions, QuantizeOptions, ContrastiveOptions):
        assert options.__dataclass_fields__["compile"].default is False, options


def test_every_loss_compiles_whole_and_gives_the_eager_value_and_gradients(aot_eager):
    """Under torch.compile the losses zero masked positions instead of taking the kept ones out (a shape read from
    a mask splits the graph): one graph each, the eager values and gradients, and inf/nan at masked
    positions still change nothing."""
    from modelshrink.training import losses

    generator = torch.Generator().manual_seed(0)
    mask = torch.ones(3, 5)
    mask[0, 3:], mask[2, 1:] = 0, 0
    key_mask = torch.ones(3, 6)
    key_mask[1, 4:] = 0

    def rand(*shape):
        x = torch.randn(*shape, generator=generator)
        x[0, 4] = float("nan")  # a masked position: query 4 of sequence 0
        return x

    labels = torch.randint(0, 7, (3, 5), generator=generator).masked_fill(mask == 0, -100)
    cases = {
        "cross-entropy": (lambda s, t: losses.label_smoothed_cross_entropy(s, labels, 0.1), (3, 5, 7)),
        "kd_kl": (lambda s, t: losses.kd_kl(s, t, mask, temperature=2.0), (3, 5, 7)),
        "kd_mse": (lambda s, t: losses.kd_mse(s, t, mask), (3, 5, 7)),
        "hidden_mse": (lambda s, t: losses.hidden_mse([s, s * 2], [t, t, t * 3], [1], mask), (3, 5, 4)),
        "attention_mse": (lambda s, t: losses.attention_mse([s], [t, t * 2], [1], mask, key_mask), (3, 2, 5, 6)),
    }
    for name, (loss, shape) in cases.items():
        if len(shape) == 4:  # attention [batch, heads, query, key]: nan at a masked query
            student, teacher = torch.randn(*shape, generator=generator), torch.randn(*shape, generator=generator)
            student[0, :, 4], teacher[0, :, 4] = float("nan"), float("inf")
        else:
            student, teacher = rand(*shape), rand(*shape)
        results = []
        for fn in (loss, torch.compile(loss, backend="aot_eager")):
            s = student.clone().requires_grad_()
            value = fn(s, teacher)
            value.backward()
            results.append((value.detach(), s.grad))
        (want, want_grad), (got, got_grad) = results
        assert torch.isfinite(want) and torch.isfinite(want_grad).all(), name
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7, msg=name)
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-6, atol=1e-7, msg=name)
        assert not counters["graph_break"], (name, list(counters["graph_break"]))
