"""`--report-to`: the training log reaches TensorBoard and MLflow as train_log.jsonl has it, offline, in the
artifact's runs/; what cannot start is one line before any model loads; a tracker failing later never stops
the run."""

from __future__ import annotations


import pytest
from typer.testing import CliRunner

from conftest import (DOCUMENTS, SUMMARIES, assert_same_scalars, tensorboard_scalars, train_log_lines,
                      train_log_scalars, write_jsonl)
from modelshrink.artifacts import read_manifest, verify_files
from modelshrink.cli import app
from modelshrink.errors import UserError
from modelshrink.steps.distill import DistillOptions, distill
from modelshrink.options.train import parse_report_to

runner = CliRunner()


@pytest.fixture
def pairs(tmp_path):
    rows = [{"id": i, "document": d, "summary": s} for i, (d, s) in enumerate(zip(DOCUMENTS, SUMMARIES))]
    return write_jsonl(tmp_path / "pairs.jsonl", rows)


def _options(pairs, teacher, **kw):
    return DistillOptions(data=str(pairs), teacher=str(teacher), **{"decoder_layers": 1, "batch_size": 4,
                                                                     "device": "cpu", "log_every": 1, "max_steps": 4,
                                                                     **kw})


def _mlflow_run(folder):
    from mlflow.tracking import MlflowClient

    client = MlflowClient((folder / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("modelshrink")
    (run,) = client.search_runs([experiment.experiment_id])
    history = {key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
               for key in run.data.metrics}
    return run, history


@pytest.mark.slow
def test_tensorboard_and_mlflow_get_the_scalars_oftrain_log_lines(saved_models, pairs, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    options = _options(pairs, saved_models["bart"], report_to="tensorboard,mlflow", validation=str(pairs),
                       eval_every=2, eval_limit=2)
    out = distill(options, tmp_path / "student")
    log = train_log_lines(out)
    expected = train_log_scalars(log)
    assert {"train/loss", "train/lr", "train/tokens_per_s", "validation/rouge2", "validation/best_step"} <= set(expected)
    assert len(expected["train/loss"]) == 4 and len(expected["validation/rouge2"]) == 2

    (events,) = [p for p in (out / "runs").iterdir() if p.name == "student"]  # runs/<artifact name>/
    assert_same_scalars(tensorboard_scalars(events), expected)
    run, history = _mlflow_run(out / "runs")
    assert_same_scalars(history, expected)
    assert run.info.run_name == "student"
    recorded = read_manifest(out)["options"]
    assert run.data.params["lr"] == str(recorded["lr"]) and run.data.params["report_to"] == "tensorboard,mlflow"
    assert run.data.params["validation"] == str(pairs)
    assert verify_files(out) == []  # the tracker files are part of the artifact, hashed like the rest


def test_report_to_none_writes_no_runs_folder(saved_models, pairs, tmp_path):
    out = distill(_options(pairs, saved_models["bart"], max_steps=1), tmp_path / "s")
    assert not (out / "runs").exists()


@pytest.mark.parametrize("value, says", [
    ("tensorbored", "unknown tracker tensorbored; choose from tensorboard, wandb, mlflow"),
    ("none,mlflow", "none cannot go with a tracker"),
])
def test_a_bad_report_to_is_one_line_and_writes_nothing(saved_models, pairs, tmp_path, value, says):
    result = runner.invoke(app, ["distill", str(pairs), "-o", str(tmp_path / "s"), "--teacher",
                                 str(saved_models["bart"]), "--max-steps", "1", "--report-to", value])
    assert result.exit_code == 1 and says in result.output and len(result.output.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == [pairs]


def test_parse_report_to():
    assert parse_report_to("none") == () and parse_report_to("TensorBoard, mlflow,tensorboard") == (
        "tensorboard", "mlflow")


def test_a_tracker_not_installed_names_its_package_before_any_model_loads(pairs, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    # the teacher does not exist: a model load would fail on it first
    with pytest.raises(UserError, match=r"--report-to wandb: wandb is not installed; pip install wandb"):
        distill(_options(pairs, tmp_path / "no-such-teacher", report_to="wandb"), tmp_path / "s")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs.jsonl"]


def test_an_unwritable_tracking_dir_is_one_line_before_any_model_loads(pairs, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = runner.invoke(app, ["distill", str(pairs), "-o", str(tmp_path / "s"), "--teacher",
                                 str(tmp_path / "no-such-teacher"), "--max-steps", "1", "--report-to", "tensorboard",
                                 "--tracking-dir", str(blocker / "runs")])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert "--report-to tensorboard: cannot write to" in result.output and "--tracking-dir" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "pairs.jsonl"]


def test_wandb_online_without_its_server_is_one_line(pairs, tmp_path, monkeypatch):
    import modelshrink.options.train as train_options
    import modelshrink.training.tracking as tracking

    for module in (train_options, tracking):  # wandb need not be installed here
        monkeypatch.setattr(module, "check_installed", lambda names: None)
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # the discard port: nothing listens
    with pytest.raises(UserError, match="WANDB_MODE=online but http://127.0.0.1:9 cannot be reached; unset WANDB_MODE"):
        distill(_options(pairs, tmp_path / "no-such-teacher", report_to="wandb"), tmp_path / "s")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs.jsonl"]


def test_tracking_dir_without_a_tracker_is_refused(pairs, tmp_path):
    with pytest.raises(UserError, match="--tracking-dir goes with --report-to"):
        _options(pairs, tmp_path, tracking_dir=str(tmp_path / "tb"))


@pytest.mark.slow
def test_a_tracker_that_fails_mid_run_warns_once_and_the_run_finishes(saved_models, pairs, tmp_path, monkeypatch):
    from accelerate.tracking import TensorBoardTracker

    calls = []

    def broken(self, values, step=None, **kwargs):
        calls.append(step)
        raise OSError("disk full")

    monkeypatch.setattr(TensorBoardTracker, "log", broken)
    lines = []
    out = distill(_options(pairs, saved_models["bart"], report_to="tensorboard"), tmp_path / "s", log=lines.append)
    assert calls == [1]  # dropped after its first failure
    warnings = [line for line in lines if "--report-to tensorboard" in line]
    assert warnings == ["warning: --report-to tensorboard failed at step 1 (OSError: disk full); training goes on "
                        "without it"]
    assert read_manifest(out)["metrics"]["steps"] == 4


@pytest.mark.slow
@pytest.mark.parametrize("step", ["quantize", "contrastive"])
def test_quantize_and_contrastive_report_their_own_options_and_log(step, saved_models, classifier_path, pairs, tmp_path,
                                                                   monkeypatch):
    """The other two training steps through the same loop: TensorBoard's scalars are their train_log.jsonl, and
    MLflow's parameters are the step's own options (quantize's --bits, contrastive's --beta)."""
    from modelshrink import ContrastiveOptions, QuantizeOptions, contrastive, quantize

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    common = dict(max_steps=3, log_every=1, device="cpu", report_to="tensorboard,mlflow")
    if step == "quantize":
        out = quantize(QuantizeOptions(model=str(saved_models["bart"]), data=str(pairs), bits="4-4-8", batch_size=4,
                                       **common), tmp_path / "q")
        own = ("bits", "4-4-8")
    else:
        sentences = write_jsonl(tmp_path / "s.jsonl", [{"id": i, "sentence": d, "label": i % 2}
                                                       for i, d in enumerate(DOCUMENTS)])
        out = contrastive(ContrastiveOptions(data=str(sentences), teacher=str(classifier_path), layers=1, batch_size=4,
                                             feature_map="copied", beta=40.0, **common), tmp_path / "c")
        own = ("beta", "40.0")
    expected = train_log_scalars(train_log_lines(out))
    assert len(expected["train/loss"]) == 3
    assert_same_scalars(tensorboard_scalars(out / "runs" / out.name), expected)
    run, history = _mlflow_run(out / "runs")
    assert_same_scalars(history, expected)
    assert run.data.params[own[0]] == own[1]
