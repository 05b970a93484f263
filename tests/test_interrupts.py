"""kill -9, then `--resume`: every training step and `eval` end where an uninterrupted run ends, and
`--save-total-limit` keeps the checkpoints a resume needs and no more.

The interrupted run is a real process (`python -m modelshrink ...`) killed with SIGKILL once its
staging folder holds a checkpoint (eval: predictions rows); the resumed and the uninterrupted runs
go through the same command line in this process. Weights are compared bit for bit: on a CPU, with
the same number of threads, the resumed run repeats the very same float operations (weights, AdamW
moments and step, schedule, random state, the position in the epoch's batches, validation and
early-stopping state all come back from the checkpoint), so anything short of equality is a bug.
(Another thread count splits reductions differently and the weights differ in the last bits.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest
import torch
from accelerate import Accelerator
from safetensors.torch import load_file
from torch import nn
from typer.testing import CliRunner

from conftest import DOCUMENTS, SUMMARIES, one_torch_thread, write_jsonl
from modelshrink.artifacts import read_manifest, staging_path
from modelshrink.cli import app
from modelshrink.options.train import TrainOptions
from modelshrink.training.loop import train
from toy_task import EXAMPLES
from toy_task import collate as _collate
from toy_task import loss as _loss
from toy_task import toy_model as _toy

runner = CliRunner()
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
TIMING = ("seconds", "tokens_per_s", "train_seconds", "tokens_per_second")  # the clock's, not the run's


_one_thread = one_torch_thread  # the killed processes run with OMP_NUM_THREADS=1: weights compared bit for bit


@pytest.fixture(autouse=True)
def one_thread():
    with _one_thread():
        yield


def _checkpoints(out: Path) -> list[str]:
    folder = staging_path(out) / "checkpoints"
    return sorted((p.name for p in folder.glob("step-*") if not p.name.endswith(".tmp")),
                  key=lambda n: int(n.split("-")[1])) if folder.is_dir() else []


def _eval_part(out: Path) -> Path:
    return staging_path(out) / "parts" / "part-00000-of-00001.jsonl"


def _killed_runs(saved_models, classifier_path, data: Path) -> dict[str, tuple[list, Callable[[Path], bool]]]:
    """Each test's command line (without -o), and when its process is killed, given its output folder."""
    pairs, sentences, docs = data / "pairs.jsonl", data / "sentences.jsonl", data / "docs.jsonl"

    def at(step: int) -> Callable[[Path], bool]:
        return lambda out: f"step-{step}" in _checkpoints(out)

    return {
        "distill": (["distill", pairs, "--teacher", saved_models["bart"], "--decoder-layers", 1, "--kd-logits", "kl",
                     "--max-steps", 16, "--save-every", 1, "--save-total-limit", 2, "--batch-size", 4, "--lr", 1e-3,
                     "--log-every", 3, "--validation", pairs, "--eval-every", 2, "--eval-limit", 4, "--max-length", 8,
                     "--device", "cpu"], at(5)),
        "quantize": (["quantize", saved_models["bart"], "--data", pairs, "--bits", "4-8-8", "--max-steps", 12,
                      "--save-every", 1, "--batch-size", 4, "--lr", 1e-3, "--log-every", 2, "--device", "cpu"], at(3)),
        "contrastive": (["contrastive", sentences, "--teacher", classifier_path, "--layers", 1, "--feature-map",
                         "copied", "--storage-size", 10, "--max-steps", 14, "--save-every", 1, "--batch-size", 4,
                         "--lr", 1e-3, "--log-every", 1, "--validation", sentences, "--eval-every", 3, "--device",
                         "cpu"], at(4)),
        # min = max length: every document costs the same 20 decoding steps, slow enough to be caught mid-run
        "eval": (["eval", saved_models["bart"], docs, "--device", "cpu", "--batch-size", 1, "--num-beams", 2,
                  "--min-length", 20, "--max-length", 20, "--latency-docs", 0, "--resamples", 100],
                 lambda out: _eval_part(out).exists() and _eval_part(out).read_bytes().count(b"\n") >= 2),
    }


