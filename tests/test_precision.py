"""`--precision` and `--gradient-checkpointing` of the training steps: bf16 on a CPU (a bf16 teacher,
float32 losses and saved weights), fp16's loss scaling in the loop, refusals, and resume."""

from __future__ import annotations

import json

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import AutocastKwargs
from safetensors.torch import load_file
from torch import nn
from typer.testing import CliRunner

from toy_task import EXAMPLES
from toy_task import collate as _collate
from toy_task import loss as _loss
from conftest import DOCUMENTS, SUMMARIES, bart_tokenizer, bert_tokenizer, save_classifier, write_jsonl
from modelshrink.artifacts import read_manifest, staging_path
from modelshrink.cli import app
from modelshrink.steps.contrastive import ContrastiveOptions, contrastive
from modelshrink.steps.distill import DistillOptions, distill
from modelshrink.errors import UserError
from modelshrink.options.train import TrainOptions
from modelshrink.quant.model import WEIGHTS_NAME
from modelshrink.steps.quantize import QuantizeOptions, quantize
from modelshrink.training.loop import latest_checkpoint, train

runner = CliRunner()


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    """A bf16 run leaves accelerate's process-wide state in bf16; a bare `Accelerator()` of a later
    test would inherit it."""
    AcceleratorState._reset_state()
    yield
    AcceleratorState._reset_state()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A dropout-free tiny BART (library initialisation, so it learns in a few dozen steps) and 16 pairs."""
    from transformers import BartConfig, BartForConditionalGeneration

    root = tmp_path_factory.mktemp("precision")
    tok = bart_tokenizer()
    torch.manual_seed(0)
    BartForConditionalGeneration(BartConfig(
        vocab_size=len(tok), d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=80, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, bos_token_id=0, pad_token_id=1, eos_token_id=2,
        decoder_start_token_id=2)).save_pretrained(root / "bart")
    tok.save_pretrained(root / "bart")
    rows = [{"id": i, "document": d, "summary": s} for i, (d, s) in enumerate(zip(DOCUMENTS, SUMMARIES))]
    return root / "bart", write_jsonl(root / "pairs.jsonl", rows + rows[:4])


def _log(out):
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def _distill(tiny, out, **kw):
    bart, pairs = tiny
    options = {"teacher": str(bart), "decoder_layers": 1, "kd_logits": "kl", "max_steps": 20, "lr": 1e-2,
               "label_smoothing": 0.0, "batch_size": 4, "log_every": 1, "device": "cpu", **kw}
    return distill(DistillOptions(data=str(pairs), **options), out)


# ---------------------------------------------------------------- bf16 on a CPU

@pytest.mark.slow
def test_bf16_distillation_with_a_bf16_teacher_learns_and_saves_float32(tiny, tmp_path, monkeypatch):
    from modelshrink.training import losses

    seen = []
    kd_kl = losses.kd_kl

    def spy(student_logits, teacher_logits, *args, **kwargs):
        value = kd_kl(student_logits, teacher_logits, *args, **kwargs)
        seen.append((student_logits.dtype, teacher_logits.dtype, value.dtype))
        return value

    monkeypatch.setattr(losses, "kd_kl", spy)
    out = _distill(tiny, tmp_path / "s", precision="bf16")
    # the student's outputs come back float32 from autocast, the teacher's are bf16, the loss float32
    assert set(seen) == {(torch.float32, torch.bfloat16, torch.float32)}
    log = [e["loss"] for e in _log(out)]
    assert sum(log[-5:]) < 0.75 * sum(log[:5]), log
    # logged losses are float32 values: a bf16 loss would sit on bf16's coarse grid (8 bits of mantissa)
    assert any(abs(v - torch.tensor(v).bfloat16().item()) > 1e-4 for v in log)
    resolved = read_manifest(out)["resolved"]
    assert resolved["precision"] == "bf16" and resolved["gradient_checkpointing"] is False
    assert resolved["processes"] == 1 and resolved["device"] == "cpu"
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.float32}
    assert json.loads((out / "config.json").read_text()).get("dtype", "float32") == "float32"


@pytest.fixture(scope="module")
def classifiers(tmp_path_factory):
    """A 2-layer BERT classifier (the teacher) and labelled sentences."""
    root = tmp_path_factory.mktemp("classifiers")
    teacher = save_classifier(root / "teacher", bert_tokenizer(), hidden=16, layers=2)
    rows = [{"id": f"s{i}", "sentence": d, "label": i % 2} for i, d in enumerate(DOCUMENTS)]
    return teacher, write_jsonl(root / "sentences.jsonl", rows)


def test_bf16_contrastive_with_gradient_checkpointing(classifiers, tmp_path):
    teacher, data = classifiers
    out = contrastive(ContrastiveOptions(data=str(data), teacher=str(teacher), layers=1, feature_map="copied",
                                         max_steps=3, batch_size=4, log_every=1, storage_size=8, device="cpu",
                                         precision="bf16", gradient_checkpointing=True), tmp_path / "c")
    last = _log(out)[-1]
    assert all(torch.isfinite(torch.tensor(last[k])) for k in ("loss", "ce", "kd", "pt", "acdl"))
    # the same first step in float32 without checkpointing: bf16 moves the loss by rounding, not more
    plain = contrastive(ContrastiveOptions(data=str(data), teacher=str(teacher), layers=1, feature_map="copied",
                                           max_steps=1, batch_size=4, log_every=1, storage_size=8, device="cpu"),
                        tmp_path / "plain")
    bf16, fp32 = _log(out)[0]["loss"], _log(plain)[0]["loss"]
    assert bf16 == pytest.approx(fp32, rel=0.05) and bf16 != fp32
    resolved = read_manifest(out)["resolved"]
    assert resolved["precision"] == "bf16" and resolved["gradient_checkpointing"] is True
    assert resolved["processes"] == 1
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.float32}


def test_bf16_quantized_classifier_with_gradient_checkpointing(classifiers, tmp_path):
    teacher, data = classifiers
    out = quantize(QuantizeOptions(model=str(teacher), bits="2-2-8", data=str(data), max_steps=3, batch_size=4,
                                   log_every=1, device="cpu", precision="bf16", gradient_checkpointing=True),
                   tmp_path / "q")
    last = _log(out)[-1]
    assert last["kd_hidden"] > 0 and torch.isfinite(torch.tensor(last["loss"]))
    plain = quantize(QuantizeOptions(model=str(teacher), bits="2-2-8", data=str(data), max_steps=1, batch_size=4,
                                     log_every=1, device="cpu"), tmp_path / "plain")
    bf16, fp32 = _log(out)[0]["loss"], _log(plain)[0]["loss"]
    assert bf16 == pytest.approx(fp32, rel=0.05) and bf16 != fp32
    resolved = read_manifest(out)["resolved"]
    assert resolved["kind"] == "classifier" and resolved["precision"] == "bf16"
    assert resolved["gradient_checkpointing"] is True and resolved["processes"] == 1
    stored = load_file(out / WEIGHTS_NAME)
    assert {t.dtype for k, t in stored.items() if not k.endswith(".qweight")} == {torch.float32}


# ---------------------------------------------------------------- gradient checkpointing

def _checkpoint_calls(monkeypatch) -> list[int]:
    """Counts transformers' calls of torch's checkpoint function (bound when checkpointing is enabled)."""
    import transformers.modeling_utils as modeling_utils

    calls = []
    original = modeling_utils.checkpoint

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(modeling_utils, "checkpoint", counting)
    return calls


@pytest.mark.slow
def test_gradient_checkpointing_keeps_the_loss_trajectory(tiny, tmp_path, monkeypatch):
    calls = _checkpoint_calls(monkeypatch)
    plain = _distill(tiny, tmp_path / "plain", max_steps=8, kd_hidden=1.0)
    assert not calls
    checkpointed = _distill(tiny, tmp_path / "ckpt", max_steps=8, kd_hidden=1.0, gradient_checkpointing=True)
    assert calls  # the layers did go through checkpoint
    assert [e["loss"] for e in _log(checkpointed)] == pytest.approx([e["loss"] for e in _log(plain)], rel=1e-4)
    a, b = load_file(plain / "model.safetensors"), load_file(checkpointed / "model.safetensors")
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    assert read_manifest(checkpointed)["resolved"]["gradient_checkpointing"] is True
    assert "gradient_checkpointing" not in json.loads((checkpointed / "config.json").read_text())


@pytest.mark.slow
def test_gradient_checkpointing_on_a_quantized_student(tiny, tmp_path, monkeypatch):
    bart, pairs = tiny
    calls = _checkpoint_calls(monkeypatch)
    kw = dict(model=str(bart), bits="8-8-8", data=str(pairs), max_steps=4, batch_size=4, log_every=1, lr=1e-3,
              device="cpu")
    plain = quantize(QuantizeOptions(**kw), tmp_path / "plain")
    checkpointed = quantize(QuantizeOptions(**kw, gradient_checkpointing=True), tmp_path / "ckpt")
    assert calls
    assert [e["loss"] for e in _log(checkpointed)] == pytest.approx([e["loss"] for e in _log(plain)], rel=1e-4)


def test_a_model_without_gradient_checkpointing_is_refused(tiny, tmp_path, monkeypatch):
    from transformers import BartForConditionalGeneration

    monkeypatch.setattr(BartForConditionalGeneration, "supports_gradient_checkpointing", False)
    out = tmp_path / "s"
    with pytest.raises(UserError, match="does not support gradient checkpointing"):
        _distill(tiny, out, gradient_checkpointing=True)
    assert not out.exists() and not staging_path(out).exists()


# ---------------------------------------------------------------- refusals and resume

@pytest.mark.parametrize("step", ["distill", "quantize", "contrastive"])
def test_fp16_on_a_cpu_is_one_line_and_writes_nothing(step, tiny, classifiers, tmp_path):
    bart, pairs = tiny
    teacher, sentences = classifiers
    out = tmp_path / "out"
    args = {"distill": ["distill", pairs, "--teacher", bart, "--decoder-layers", 1],
            "quantize": ["quantize", bart, "--data", pairs],
            "contrastive": ["contrastive", sentences, "--teacher", teacher, "--layers", 1]}[step]
    result = runner.invoke(app, [str(a) for a in args] + ["-o", str(out), "--max-steps", "1", "--precision", "fp16"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == ["Error: --precision fp16 needs a CUDA GPU (this run is on cpu); "
                                                  "use bf16 on a CPU"]
    assert not out.exists() and not staging_path(out).exists()


def test_an_unknown_precision_is_one_line(tiny, tmp_path):
    bart, pairs = tiny
    out = tmp_path / "out"
    result = runner.invoke(app, ["distill", str(pairs), "-o", str(out), "--teacher", str(bart), "--max-steps", "1",
                                 "--precision", "fp64"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == ["Error: --precision must be one of fp32, bf16, fp16, got fp64"]
    assert not out.exists() and not staging_path(out).exists()


@pytest.mark.slow
def test_resuming_with_another_precision_is_refused(tiny, tmp_path):
    def stop_at_3(entry):
        if entry["step"] == 3:
            raise KeyboardInterrupt

    out = tmp_path / "s"
    bart, pairs = tiny
    kw = dict(data=str(pairs), teacher=str(bart), decoder_layers=1, max_steps=6, save_every=2, batch_size=4,
              log_every=1, device="cpu")
    with pytest.raises(KeyboardInterrupt):
        distill(DistillOptions(**kw), out, progress=stop_at_3)
    with pytest.raises(UserError, match=r"other options or inputs \(precision\)"):
        distill(DistillOptions(**kw, precision="bf16"), out, resume=True)
    assert distill(DistillOptions(**kw), out, resume=True) == out  # the same precision resumes


def test_the_mixed_precision_can_change_between_runs_of_one_process(tiny, tmp_path):
    from modelshrink.training.runs import start_run

    for i, precision in enumerate(["fp32", "bf16", "fp32"]):
        accelerator, _ = start_run(tmp_path / f"out{i}", "cpu", overwrite=False, resume=False, precision=precision)
        assert accelerator.mixed_precision == {"fp32": "no", "bf16": "bf16"}[precision]


# ---------------------------------------------------------------- fp16's loss scaling, in the loop

class LossScaling(Accelerator):
    """fp16's loss-scaling path on a CPU (fp16 itself needs a GPU): the GradScaler scales the loss,
    the gradients are unscaled before clipping, the optimizer steps through the scaler; the
    arithmetic stays float32, so the result must equal a plain run's."""

    def __init__(self, growth_interval: int = 2000):
        super().__init__(cpu=True, kwargs_handlers=[AutocastKwargs(enabled=False)])
        self.native_amp = True
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12, growth_interval=growth_interval)

    @property
    def mixed_precision(self) -> str:
        return "fp16"


