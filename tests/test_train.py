"""The shared training loop on a toy model: schedule, accumulation, clipping, the NaN stop, exact resume."""

from __future__ import annotations

import json

import pytest
import torch
from accelerate import Accelerator
from torch import nn

from modelshrink.options.train import TrainOptions
from modelshrink.training.loop import TrainingDiverged, TrainState, latest_checkpoint, train
from toy_task import EXAMPLES
from toy_task import collate as _collate
from toy_task import loss as _loss
from toy_task import toy_model as _toy


class Recording(Accelerator):
    """An accelerator that keeps each step's gradients, before and after clipping."""

    def __init__(self):
        super().__init__(cpu=True)
        self.before: list[torch.Tensor] = []
        self.after: list[torch.Tensor] = []

    def clip_grad_norm_(self, parameters, max_norm, norm_type=2):
        parameters = list(parameters)
        self.before.append(torch.cat([p.grad.flatten().clone() for p in parameters]))
        norm = super().clip_grad_norm_(parameters, max_norm, norm_type)
        self.after.append(torch.cat([p.grad.flatten().clone() for p in parameters]))
        return norm


def _options(**kw) -> TrainOptions:
    return TrainOptions(**{"lr": 0.05, "batch_size": 2, "log_every": 1, "weight_decay": 0.0, **kw})


def _weights(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _dirs(tmp_path, *names):
    for name in names:
        (tmp_path / name).mkdir()


def _log(workdir):
    return [json.loads(line) for line in (workdir / "train_log.jsonl").read_text().splitlines()]


def test_linear_warmup_then_linear_decay(tmp_path):
    result = train(_toy(), EXAMPLES, _collate, _loss, _options(max_steps=6, warmup_steps=2), tmp_path,
                   accelerator=Accelerator(cpu=True))
    lrs = [e["lr"] for e in _log(tmp_path)]
    # after step s: (s + 1) / (warmup + 1) while warming up, then (total - s) / (total - warmup)
    assert lrs == pytest.approx([0.05 * f for f in (2 / 3, 1.0, 0.75, 0.5, 0.25, 0.0)])
    assert result.steps == 6 and result.train_tokens == 12 and result.epochs == 1.5


def test_accumulation_gives_the_gradients_of_one_big_batch(tmp_path):
    small, big = Recording(), Recording()
    _dirs(tmp_path, "a", "b")
    train(_toy(), EXAMPLES, _collate, _loss, _options(max_steps=2, grad_accum=2), tmp_path / "a", accelerator=small)
    train(_toy(), EXAMPLES, _collate, _loss, _options(max_steps=2, batch_size=4), tmp_path / "b", accelerator=big)
    assert len(small.before) == len(big.before) == 2
    for a, b in zip(small.before, big.before):
        assert not torch.equal(a, torch.zeros_like(a)) and torch.allclose(a, b, atol=1e-6)


def test_clipping_bounds_the_gradient_norm(tmp_path):
    accelerator = Recording()
    train(_toy(), EXAMPLES, _collate, _loss, _options(max_steps=3, max_grad_norm=1e-3), tmp_path,
          accelerator=accelerator)
    assert all(g.norm() > 1e-3 for g in accelerator.before)
    assert all(g.norm() <= 1e-3 * (1 + 1e-4) for g in accelerator.after)


def test_a_nan_loss_stops_with_the_last_good_checkpoint(tmp_path):
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        loss, parts = _loss(model, batch)
        return (loss * float("nan") if calls["n"] == 3 else loss), parts

    with pytest.raises(TrainingDiverged, match="NaN or inf at step 3") as raised:
        train(_toy(), EXAMPLES, _collate, loss_fn, _options(max_steps=6, save_every=1), tmp_path,
              accelerator=Accelerator(cpu=True))
    assert "step-2" in str(raised.value) and "--resume" in str(raised.value)
    assert latest_checkpoint(tmp_path).name == "step-2"


class Crash(Exception):
    pass


def test_resume_continues_exactly(tmp_path):
    whole = _toy()
    _dirs(tmp_path, "whole", "split")
    train(whole, EXAMPLES, _collate, _loss, _options(max_steps=6), tmp_path / "whole",
          accelerator=Accelerator(cpu=True))

    calls = {"n": 0}

    def crashing(model, batch):
        calls["n"] += 1
        if calls["n"] == 4:  # the machine goes away during step 4, after the checkpoint of step 3
            raise Crash()
        return _loss(model, batch)

    with pytest.raises(Crash):
        train(_toy(), EXAMPLES, _collate, crashing, _options(max_steps=6, save_every=3), tmp_path / "split",
              accelerator=Accelerator(cpu=True))
    saved = json.loads((latest_checkpoint(tmp_path / "split") / "state.json").read_text())
    assert TrainState(**{k: v for k, v in saved.items() if k != "scheduler"}).step == 3
    resumed = _toy(seed=1)  # other weights: the checkpoint's must replace them
    result = train(resumed, EXAMPLES, _collate, _loss, _options(max_steps=6, save_every=3), tmp_path / "split",
                   accelerator=Accelerator(cpu=True), resume=True)
    assert result.steps == 6 and result.train_tokens == 12
    assert torch.equal(_weights(resumed), _weights(whole))
    assert [e["step"] for e in _log(tmp_path / "split")] == [1, 2, 3, 4, 5, 6]