def _start_killing(args: list, ready: Callable[[], bool], stderr: Path,
                   timeout: float = 240) -> tuple[subprocess.Popen, Callable[[], str]]:
    """Run `modelshrink ARGS` in a process of its own, and SIGKILL it from a thread of this one as soon as `ready()`.
    Returns the process and a function that waits for the kill and says what went wrong, if anything ("" if not)."""
    cmd = [sys.executable, "-m", "modelshrink", *map(str, args)]
    with open(stderr, "w") as err:  # a file, not a pipe: a full pipe would stall the run
        process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=ENV)
    failure = []

    def watch() -> None:
        deadline = time.time() + timeout
        while not ready():
            finished = process.poll() is not None
            if finished or time.time() > deadline:
                failure.append("it finished before it could be killed" if finished else "it made no progress in time")
                process.kill()
                return
            time.sleep(0.005)
        os.kill(process.pid, signal.SIGKILL)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    def killed() -> str:
        watcher.join()
        if process.wait(timeout=60) != -signal.SIGKILL and not failure:
            failure.append("it finished before it could be killed")
        return failure[0] + f"; stderr:\n{stderr.read_text()[-3000:]}" if failure else ""

    return process, killed


@pytest.fixture(scope="module")
def killed(saved_models, classifier_path, tmp_path_factory) -> dict[str, tuple[list, Path, Path, str]]:
    """Every test's run killed (a process each) and its uninterrupted run (in this process, on one thread), all made
    when the first test asks: a killed run is mostly one core importing torch, and the two cores take those and the
    uninterrupted runs side by side. Returns name -> (command line, uninterrupted output, killed output, what went
    wrong killing it or "")."""
    data = tmp_path_factory.mktemp("killed")
    write_jsonl(data / "pairs.jsonl", [{"id": i, "document": DOCUMENTS[i % 12], "summary": SUMMARIES[i % 12]}
                                       for i in range(16)])
    write_jsonl(data / "sentences.jsonl", [{"id": f"s{i}", "sentence": DOCUMENTS[i % 12], "label": int(i % 12 < 6)}
                                           for i in range(24)])
    write_jsonl(data / "docs.jsonl", [{"id": f"d{i}", "document": DOCUMENTS[i % 12], "summary": SUMMARIES[i % 12]}
                                      for i in range(12)])
    runs = _killed_runs(saved_models, classifier_path, data)
    started = {}
    try:
        for name, (args, ready) in runs.items():
            (data / name).mkdir()
            out = data / name / "out"
            started[name] = _start_killing([*args, "-o", out], lambda out=out, ready=ready: ready(out),
                                           data / name / "killed.log")
        with _one_thread():
            for name, (args, _) in runs.items():
                _invoke([*args, "-o", data / name / "whole"])
    except BaseException:
        for process, _ in started.values():
            process.kill()  # ends its watch too
        raise
    return {name: (args, data / name / "whole", data / name / "out", started[name][1]())
            for name, (args, _) in runs.items()}


def _invoke(args: list) -> str:
    """Run `modelshrink ARGS` in this process; returns its stderr."""
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.stderr


def _log(out: Path) -> list[dict]:
    lines = (out / "train_log.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def _metrics(out: Path) -> dict:
    return {k: v for k, v in read_manifest(out)["metrics"].items() if k not in TIMING}


def _same_weights(a: Path, b: Path) -> None:
    """Bit for bit. Not the files' bytes: safetensors writes metadata of two keys (a quantized
    file's) in a random order, run after run."""
    from safetensors import safe_open

    x, y = load_file(a), load_file(b)
    assert x.keys() == y.keys() and all(x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]) for k in x)
    with safe_open(a, "pt") as f, safe_open(b, "pt") as g:
        assert f.metadata() == g.metadata()


def _same_model(a: Path, b: Path, weights: str) -> None:
    _same_weights(a / weights, b / weights)
    assert _metrics(a) == _metrics(b)
    assert _log(a) == _log(b)
    for name in ("validation.json", "config.json"):
        assert (a / name).exists() == (b / name).exists()
        if (a / name).exists():
            assert (a / name).read_text() == (b / name).read_text()


