"""--compile: the training step's forward pass and loss under torch.compile train as the eager ones do (distill,
distillation-aware quantize, contrastive), and a run records that it compiled. The graph plumbing is checked with
torch's aot_eager backend (the same capture and autograd split as inductor, without generating code, so that the
comparison is exact and the test fast)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from conftest import DOCUMENTS, SUMMARIES, train_log_lines, write_jsonl
from modelshrink.artifacts import read_manifest
from modelshrink.options.distill import DistillOptions
from modelshrink.options.quantize import QuantizeOptions
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
    yield
    torch._dynamo.reset()


def _losses(folder):
    return [(e["step"], e["loss"]) for e in train_log_lines(folder) if "loss" in e]


def _same_run(eager, compiled, rel=1e-5, atol=1e-5):
    assert _losses(compiled) == pytest.approx(_losses(eager), rel=rel) and len(_losses(eager)) == 4
    want, got = load_file(eager / "model.safetensors"), load_file(compiled / "model.safetensors")
    assert sorted(got) == sorted(want)
    for name, value in got.items():
        if name.endswith("k_proj.bias"):  # no gradient (softmax ignores it): float noise, which AdamW scales up
            continue
        if value.is_floating_point():
            torch.testing.assert_close(value, want[name], rtol=0, atol=atol, msg=name)
        else:  # a quantize artifact's integer codes
            assert torch.equal(value, want[name]), name
    assert read_manifest(compiled)["resolved"]["compile"] is True
    assert read_manifest(eager)["resolved"]["compile"] is False


def _distill(pairs, out, **kw):
    options = DistillOptions(data=str(pairs), batch_size=4, device="cpu", log_every=1, max_steps=4, lr=1e-3, **kw)
    return distill(options, out)


@pytest.mark.slow
def test_distill_compiled_trains_as_eager_with_the_plain_cross_entropy(saved_models, pairs, tmp_path, aot_eager):
    """Hidden-state distillation from a teacher with one decoder layer copied. The fused LM-head loss is a chunked
    custom-autograd path not checked under torch.compile: a compiled run takes the plain cross-entropy, so it
    trains as the eager run with --no-fused-cross-entropy."""
    args = dict(teacher=str(saved_models["bart"]), decoder_layers=1, kd_hidden=1.0)
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


def test_quantize_refuses_compile_in_one_line(saved_models):
    """Not yet offered: with aot_eager a compiled 8-8-8 BART's loss equals the eager one at step 1 and leaves it at
    step 2 (9.66984 against 9.66494), with or without the once-a-step weight cache; quantize keeps today's values."""
    from modelshrink.errors import UserError

    with pytest.raises(UserError, match="--compile is not offered for quantize yet"):
        QuantizeOptions(model=str(saved_models["bart"]), data="pairs", max_steps=1, compile=True)


def test_compile_is_an_option_of_every_step_that_trains():
    from modelshrink.options.contrastive import ContrastiveOptions
    from modelshrink.options.train import TrainOptions

    for options in (TrainOptions, DistillOptions, QuantizeOptions, ContrastiveOptions):
        assert options.__dataclass_fields__["compile"].default is False, options
