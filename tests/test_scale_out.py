"""pseudolabel and eval on several processes (2 gloo processes on the CPU), token-budget batches,
half precision, and resuming a launch after one of its processes died."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from conftest import DOCUMENTS, SUMMARIES, free_port, launch_command, one_torch_thread, read_rows, write_jsonl
from modelshrink.artifacts import read_manifest, staging_path
from modelshrink.cli import app
from modelshrink.errors import UserError
from modelshrink.steps.evaluate import evaluate
from modelshrink.generation.settings import plan_batches
from modelshrink.options.eval import EvalOptions
from modelshrink.options.pseudolabel import PseudolabelOptions
from modelshrink.steps.pseudolabel import pseudolabel

runner = CliRunner()
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


accelerate = launch_command


def torchrun(processes: int, *args) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port",
            str(free_port()), "-m", "modelshrink", *map(str, args)]


def run(cmd: list[str], **env) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env={**ENV, **env}, timeout=300)


one_thread = one_torch_thread  # the one-process result is made while the launched workers run
BUDGET = ["--budget-mb", "0.065", "--max-steps", "2", "--batch-size", "4", "--calibration-examples", "8"]


def _many_docs(folder: Path) -> Path:
    """40 documents of different lengths (so that sorting by length reorders them)."""
    rows = [{"id": f"doc-{i}", "document": " ".join(DOCUMENTS[j % 12] for j in range(i, i + 1 + i % 4)),
             "summary": SUMMARIES[i % 12]} for i in range(40)]
    return write_jsonl(folder / "many.jsonl", rows)


@pytest.fixture
def many_docs(tmp_path) -> Path:
    return _many_docs(tmp_path)


@pytest.fixture(scope="module")
def launched(saved_models, tmp_path_factory):
    """The two-process runs of the next two tests, both launched when the first of them asks: a launch is mostly its
    processes importing torch, and the two cores take both launches (and the tests' one-process runs) side by side.
    Returns the documents, and a function of the command's name that waits for its launch: (the finished launch, its
    output folder)."""
    root = tmp_path_factory.mktemp("launched")
    docs = _many_docs(root)
    # no --device on a machine without CUDA: `auto` is the CPU under the launcher too (it once took the other
    # process for a second writer of the same output)
    device = ["--device", "cpu"] if torch.cuda.is_available() else []
    commands = {"pseudolabel": accelerate(2, "pseudolabel", saved_models["bart"], docs, "-o",
                                          root / "pseudolabel" / "two", "--lambda-range", "1", "2", "--seed", "5",
                                          "--num-beams", "3", "--batch-size", "4", *device),
                "eval": torchrun(2, "eval", saved_models["t5"], docs, "-o", root / "eval" / "two", "--device", "cpu",
                                 "--batch-size", "3", "--latency-docs", "2", "--resamples", "200"),
                "quantize": accelerate(2, "quantize", saved_models["bart"], "--data", docs, "-o",
                                       root / "quantize" / "two", *BUDGET, *device)}
    started = {}
    for name, cmd in commands.items():
        (root / name).mkdir()
        started[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    finished = {}

    def result(name: str) -> tuple[subprocess.CompletedProcess, Path]:
        if name not in finished:
            process = started[name]
            stdout, stderr = process.communicate(timeout=300)
            finished[name] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
        return finished[name], root / name / "two"

    yield docs, result
    for process in started.values():  # the launches of tests that were deselected or failed first
        process.kill()
        process.wait()


@pytest.mark.slow
def test_two_processes_train_the_one_plan_of_a_budget(saved_models, launched, tmp_path):
    """`launched` ran `accelerate launch` of quantize --budget-mb: the main process measures and plans, the other
    takes its plan, and the plan is the one a single process makes."""
    from modelshrink.steps.quantize import QuantizeOptions, quantize

    many_docs, launch = launched
    result, two = launch("quantize")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("measuring the sensitivity") == 1  # the main process alone
    args = dict(zip(BUDGET[::2], BUDGET[1::2]))
    with one_thread():
        one = quantize(QuantizeOptions(model=str(saved_models["bart"]), data=str(many_docs), device="cpu",
                                       budget_mb=float(args["--budget-mb"]), max_steps=int(args["--max-steps"]),
                                       batch_size=int(args["--batch-size"]),
                                       calibration_examples=int(args["--calibration-examples"])), tmp_path / "one")
    plan = read_manifest(two)["metrics"]["bit_plan"]
    assert plan["bits"] == read_manifest(one)["metrics"]["bit_plan"]["bits"]
    assert plan["written_bytes"] == plan["predicted_bytes"] <= plan["budget_bytes"]


def _options(teacher, data, **kw) -> PseudolabelOptions:
    return PseudolabelOptions(teacher=str(teacher), data=str(data), **{"batch_size": 4, "device": "cpu", **kw})


@pytest.mark.slow
def test_two_processes_write_the_dataset_one_process_writes(saved_models, launched, tmp_path):
    """`launched` ran `accelerate launch` of pseudolabel --lambda-range 1 2 --seed 5 --num-beams 3 --batch-size 4."""
    many_docs, launch = launched
    with one_thread():  # the launches run meanwhile
        one = pseudolabel(_options(saved_models["bart"], many_docs, lambda_range=(1.0, 2.0), seed=5, num_beams=3),
                          tmp_path / "one")
    result, two = launch("pseudolabel")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines() == [str(two)]  # one process prints the path
    assert (two / "data.jsonl").read_bytes() == (one / "data.jsonl").read_bytes()
    manifest = read_manifest(two)
    assert manifest["resolved"]["processes"] == 2 and read_manifest(one)["resolved"]["processes"] == 1
    assert manifest["metrics"]["generated_this_run"] == 40
    assert sorted(p.name for p in two.parent.iterdir()) == ["two"]  # no parts or staging left


@pytest.mark.slow
def test_two_process_eval_gives_the_metrics_of_one(saved_models, launched, tmp_path):
    """`launched` ran `torchrun` of eval --device cpu --batch-size 3 --latency-docs 2 --resamples 200."""
    many_docs, launch = launched
    options = EvalOptions(model=str(saved_models["t5"]), data=str(many_docs), device="cpu", batch_size=3,
                          latency_docs=2, resamples=200)
    with one_thread():  # the launch runs meanwhile
        _, metrics = evaluate(options, tmp_path / "one")
    result, out = launch("eval")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines() == [str(out)]
    two = json.loads((out / "metrics.json").read_text())
    efficiency = two.pop("efficiency")
    assert two == {k: v for k, v in metrics.items() if k != "efficiency"}
    assert efficiency["processes"] == 2 and "main process alone" in efficiency["latency_note"]
    assert (out / "predictions.jsonl").read_text() == (tmp_path / "one" / "predictions.jsonl").read_text()


def _rank_one_pid(tag: str) -> int | None:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"MODELSHRINK_TEST_TAG={tag}".encode() in environ and b"RANK=1" in environ:
            return int(entry.name)
    return None


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the worker through /proc")
def test_a_killed_process_then_resume_gives_the_uninterrupted_result(saved_models, many_docs, tmp_path):
    # all 40 documents, 20 a process: min = max length makes each cost the same 30 decoding steps, so that after
    # its second row the worker has 18 more to go (with 8, a loaded 2-core machine let it finish first, twice)
    total = len(many_docs.read_text().splitlines())
    slow = ["--num-beams", "2", "--min-length", "30", "--max-length", "30", "--batch-size", "1", "--lambda", "1.5"]
    out, tag = tmp_path / "pl", str(tmp_path)
    cmd = accelerate(2, "pseudolabel", saved_models["bart"], many_docs, "-o", out, "--device", "cpu", *slow)
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**ENV, "MODELSHRINK_TEST_TAG": tag}, start_new_session=True)
    part = staging_path(out) / "parts" / "part-00001-of-00002.jsonl"
    deadline, pid = time.time() + 120, None
    while time.time() < deadline and not (pid and part.exists() and len(part.read_bytes().splitlines()) >= 2):
        pid = pid or _rank_one_pid(tag)  # found while it starts, so that the kill follows its second row at once
        time.sleep(0.02)
    assert pid is not None and launcher.poll() is None, "the launch finished before it could be interrupted"
    os.kill(pid, signal.SIGKILL)
    # the uninterrupted result, made in this process while the launcher stops the other worker (seconds)
    with one_thread():
        whole = pseudolabel(_options(saved_models["bart"], many_docs, num_beams=2, min_length=30, max_length=30,
                                     batch_size=1, lam=1.5), tmp_path / "whole")
    launcher.communicate(timeout=120)
    assert launcher.returncode != 0
    assert not out.exists() and staging_path(out).is_dir()
    done = sum(len(p.read_bytes().splitlines()) for p in (staging_path(out) / "parts").iterdir())
    assert 2 <= done < total

    # one process (this one: no launcher) may not continue what two began
    other = runner.invoke(app, ["pseudolabel", str(saved_models["bart"]), str(many_docs), "-o", str(out), "--device",
                                "cpu", "--resume", *slow])
    assert other.exit_code == 1 and other.stderr.strip().splitlines()[-1].startswith("Error: ")
    assert "made by 2 processes, this one has 1" in other.stderr
    resumed = run(accelerate(2, "pseudolabel", saved_models["bart"], many_docs, "-o", out, "--device", "cpu",
                             "--resume", *slow))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (out / "data.jsonl").read_bytes() == (whole / "data.jsonl").read_bytes()
    assert read_manifest(out)["metrics"]["generated_this_run"] == total - done


@pytest.mark.slow
def test_token_budget_batches_respect_the_budget_and_keep_the_output(saved_models, many_docs, tmp_path):
    from modelshrink.data import examples, open_data
    from modelshrink.models.loading import load_tokenizer

    tokenizer = load_tokenizer(str(saved_models["bart"]))
    stream = examples(open_data(str(many_docs)), "document", "summary")
    batches = list(plan_batches(stream, tokenizer, 4, 80, max_tokens=60))
    assert sorted(e.index for b in batches for e in b.rows) == list(range(40))
    assert all(max(map(len, b.token_ids)) * len(b.token_ids) <= 60 for b in batches)
    assert len({len(b.rows) for b in batches}) > 1  # short documents share a batch, long ones do not
    assert not any(b.truncated for b in batches)
    by_count = read_rows(pseudolabel(_options(saved_models["bart"], many_docs, lam=2.0), tmp_path / "count"))
    by_budget = read_rows(pseudolabel(_options(saved_models["bart"], many_docs, lam=2.0, max_tokens=60),
                                      tmp_path / "budget"))
    assert by_budget == by_count


@pytest.mark.slow
def test_a_document_longer_than_the_budget_is_truncated_and_named(saved_models, many_docs, tmp_path):
    result = runner.invoke(app, ["pseudolabel", str(saved_models["bart"]), str(many_docs), "-o", str(tmp_path / "pl"),
                                 "--max-tokens", "30", "--device", "cpu"])
    assert result.exit_code == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: document")]
    assert warnings and "'doc-3'" in " ".join(warnings) and "truncated to 30" in warnings[0]
    manifest = read_manifest(tmp_path / "pl")
    assert manifest["metrics"]["truncated_to_max_tokens"] == len(warnings)
    assert len(read_rows(tmp_path / "pl")) == 40


@pytest.mark.slow
def test_sampling_belongs_to_the_document_not_the_batch(saved_models, many_docs, tmp_path):
    a = read_rows(pseudolabel(_options(saved_models["t5"], many_docs, do_sample=True, seed=4, batch_size=1),
                              tmp_path / "a"))
    b = read_rows(pseudolabel(_options(saved_models["t5"], many_docs, do_sample=True, seed=4, batch_size=7,
                                       top_k=2), tmp_path / "b"))
    c = read_rows(pseudolabel(_options(saved_models["t5"], many_docs, do_sample=True, seed=4, batch_size=7),
                              tmp_path / "c"))
    assert [r["summary"] for r in a] == [r["summary"] for r in c]
    assert [r["summary"] for r in a] != [r["summary"] for r in b]  # top-k 2 changes the distribution
    with pytest.raises(UserError, match="leave --num-beams at 1"):
        _options(saved_models["t5"], many_docs, do_sample=True, num_beams=2)


def test_bf16_on_a_cpu_runs_and_fp16_is_refused(saved_models, docs_jsonl, tmp_path):
    out = pseudolabel(_options(saved_models["bart"], docs_jsonl, lam=2.0, dtype="bf16"), tmp_path / "bf16")
    manifest = read_manifest(out)
    assert manifest["resolved"]["dtype"] == "bf16" and manifest["options"]["dtype"] == "bf16"
    assert all(r["lambda"] == 2.0 and r["summary"] for r in read_rows(out))
    for command in (["pseudolabel", saved_models["bart"], docs_jsonl], ["eval", saved_models["bart"], docs_jsonl]):
        result = runner.invoke(app, [*map(str, command), "-o", str(tmp_path / "fp16"), "--dtype", "fp16",
                                     "--device", "cpu"])
        assert result.exit_code == 1 and result.stderr.strip() == (
            "Error: --dtype fp16 needs a CUDA GPU (this run is on cpu); use bf16 on a CPU")
        assert not (tmp_path / "fp16").exists() and not staging_path(tmp_path / "fp16").exists()
    unknown = runner.invoke(app, ["pseudolabel", str(saved_models["bart"]), str(docs_jsonl), "-o",
                                  str(tmp_path / "x"), "--dtype", "fp8"])
    assert unknown.exit_code != 0 and "fp8" in unknown.stderr


@pytest.mark.slow
def test_eval_resumes_an_interrupted_generation(saved_models, many_docs, tmp_path):
    options = EvalOptions(model=str(saved_models["bart"]), data=str(many_docs), device="cpu", batch_size=4,
                          latency_docs=0, resamples=100)
    _, whole = evaluate(options, tmp_path / "whole")
    calls = {"n": 0}

    def interrupt(done, total):
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyboardInterrupt

    out = tmp_path / "e"
    with pytest.raises(KeyboardInterrupt):
        evaluate(options, out, progress=interrupt)
    assert staging_path(out).is_dir() and not out.exists()
    with pytest.raises(UserError, match="--resume to continue"):
        evaluate(options, out)
    _, resumed = evaluate(options, out, resume=True)
    assert resumed["rouge2"] == whole["rouge2"] and resumed["ci95"] == whole["ci95"]
    assert (out / "predictions.jsonl").read_text() == (tmp_path / "whole" / "predictions.jsonl").read_text()
    assert evaluate(options, out, resume=True)[1] == resumed  # a finished output: nothing to do
