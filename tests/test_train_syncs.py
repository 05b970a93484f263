"""The loop reads the device only where it writes something (a log line, a checkpoint, validation, the end):
the NaN/inf stop, the logged loss parts and the token counts stay what they were when every micro-batch was
read, and a run's host reads grow with its log lines, not with its micro-batches."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator

from conftest import free_port
from modelshrink.options.train import TrainOptions
from modelshrink.training.loop import TrainingDiverged, _to_device, latest_checkpoint, train
from toy_task import EXAMPLES
from toy_task import collate as _collate
from toy_task import loss as _loss
from toy_task import toy_model as _toy


def _options(**kw) -> TrainOptions:
    return TrainOptions(**{"lr": 0.05, "batch_size": 2, "weight_decay": 0.0, **kw})


def _log(workdir: Path) -> list[dict]:
    path = workdir / "train_log.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _steps(folder: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in folder.glob("step-*")) if folder.is_dir() else []


def _nan_from(step: int, grad_accum: int = 1):
    """The toy loss, NaN from optimizer step `step` on (`grad_accum` calls a step)."""
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        loss, parts = _loss(model, batch)
        return (loss * float("nan") if (calls["n"] - 1) // grad_accum + 1 >= step else loss), parts

    return loss_fn


@pytest.mark.parametrize("bad, options, checkpoints, bests", [
    (4, dict(save_every=1), [2, 3], []),  # stopped at the checkpoint of step 4 (the newest 2 kept)
    (5, dict(save_every=3, eval_every=2), [3], [2, 4]),  # stopped at step 6's validation, after one step on NaN
    (3, dict(), [], []),  # no checkpoint, no validation, no log line before the end: stopped at the end
])
def test_a_nan_loss_stops_naming_its_step_and_nothing_after_it_is_written(tmp_path, bad, options, checkpoints, bests):
    from safetensors.torch import save_file

    from modelshrink.training.runs import save_best_with

    validated = []

    def validate(model):
        validated.append(len(validated) + 1)
        return {"rouge2": float(len(validated))}  # better every time: each validation writes its best

    def save(model, folder):
        folder.mkdir(parents=True)
        save_file({"w": torch.zeros(1)}, folder / "w.safetensors")

    with pytest.raises(TrainingDiverged, match=f"NaN or inf at step {bad};") as raised:
        train(_toy(), EXAMPLES, _collate, _nan_from(bad, grad_accum=2),
              _options(max_steps=8, grad_accum=2, log_every=100, **options), tmp_path,
              accelerator=Accelerator(cpu=True), validate=validate, save_best=save_best_with(save))
    assert _steps(tmp_path / "checkpoints") == checkpoints
    assert _steps(tmp_path / "best") == bests
    assert len(validated) == len(bests)
    lines = _log(tmp_path)
    assert all(e["step"] < bad for e in lines)
    assert [e for e in lines if "loss" in e] == []  # log_every 100: the only one would have been the last step's
    last = latest_checkpoint(tmp_path)
    assert (f"checkpoint is {last}" if last else "no checkpoint was saved yet") in str(raised.value)


def test_the_logged_loss_parts_are_the_means_of_the_step_logged(tmp_path):
    read = []  # every micro-batch's parts, in order

    def loss_fn(model, batch):
        loss, _ = _loss(model, batch)
        parts = {"loss": loss.detach(), "scaled": loss.detach() * 3 + 0.1}
        if len(read) % 2:  # a part that only some micro-batches have
            parts["sometimes"] = loss.detach() / 7
        read.append({k: v.item() for k, v in parts.items()})
        return loss, parts

    result = train(_toy(), EXAMPLES, _collate, loss_fn, _options(max_steps=5, grad_accum=3, batch_size=1, log_every=2),
                   tmp_path, accelerator=Accelerator(cpu=True))

    def mean(step: int) -> dict[str, float]:
        means: dict[str, float] = {}
        for parts in read[(step - 1) * 3:step * 3]:
            for name, value in parts.items():
                means[name] = means.get(name, 0.0) + value / 3
        return means

    lines = _log(tmp_path)
    assert [e["step"] for e in lines] == [2, 4, 5] and [e["tokens"] for e in lines] == [6, 6, 3]
    for entry in lines:
        logged = {k: entry[k] for k in ("loss", "scaled", "sometimes") if k in entry}
        assert logged == {k: round(v, 5) for k, v in mean(entry["step"]).items()}
    assert result.final_loss == mean(5)["loss"] and result.train_tokens == 15


def _count_reads(monkeypatch) -> dict[str, int]:
    """Count the calls that read a tensor's value on the host (a wait for the device on a GPU), by whoever makes
    them, except the epoch's shuffle in `make_batches`, drawn on the host by a CPU generator."""
    counts = {"n": 0}
    for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _original=original, **kwargs):
            if sys._getframe(1).f_code.co_name != "make_batches":
                counts["n"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    return counts


def test_host_reads_grow_with_log_lines_not_micro_batches(tmp_path, monkeypatch):
    counts = _count_reads(monkeypatch)
    reads = {}
    for steps, log_every in [(10, 10), (20, 10), (10, 1)]:
        counts["n"] = 0
        workdir = tmp_path / f"{steps}-{log_every}"
        workdir.mkdir()
        train(_toy(), EXAMPLES, _collate, _loss, _options(max_steps=steps, grad_accum=2, log_every=log_every),
              workdir, accelerator=Accelerator(cpu=True))
        reads[steps, log_every] = counts["n"]
    # 20 micro-batches, one log line: a read of the NaN flag and one of the loss parts, not one each a micro-batch
    assert 1 <= reads[10, 10] <= 3
    assert reads[20, 10] == 2 * reads[10, 10]
    assert reads[10, 1] == 10 * reads[10, 10]  # the counter sees the reads: one set a log line


def test_a_batch_goes_to_cuda_pinned_and_without_blocking(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: calls.append("pin") or self)
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **kw: calls.append(("to", *a, kw)) or self)
    batch = {"x": torch.zeros(2), "tokens": 2}
    cuda = torch.device("cuda")
    moved = _to_device(batch, cuda)
    assert moved["x"] is batch["x"] and moved["tokens"] == 2
    assert calls == ["pin", ("to", cuda, {"non_blocking": True})]
    calls.clear()
    _to_device(batch, torch.device("cpu"))
    assert calls == [("to", torch.device("cpu"), {})]  # on the CPU, as before


