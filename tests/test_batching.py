"""--batch-size left out: batches of a count on a CPU, a padded-token budget on a GPU (issue 54), resolved once per
run and recorded, so that the artifact replays with the same batches anywhere. A GPU is stood in for by resolving
the options as for a CUDA device (the batching is all that changes; the run itself stays on the CPU)."""

from __future__ import annotations

import pytest

from conftest import DOCUMENTS, SUMMARIES, write_jsonl
from modelshrink.artifacts import read_manifest
from modelshrink.options.batching import resolve_batching
from modelshrink.options.contrastive import ContrastiveOptions
from modelshrink.options.distill import DistillOptions
from modelshrink.options.eval import EvalOptions
from modelshrink.options.pseudolabel import PseudolabelOptions
from modelshrink.options.quantize import QuantizeOptions

TRAINING = [lambda **kw: DistillOptions(data="pairs", student="s", max_steps=1, **kw),
            lambda **kw: QuantizeOptions(model="m", data="pairs", max_steps=1, **kw)]
GENERATION = [lambda **kw: PseudolabelOptions(teacher="t", data="docs", **kw),
              lambda **kw: EvalOptions(model="m", data="docs", **kw)]


@pytest.mark.parametrize("make, budget", [(m, 4096) for m in TRAINING] + [(m, 16_384) for m in GENERATION],
                         ids=["distill", "quantize", "pseudolabel", "eval"])
def test_left_out_a_cpu_batches_by_count_and_a_gpu_by_tokens(make, budget):
    options = make()
    assert options.batch_size is None and options.max_tokens is None  # nothing decided before the device is known
    cpu = resolve_batching(options, "cpu")
    assert (cpu.batch_size, cpu.max_tokens) == (16, None)
    for device in ("cuda", "cuda:1"):
        gpu = resolve_batching(options, device)
        assert (gpu.batch_size, gpu.max_tokens) == (16, budget)  # the count still sizes the sorting windows
        assert resolve_batching(gpu, "cpu") == gpu  # resolved once: a resolved run is not resolved again
    # what the user gave is kept on any device
    assert (resolve_batching(make(batch_size=8), "cuda").batch_size, resolve_batching(make(batch_size=8), "cuda")
            .max_tokens) == (8, None)
    given = resolve_batching(make(max_tokens=1000), "cuda")
    assert (given.batch_size, given.max_tokens) == (16, 1000)
    both = resolve_batching(make(batch_size=4, max_tokens=1000), "cpu")
    assert (both.batch_size, both.max_tokens) == (4, 1000)


def test_contrastive_keeps_a_count_on_a_gpu():
    # ACKD's negatives are the batch's other sentences, and the paper tunes the batch size (8, 16, 32)
    options = ContrastiveOptions(data="sentences", student="s", max_steps=1)
    for device in ("cpu", "cuda"):
        resolved = resolve_batching(options, device)
        assert (resolved.batch_size, resolved.max_tokens) == (32, None)


def test_the_help_says_both_defaults():
    from typer.testing import CliRunner

    from modelshrink.cli import app

    text = " ".join(CliRunner().invoke(app, ["distill", "--help"], terminal_width=200).output.split())
    assert "[default: 16; on a GPU, --max-tokens 4096 instead]" in text.replace("│ ", "").replace(" │", "")


@pytest.fixture
def pairs(tmp_path):
    rows = [{"id": i, "document": d, "summary": s} for i, (d, s) in enumerate(zip(DOCUMENTS, SUMMARIES))]
    return write_jsonl(tmp_path / "pairs.jsonl", rows)


def as_on_a_gpu(monkeypatch, module):
    """The step's options resolved as for a CUDA device, the run itself on the CPU."""
    monkeypatch.setattr(module, "resolve_batching", lambda options, device: resolve_batching(options, "cuda"))


@pytest.mark.slow
def test_a_training_run_records_the_batches_it_resolved_and_replays_them(saved_models, pairs, tmp_path, monkeypatch):
    import modelshrink.steps.distill as step
    from modelshrink.options.distill import DistillOptions as Options

    options = Options(data=str(pairs), student=str(saved_models["bart"]), max_steps=2, log_every=1, device="cpu",
                      label_smoothing=0.0)
    on_cpu = step.distill(options, tmp_path / "cpu")
    assert {k: read_manifest(on_cpu)["options"][k] for k in ("batch_size", "max_tokens")} == {
        "batch_size": 16, "max_tokens": None}
    as_on_a_gpu(monkeypatch, step)
    on_gpu = step.distill(options, tmp_path / "gpu")
    recorded = read_manifest(on_gpu)["options"]
    assert (recorded["batch_size"], recorded["max_tokens"]) == (16, 4096)
    # the replay line names both, so the same batches come back on a CPU
    replay = Options.from_recorded(recorded).replay(tmp_path / "again")
    assert "--batch-size 16" in replay and "--max-tokens 4096" in replay
    assert "--max-tokens 4096" in (on_gpu / "README.md").read_text()
    # a resumed run resolves the same way and finds its own options (nothing to do: it is complete)
    assert step.distill(options, on_gpu, resume=True) == on_gpu


@pytest.mark.slow
def test_a_labelling_run_records_its_token_budget(saved_models, docs_jsonl, tmp_path, monkeypatch):
    import modelshrink.steps.pseudolabel as step

    options = PseudolabelOptions(teacher=str(saved_models["bart"]), data=str(docs_jsonl), limit=4, num_beams=2,
                                 max_length=8, device="cpu")
    as_on_a_gpu(monkeypatch, step)
    labels = step.pseudolabel(options, tmp_path / "labels")
    recorded = read_manifest(labels)["options"]
    assert (recorded["batch_size"], recorded["max_tokens"]) == (16, 16_384)
    assert len((labels / "data.jsonl").read_text().splitlines()) == 4


@pytest.mark.parametrize("flag, expected", [(None, "cuda"), ("False", "cuda"), ("True", "cpu"), ("1", "cpu")])
def test_auto_is_the_cpu_under_accelerate_launch_cpu_on_a_gpu_machine(monkeypatch, flag, expected):
    # `accelerate launch --cpu` sets ACCELERATE_USE_CPU; accelerate then runs on the CPU, and so must the batching
    import torch

    from modelshrink.models.loading import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    if flag is None:
        monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_USE_CPU", flag)
    assert resolve_device("auto") == expected
    assert resolve_device("cpu") == "cpu"