def _resume_and_compare(args: list, whole: Path, out: Path, failure: str, weights: str = "model.safetensors") -> None:
    """The run killed once it had its checkpoint (see `_killed_runs`): resume it, compare with the uninterrupted one."""
    assert not failure, failure
    assert staging_path(out).is_dir() and not out.exists()
    left = _checkpoints(out)
    first = int(left[0].split("-")[1])
    # --save-total-limit 2: the newest two (three only when the kill fell between a save and its pruning)
    assert 2 <= len(left) <= 3 and left == [f"step-{first + i}" for i in range(len(left))]
    assert f"resuming from {left[-1]}" in _invoke([*args, "-o", out, "--resume"])
    _same_model(out, whole, weights)
    assert not staging_path(out).exists()
    assert not (out / "checkpoints").exists() and not (out / "best").exists()


@pytest.mark.slow
def test_distill_killed_then_resumed(killed):
    _resume_and_compare(*killed["distill"])


@pytest.mark.slow
def test_quantize_killed_then_resumed(killed):
    from modelshrink.quant.model import WEIGHTS_NAME

    _resume_and_compare(*killed["quantize"], weights=WEIGHTS_NAME)


@pytest.mark.slow
def test_contrastive_killed_then_resumed(killed):
    _resume_and_compare(*killed["contrastive"])


@pytest.mark.slow
def test_eval_killed_then_resumed(killed):
    args, whole, out, failure = killed["eval"]
    assert not failure, failure
    assert staging_path(out).is_dir() and not out.exists()
    assert 2 <= _eval_part(out).read_bytes().count(b"\n") < 12
    _invoke([*args, "-o", out, "--resume"])
    assert (out / "predictions.jsonl").read_bytes() == (whole / "predictions.jsonl").read_bytes()
    metrics, expected = (json.loads((p / "metrics.json").read_text()) for p in (out, whole))
    for m in (metrics, expected):  # measurements of the machine, not results
        for key in ("throughput_docs_per_s", "peak_memory_bytes"):
            m["efficiency"].pop(key)
    assert metrics == expected
    assert read_manifest(out)["metrics"] == read_manifest(whole)["metrics"]


# ---------------------------------------------------------------- the loop on a toy model, in process