def _two_process_worker(rank: int, port: int, workdir: str, queue) -> None:
    """One of two gloo processes: a clean run, then one where only the second process's loss becomes NaN."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    root = Path(workdir)
    result = train(_toy(), EXAMPLES, _collate, _loss, _options(max_steps=5, log_every=2, save_every=3),
                   root / "clean", accelerator=accelerator)
    loss_fn = _nan_from(3) if rank == 1 else _loss
    try:
        train(_toy(), EXAMPLES, _collate, loss_fn, _options(max_steps=5, log_every=2, save_every=3), root / "nan",
              accelerator=accelerator)
        stopped = ""
    except TrainingDiverged as e:
        stopped = str(e)
    queue.put((rank, accelerator.num_processes, result.train_tokens, stopped))


@pytest.mark.slow
def test_two_processes_sum_tokens_and_a_nan_on_one_stops_both(tmp_path):
    import torch.multiprocessing as mp

    for name in ("clean", "nan"):
        (tmp_path / name).mkdir()
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = free_port()
    processes = [context.Process(target=_two_process_worker, args=(rank, port, str(tmp_path), queue))
                 for rank in range(2)]
    for process in processes:
        process.start()
    results = sorted(queue.get(timeout=240) for _ in processes)
    for process in processes:
        process.join(timeout=60)
    # each step takes one batch of 2 on each process: 4 tokens a step, all processes'
    assert [r[1:3] for r in results] == [(2, 20), (2, 20)]
    assert [e["tokens"] for e in _log(tmp_path / "clean")] == [8, 8, 4]
    saved = json.loads((tmp_path / "clean" / "checkpoints" / "step-3" / "state.json").read_text())
    assert (saved["tokens"], saved["tokens_since_log"]) == (12, 4)
    assert all("NaN or inf at step 3;" in r[3] for r in results)
    assert _steps(tmp_path / "nan" / "checkpoints") == [] and [e["step"] for e in _log(tmp_path / "nan")] == [2]


def test_out_of_gpu_memory_in_a_step_is_one_line_naming_the_options_to_lower(tmp_path, saved_models, monkeypatch):
    """CUDA's out-of-memory error in a forward or backward pass stops the run with one line naming the batch and
    the options that make it fit; nothing is written to the output."""
    from conftest import DOCUMENTS, SUMMARIES, write_jsonl
    from modelshrink.errors import UserError
    from modelshrink.options.distill import DistillOptions
    from modelshrink.steps.distill import distill

    def too_big(model, batch):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(UserError, match=r"^the GPU ran out of memory on a batch: lower --max-tokens or --batch-size"):
        train(_toy(), EXAMPLES, _collate, too_big, _options(max_steps=2), tmp_path / "toy",
              accelerator=Accelerator(cpu=True))
    import modelshrink.training.seq2seq as seq2seq

    monkeypatch.setattr(seq2seq, "make_loss", lambda *args: too_big)
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"document": d, "summary": s} for d, s in zip(DOCUMENTS, SUMMARIES)])
    with pytest.raises(UserError, match=r"on a batch of 4 × \d+ tokens: .*--grad-accum keeps the step's size\), or "
                                        r"add --gradient-checkpointing$"):
        distill(DistillOptions(data=str(pairs), student=str(saved_models["bart"]), batch_size=4, max_steps=2,
                               device="cpu"), tmp_path / "out")
    assert not (tmp_path / "out").exists()
