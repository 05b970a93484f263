"""Checkpoints of the training loop, without pickles: weights and optimizer tensors are safetensors,
everything else (where the run stands, the schedule, the fp16 loss scale) JSON.

A run may be killed at any instant (kill -9, a lost machine). A checkpoint or a best-weights folder
is written under a `.tmp` name, flushed to disk and renamed, so it exists whole or not at all; older
ones are deleted only after that. The weights validated best live in `best/step-N`, apart from the
checkpoints, and the ones the latest checkpoint names stay until a newer checkpoint names others."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, load_model, save_file, save_model


@dataclass
class TrainState:
    """Where a run stands; a checkpoint stores it as state.json, and resuming reads it back."""

    step: int = 0  # optimizer updates so far
    epoch: int = 0
    batch_in_epoch: int = 0  # this process's batches of the epoch already used
    tokens: int = 0  # training tokens, all processes
    best: dict[str, Any] | None = None  # {"step", "score", "metric", "metrics"} of the best validation
    evals_without_gain: int = 0
    seconds: float = 0.0
    last_eval_step: int | None = None
    tokens_since_log: int = 0  # counted in the next train_log line
    last_loss: float | None = None


def _save_optimizer(optimizer: torch.optim.Optimizer, folder: Path) -> None:
    state = optimizer.state_dict()
    tensors, meta = {}, {"param_groups": state["param_groups"], "state": {}}
    for pid, entry in state["state"].items():
        meta["state"][str(pid)] = {}
        for key, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"{pid}.{key}"] = value.detach().cpu().contiguous()
                meta["state"][str(pid)][key] = "__tensor__"
            else:
                meta["state"][str(pid)][key] = value
    save_file(tensors, folder / "optimizer.safetensors")
    (folder / "optimizer.json").write_text(json.dumps(meta))


def _load_optimizer(optimizer: torch.optim.Optimizer, folder: Path) -> None:
    meta = json.loads((folder / "optimizer.json").read_text())
    tensors = load_file(folder / "optimizer.safetensors")
    state = {int(pid): {k: tensors[f"{pid}.{k}"] if v == "__tensor__" else v for k, v in entry.items()}
             for pid, entry in meta["state"].items()}
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})


def save_checkpoint(folder: Path, model: Any, optimizer: torch.optim.Optimizer, scheduler: Any,
                    state: TrainState, scaler: Any = None) -> None:
    """`optimizer` is the torch optimizer itself (not accelerate's wrapper); `scaler` the fp16 loss
    scaler, whose scale and growth counter an exact resume needs too."""
    partial = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    save_model(model, str(partial / "model.safetensors"))
    _save_optimizer(optimizer, partial)
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng.update({f"cuda{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    save_file(rng, partial / "rng.safetensors")
    record = {**asdict(state), "scheduler": scheduler.state_dict()}
    if scaler is not None:
        record["scaler"] = scaler.state_dict()  # plain numbers: scale, growth factors, growth tracker
    (partial / "state.json").write_text(json.dumps(record, indent=2))
    _sync(partial)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)  # a checkpoint folder exists only once it is whole
    _sync(folder.parent)  # the rename itself, before `prune_checkpoints` may delete the one before


def _sync(folder: Path) -> None:
    """Flush `folder`'s files and the folder itself to disk, so that a machine that goes down (not only
    a killed process) finds a checkpoint whole or not at all."""
    for path in [*(p for p in folder.iterdir() if p.is_file()), folder]:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # a folder cannot be opened on Windows; its rename is durable there anyway
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def load_checkpoint(folder: Path, model: Any, optimizer: torch.optim.Optimizer, scheduler: Any,
                    scaler: Any = None) -> TrainState:
    """Weights, optimizer, schedule, loss scale and random state back from `folder`; returns the state there."""
    load_model(model, str(folder / "model.safetensors"))
    _load_optimizer(optimizer, folder)
    saved = json.loads((folder / "state.json").read_text())
    scheduler.load_state_dict(saved.pop("scheduler"))
    scaled = saved.pop("scaler", None)
    if scaler is not None and scaled:
        scaler.load_state_dict(scaled)
    rng = load_file(folder / "rng.safetensors")
    torch.set_rng_state(rng["torch"])
    if torch.cuda.is_available() and "cuda0" in rng:
        torch.cuda.set_rng_state_all([rng[f"cuda{i}"] for i in range(torch.cuda.device_count())])
    return TrainState(**saved)


def _checkpoints(workdir: Path) -> list[Path]:
    """The whole checkpoints in `workdir`, oldest first."""
    return sorted((p for p in (workdir / "checkpoints").glob("step-*") if not p.name.endswith(".tmp")),
                  key=lambda p: int(p.name.split("-")[1]))


def latest_checkpoint(workdir: Path) -> Path | None:
    found = _checkpoints(workdir)
    return found[-1] if found else None


def prune_checkpoints(workdir: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints, oldest first, and the half-written ones an
    earlier run left; returns what it deleted. Called once a new checkpoint is whole (and keep >= 1),
    so the one a resume reads is never among them."""
    found = _checkpoints(workdir)
    doomed = found[:max(0, len(found) - keep)] + sorted((workdir / "checkpoints").glob("step-*.tmp"))
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


# ---------------------------------------------------------------- the best weights

def best_folder(workdir: Path, step: int) -> Path:
    """Where the weights validated best at `step` wait for the end of the run."""
    return workdir / "best" / f"step-{step}"


def write_best(save: Callable[[Any, Path], None], model: Any, workdir: Path, step: int) -> None:
    """`save(model, folder)` into `best_folder(workdir, step)`, which exists only once it is whole."""
    folder = best_folder(workdir, step)
    partial = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(partial, ignore_errors=True)
    save(model, partial)
    _sync(partial)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    _sync(folder.parent)


def prune_best(workdir: Path, keep: set[int | None]) -> None:
    """Delete the best weights of every step but `keep`'s (and half-written ones). A run keeps the
    best its latest checkpoint names until a newer checkpoint names a newer one: a run resumed from
    that checkpoint must find the weights it calls best, whatever the lost steps after it saved."""
    for path in (workdir / "best").glob("*"):
        name = path.name
        step = int(name[5:]) if name.startswith("step-") and name[5:].isdigit() else None
        if step is not None and step in keep:
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()

