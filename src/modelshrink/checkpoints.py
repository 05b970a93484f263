"""Checkpoints of the training loop, without pickles: weights and optimizer tensors are safetensors,
everything else (where the run stands, the schedule, the fp16 loss scale) JSON."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

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
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)  # a checkpoint folder exists only once it is whole


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


def latest_checkpoint(workdir: Path) -> Path | None:
    found = sorted((p for p in (workdir / "checkpoints").glob("step-*") if not p.name.endswith(".tmp")),
                   key=lambda p: int(p.name.split("-")[1]))
    return found[-1] if found else None