def _toy() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _weights(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("max_grad_norm", [0.0, 0.05])
def test_loss_scaling_unscales_before_clipping_and_steps_through_the_scaler(max_grad_norm, tmp_path):
    # A large AdamW ε makes the update depend on the gradient's scale: a step on scaled gradients,
    # or clipping them while still scaled, would move the weights elsewhere.
    options = TrainOptions(lr=0.05, eps=0.1, batch_size=2, max_steps=4, weight_decay=0.0, max_grad_norm=max_grad_norm)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    reference, scaled = _toy(), _toy()
    train(reference, EXAMPLES, _collate, _loss, options, tmp_path / "a", accelerator=Accelerator(cpu=True))
    accelerator = LossScaling()
    train(scaled, EXAMPLES, _collate, _loss, options, tmp_path / "b", accelerator=accelerator)
    assert torch.allclose(_weights(scaled), _weights(reference), atol=1e-6)
    assert accelerator.scaler._growth_tracker == 4  # update() after every step


def test_the_loss_scale_survives_a_resume(tmp_path):
    class Crash(Exception):
        pass

    options = TrainOptions(lr=0.05, batch_size=2, max_steps=6, save_every=3, weight_decay=0.0)
    (tmp_path / "whole").mkdir()
    (tmp_path / "split").mkdir()
    whole, whole_model = LossScaling(growth_interval=2), _toy()  # the scale doubles every 2 steps
    train(whole_model, EXAMPLES, _collate, _loss, options, tmp_path / "whole", accelerator=whole)
    calls = {"n": 0}

    def crashing(model, batch):
        calls["n"] += 1
        if calls["n"] == 5:
            raise Crash()
        return _loss(model, batch)

    with pytest.raises(Crash):
        train(_toy(), EXAMPLES, _collate, crashing, options, tmp_path / "split", accelerator=LossScaling(2))
    assert json.loads((latest_checkpoint(tmp_path / "split") / "state.json").read_text())["scaler"]["scale"] == \
        2.0 ** 13
    resumed, resumed_model = LossScaling(growth_interval=2), _toy()
    train(resumed_model, EXAMPLES, _collate, _loss, options, tmp_path / "split", accelerator=resumed, resume=True)
    assert resumed.scaler.get_scale() == whole.scaler.get_scale() == 2.0 ** 15
    assert torch.equal(_weights(resumed_model), _weights(whole_model))