def _weights(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


class Crash(Exception):
    pass


def _crashing(at_call: int, calls: dict | None = None):
    """The loss, but the machine goes away during its `at_call`-th call (one call per step here)."""
    calls = {"n": 0} if calls is None else calls

    def loss_fn(model, batch):
        calls["n"] += 1
        if calls["n"] == at_call:
            raise Crash()
        return _loss(model, batch)

    return loss_fn


def _train(model, workdir: Path, loss_fn=_loss, resume: bool = False, validate=None, **options):
    workdir.mkdir(exist_ok=True)
    options = TrainOptions(**{"lr": 0.05, "batch_size": 2, "weight_decay": 0.0, **options})
    return train(model, EXAMPLES, _collate, loss_fn, options, workdir, accelerator=Accelerator(cpu=True),
                 validate=validate, resume=resume)


def test_save_total_limit_keeps_the_newest_and_resume_still_works(tmp_path):
    whole = _toy()
    _train(whole, tmp_path / "whole", max_steps=9, save_every=1, save_total_limit=2)
    assert sorted(p.name for p in (tmp_path / "whole" / "checkpoints").iterdir()) == ["step-8", "step-9"]

    run = tmp_path / "run"
    (run / "checkpoints" / "step-3.tmp").mkdir(parents=True)  # a save an earlier kill cut short
    with pytest.raises(Crash):
        _train(_toy(), run, _crashing(6), max_steps=9, save_every=1, save_total_limit=2)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-4", "step-5"]
    resumed = _toy()
    _train(resumed, run, resume=True, max_steps=9, save_every=1, save_total_limit=3)  # may change on resume
    assert torch.equal(_weights(resumed), _weights(whole))
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-7", "step-8", "step-9"]


def test_save_total_limit_is_checked_and_may_change_on_resume():
    from modelshrink.errors import UserError
    from modelshrink.training.runs import MAY_CHANGE_ON_RESUME

    with pytest.raises(UserError, match="--save-total-limit must be >= 1, got 0"):
        TrainOptions(max_steps=1, save_total_limit=0)
    assert TrainOptions(max_steps=1).save_total_limit == 2
    assert "save_total_limit" in MAY_CHANGE_ON_RESUME


def _plain_log(workdir: Path) -> list[dict]:
    lines = (workdir / "train_log.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def test_a_torn_log_line_and_a_log_window_across_the_checkpoint(tmp_path):
    # log every 3 steps, checkpoint every 4: the line of step 6 counts the tokens of steps 5 and 6
    # before the kill and after the resume alike
    _train(_toy(), tmp_path / "whole", max_steps=8, log_every=3)
    run = tmp_path / "run"
    with pytest.raises(Crash):
        _train(_toy(), run, _crashing(8), max_steps=8, log_every=3, save_every=4)
    with open(run / "train_log.jsonl", "a") as f:
        f.write('{"step": 7, "epo')  # killed in the middle of a line
    _train(_toy(), run, resume=True, max_steps=8, log_every=3, save_every=4)
    assert _plain_log(run) == _plain_log(tmp_path / "whole")
    assert [e["tokens"] for e in _plain_log(run)] == [6, 6, 4]


def test_a_resume_publishes_the_best_weights_its_checkpoint_names(tmp_path):
    from safetensors.torch import save_file

    from modelshrink.training.runs import keep_best, save_best_with

    calls = {"n": 0}  # = the step being trained: one loss call per step
    scores = {2: 1.0, 4: 2.0}  # validation improves at steps 2 and 4, never after
    seen = {}

    def validate(model):
        seen[calls["n"]] = _weights(model).clone()
        return {"rouge2": scores.get(calls["n"], 0.0)}

    def save(model, folder):
        folder.mkdir(parents=True)
        save_file({"w": _weights(model)}, folder / "w.safetensors")

    run = tmp_path / "run"
    run.mkdir()
    common = dict(lr=0.05, batch_size=2, max_steps=6, save_every=3)
    with pytest.raises(Crash):  # the best of step 4 is saved after the last checkpoint (step 3), then the kill
        train(_toy(), EXAMPLES, _collate, _crashing(5, calls), TrainOptions(**common, eval_every=2), run,
              accelerator=Accelerator(cpu=True), validate=validate, save_best=save_best_with(save))
    assert (run / "best" / "step-2").is_dir() and (run / "best" / "step-4").is_dir()
    calls["n"] = 3
    # validating at other steps now (allowed on resume), the run never reaches a score of 2.0 again
    result = train(_toy(), EXAMPLES, _collate, _crashing(0, calls), TrainOptions(**common, eval_every=5), run,
                   accelerator=Accelerator(cpu=True), validate=validate, save_best=save_best_with(save), resume=True)
    assert result.best["step"] == 2 and sorted(seen) == [2, 4, 5, 6]
    keep_best(run, result, lambda folder: pytest.fail("the best weights exist"))

    assert torch.equal(load_file(run / "w.safetensors")["w"], seen[2])


@pytest.mark.parametrize("early_stopping", [None, 1])
def test_killed_after_the_last_checkpoint_resumes_to_the_same_result(early_stopping, tmp_path):
    # validation falls from step 1 on: with --early-stopping 1 the run stops at step 2 (checkpointed);
    # a kill before the output is written leaves that checkpoint, and the resume must stop there too
    options = dict(max_steps=6, save_every=1, eval_every=1, early_stopping=early_stopping)

    def run(resume: bool):
        scores = iter([2.0, 1.0, 0.5, 0.4, 0.3, 0.2])
        return _train(_toy(), tmp_path, resume=resume, validate=lambda model: {"rouge2": next(scores)}, **options)

    first = run(resume=False)
    log = _plain_log(tmp_path)
    again = run(resume=True)
    assert first.steps == again.steps == (6 if early_stopping is None else 2)
    assert (again.final_loss, again.best, again.train_tokens) == (first.final_loss, first.best, first.train_tokens)
    assert first.final_loss is not None and _plain_log(tmp_path) == log
