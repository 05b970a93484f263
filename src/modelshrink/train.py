"""The training loop, written out once and shared by `distill`, `quantize` and `contrastive`.

A task hands the loop a model, its examples, a collate function and a loss; the loop owns the rest:
AdamW with linear warmup and decay, gradient accumulation and clipping, batches by size or by a
token budget, periodic validation with best-checkpoint selection and early stopping, a JSON Lines
log, checkpoints and resume, and a stop on a NaN/inf loss. It runs unchanged under
`accelerate launch` (several processes or machines): each process takes every world_size-th batch,
DDP averages the gradients, and only the main process validates, writes and reports progress.

Checkpoints hold no pickles: weights and optimizer tensors are safetensors, everything else JSON.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from modelshrink.errors import UserError
from modelshrink.options.train import TrainOptions

LossFn = Callable[[Any, dict[str, torch.Tensor]], tuple[torch.Tensor, dict[str, torch.Tensor]]]
ValidateFn = Callable[[Any], dict[str, float]]


class TrainingDiverged(UserError):
    """The loss became NaN or inf; the run stopped and kept its last good checkpoint."""


@dataclass
class TrainResult:
    steps: int
    epochs: float
    train_tokens: int
    seconds: float
    tokens_per_second: float
    final_loss: float | None
    best: dict[str, Any] | None
    validation: dict[str, float] | None
    log: list[dict[str, Any]] = field(default_factory=list)


def make_batches(lengths: list[int], options: TrainOptions, epoch: int) -> list[list[int]]:
    """This epoch's batches of example indices: a seeded shuffle, then fixed-size batches, or with
    `max_tokens` batches packed by length (within windows of 100 batches) so that the padded size
    (longest × count) stays under the budget, then shuffled again."""
    g = torch.Generator().manual_seed(options.seed * 100_003 + epoch)
    order = torch.randperm(len(lengths), generator=g).tolist()
    if options.max_tokens is None:
        return [order[i:i + options.batch_size] for i in range(0, len(order), options.batch_size)]
    batches: list[list[int]] = []
    window = options.batch_size * 100
    for start in range(0, len(order), window):
        chunk = sorted(order[start:start + window], key=lambda i: lengths[i])
        current: list[int] = []
        for i in chunk:
            longest = max([lengths[j] for j in current] + [lengths[i]])
            if current and longest * (len(current) + 1) > options.max_tokens:
                batches.append(current)
                current = []
            current.append(i)
        if current:
            batches.append(current)
    shuffle = torch.randperm(len(batches), generator=g).tolist()
    return [batches[i] for i in shuffle]


def _optimizer(model: Any, options: TrainOptions) -> torch.optim.Optimizer:
    # No weight decay on biases and norms, as BART, T5 and BERT fine-tuning recipes do.
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or "norm" in name.lower() else decay).append(param)
    groups = [{"params": decay, "weight_decay": options.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kwargs = dict(lr=options.lr, betas=(options.beta1, options.beta2), eps=options.eps)
    try:  # the fused kernel (CPU and CUDA, torch >= 2.4) is what transformers' Trainer uses by default too
        return torch.optim.AdamW(groups, fused=True, **kwargs)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, **kwargs)


def _schedule(optimizer: torch.optim.Optimizer, warmup: int, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total - step) / max(1, total - warmup))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# ---------------------------------------------------------------- checkpoints without pickles

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
                    state: dict[str, Any]) -> None:
    partial = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    save_model(model, str(partial / "model.safetensors"))
    _save_optimizer(optimizer, partial)
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng.update({f"cuda{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    save_file(rng, partial / "rng.safetensors")
    (partial / "state.json").write_text(json.dumps({**state, "scheduler": scheduler.state_dict()}, indent=2))
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)  # a checkpoint folder exists only once it is whole


def latest_checkpoint(workdir: Path) -> Path | None:
    found = sorted((p for p in (workdir / "checkpoints").glob("step-*") if not p.name.endswith(".tmp")),
                   key=lambda p: int(p.name.split("-")[1]))
    return found[-1] if found else None


def start_run(output: Path, device: str, *, overwrite: bool, resume: bool) -> tuple[Any, Any]:
    """The accelerator and the artifact writer of a step that trains, once every process has
    checked the output (before the main one creates the staging folder)."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    from modelshrink.artifacts import ArtifactWriter

    # Unused parameters (the BERT pooler of a bert2bert) would stop DDP without find_unused_parameters.
    accelerator = Accelerator(cpu=device == "cpu",
                              kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    writer = ArtifactWriter(output, overwrite=overwrite, resume=resume, keep_on_failure=True)
    writer.check()
    accelerator.wait_for_everyone()
    return accelerator, writer


def open_run(accelerator: Any, writer: Any, recorded: dict[str, Any], parents: list[dict[str, Any]]) -> Path:
    """Create (or, resuming, check) the staging folder on the main process; every process gets its path.
    A resumed run may extend its budget or change how often it logs, validates and saves."""
    from modelshrink.artifacts import pin_run

    if accelerator.is_main_process:
        writer.open()
        pin_run(writer.staging, recorded, parents, may_change=("max_steps", "epochs", "eval_every", "save_every",
                                                                "log_every", "device", "early_stopping"))
    accelerator.wait_for_everyone()
    return writer.staging


def keep_best(workdir: Path, result: TrainResult | None, save_final: Callable[[Path], None]) -> None:
    """Leave in `workdir` the weights to publish: the best validated ones where validation saved
    some, else the final ones (`save_final(folder)`); then drop the training leftovers."""
    from modelshrink.artifacts import RUN_FILE

    best = workdir / "best"
    if result is not None and result.best is not None and best.is_dir():
        for f in best.iterdir():
            shutil.move(str(f), workdir / f.name)
    else:
        save_final(workdir)
    for leftover in ("best", "checkpoints"):
        shutil.rmtree(workdir / leftover, ignore_errors=True)
    (workdir / RUN_FILE).unlink(missing_ok=True)


# ---------------------------------------------------------------- the loop

def train(model: Any, examples: list[dict[str, Any]], collate: Callable[[list[dict[str, Any]]], dict[str, Any]],
          loss_fn: LossFn, options: TrainOptions, workdir: Path, *, accelerator: Any,
          validate: ValidateFn | None = None, save_best: Callable[[Any, Path], None] | None = None,
          resume: bool = False, progress: Callable[[dict[str, Any]], None] | None = None,
          log: Callable[[str], None] = lambda m: None) -> TrainResult:
    """Train `model` in place; returns what happened. `examples` carry `length` (tokens) for batching.
    `save_best(model, folder)` is called on the main process whenever validation improves."""
    main = accelerator.is_main_process
    world = accelerator.num_processes
    lengths = [e["length"] for e in examples]
    per_epoch = len(make_batches(lengths, options, 0)) // world // options.grad_accum
    if per_epoch == 0:
        raise UserError(f"{len(examples)} examples make no full optimizer step with batch size "
                        f"{options.batch_size} × {options.grad_accum} accumulation × {world} processes")
    total = options.max_steps if options.max_steps is not None else math.ceil(options.epochs * per_epoch)
    warmup = options.warmup_steps if options.warmup_steps is not None else int(options.warmup_ratio * total)
    model.to(accelerator.device)  # before the optimizer, so restored optimizer state lands on the device
    optimizer = _optimizer(model, options)
    scheduler = _schedule(optimizer, warmup, total)
    log_path = workdir / "train_log.jsonl"
    state = {"step": 0, "epoch": 0, "batch_in_epoch": 0, "tokens": 0, "best": None, "evals_without_gain": 0,
             "seconds": 0.0, "last_eval_step": None}
    checkpoint = latest_checkpoint(workdir) if resume else None
    if checkpoint is not None:
        load_model(model, str(checkpoint / "model.safetensors"))
        _load_optimizer(optimizer, checkpoint)
        saved = json.loads((checkpoint / "state.json").read_text())
        scheduler.load_state_dict(saved.pop("scheduler"))
        state.update(saved)
        rng = load_file(checkpoint / "rng.safetensors")
        torch.set_rng_state(rng["torch"])
        if torch.cuda.is_available() and "cuda0" in rng:
            torch.cuda.set_rng_state_all([rng[f"cuda{i}"] for i in range(torch.cuda.device_count())])
        if main and log_path.exists():  # drop log lines written after the checkpoint
            kept = [line for line in log_path.read_text().splitlines() if json.loads(line)["step"] <= state["step"]]
            log_path.write_text("".join(line + "\n" for line in kept))
        log(f"resuming from {checkpoint.name}")
    else:
        torch.manual_seed(options.seed)
        if main and log_path.exists():
            log_path.unlink()
    # Only the model goes through accelerate (DDP across processes). Its scheduler wrapper would step
    # once per process, and steps here count optimizer updates, whatever the number of processes.
    ddp = accelerator.prepare(model)
    ddp.train()

    def write_log(entry: dict[str, Any]) -> None:
        if main:
            with open(log_path, "a") as f:
                f.write(json.dumps(entry) + "\n")

    def run_validation() -> bool:
        """Validate on the main process; returns whether to stop early (the same on every process)."""
        stop = False
        state["last_eval_step"] = state["step"]
        if main:
            ddp.eval()
            metrics = validate(accelerator.unwrap_model(ddp))
            ddp.train()
            score = metrics[options.metric]
            best = state["best"]
            improved = best is None or score > best["score"]
            if improved:
                state["best"] = {"step": state["step"], "score": score, "metric": options.metric, "metrics": metrics}
                state["evals_without_gain"] = 0
                if save_best is not None:
                    save_best(accelerator.unwrap_model(ddp), workdir / "best")
            else:
                state["evals_without_gain"] += 1
            write_log({"step": state["step"], "event": "validation", **metrics, "best_step": state["best"]["step"]})
            log(f"step {state['step']}: validation {options.metric} {score:.2f}"
                + (" (best)" if improved else f" (best {state['best']['score']:.2f} at step {state['best']['step']})"))
            stop = options.early_stopping is not None and state["evals_without_gain"] >= options.early_stopping
        return _broadcast(accelerator, stop)

    started = time.perf_counter() - state["seconds"]
    window_tokens, window_start, losses, last_loss = 0, time.perf_counter(), [], None
    stopped_early = False
    while state["step"] < total and not stopped_early:
        batches = make_batches(lengths, options, state["epoch"])
        usable = len(batches) // (world * options.grad_accum) * world * options.grad_accum
        mine = batches[accelerator.process_index:usable:world]  # equal counts on every process, for DDP
        for position in range(state["batch_in_epoch"], len(mine), options.grad_accum):
            group = mine[position:position + options.grad_accum]
            step_parts: dict[str, float] = {}
            step_tokens = 0
            for micro, indices in enumerate(group):
                batch = {k: v.to(accelerator.device) if torch.is_tensor(v) else v
                         for k, v in collate([examples[i] for i in indices]).items()}
                sync = micro == len(group) - 1
                context = accelerator.no_sync(ddp) if not sync and world > 1 else _null()
                with context:
                    loss, parts = loss_fn(ddp, batch)
                    if _broadcast_any(accelerator, not bool(torch.isfinite(loss))):
                        raise TrainingDiverged(_diverged_message(state, workdir))
                    accelerator.backward(loss / len(group))
                for name, value in parts.items():
                    step_parts[name] = step_parts.get(name, 0.0) + float(value) / len(group)
                step_tokens += int(batch["tokens"])
            if options.max_grad_norm > 0:
                accelerator.clip_grad_norm_(ddp.parameters(), options.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            state["step"] += 1
            state["batch_in_epoch"] = position + len(group)
            step_tokens = _sum(accelerator, step_tokens)  # all processes' tokens
            state["tokens"] += step_tokens
            window_tokens += step_tokens
            losses.append(step_parts.get("loss", 0.0))
            last_loss = step_parts.get("loss")
            if state["step"] % options.log_every == 0 or state["step"] == total:
                now = time.perf_counter()
                rate = window_tokens / max(now - window_start, 1e-9)
                entry = {"step": state["step"], "epoch": round(state["epoch"] + state["batch_in_epoch"] / len(mine), 4),
                         "lr": scheduler.get_last_lr()[0], "tokens": window_tokens, "seconds": round(now - window_start, 4),
                         "tokens_per_s": round(rate, 1),
                         **{k: round(v, 5) for k, v in step_parts.items()}}
                write_log(entry)
                if main and progress:
                    progress({**entry, "total_steps": total})
                window_tokens, window_start = 0, now
            state["seconds"] = time.perf_counter() - started
            if validate is not None and options.eval_every and state["step"] % options.eval_every == 0:
                stopped_early = run_validation()
            if options.save_every and state["step"] % options.save_every == 0 and main:
                save_checkpoint(workdir / "checkpoints" / f"step-{state['step']}", accelerator.unwrap_model(ddp),
                                optimizer, scheduler, state)
            accelerator.wait_for_everyone()
            if state["step"] >= total or stopped_early:
                break
        else:
            state["epoch"] += 1
            state["batch_in_epoch"] = 0
    if validate is not None and not stopped_early and state["last_eval_step"] != state["step"]:
        run_validation()  # the final weights are a candidate too
    seconds = time.perf_counter() - started
    final = state["best"]["metrics"] if state["best"] else None
    return TrainResult(steps=state["step"], epochs=round(state["epoch"] + state["batch_in_epoch"] / max(1, per_epoch *
                       options.grad_accum), 4), train_tokens=state["tokens"], seconds=round(seconds, 3),
                       tokens_per_second=round(state["tokens"] / seconds, 1) if seconds > 0 else 0.0,
                       final_loss=last_loss, best=state["best"], validation=final)


def _diverged_message(state: dict[str, Any], workdir: Path) -> str:
    checkpoint = latest_checkpoint(workdir)
    kept = (f"the last good checkpoint is {checkpoint} (continue from it with --resume)" if checkpoint
            else "no checkpoint was saved yet (set --save-every)")
    return (f"the loss became NaN or inf at step {state['step'] + 1}; training stopped and {kept}; a lower --lr or "
            "--max-grad-norm usually helps (start over with --overwrite)")


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _broadcast(accelerator: Any, value: bool) -> bool:
    """The main process's decision, on every process."""
    if accelerator.num_processes == 1:
        return value
    from accelerate.utils import broadcast_object_list

    box = [value]
    broadcast_object_list(box, from_process=0)
    return bool(box[0])


def _sum(accelerator: Any, value: int) -> int:
    if accelerator.num_processes == 1:
        return value
    total = torch.tensor([float(value)], device=accelerator.device)
    return int(accelerator.reduce(total, reduction="sum").item())


def _broadcast_any(accelerator: Any, value: bool) -> bool:
    """True on every process when it is true on any (a NaN on one process stops all of them)."""
    if accelerator.num_processes == 1:
        return value
    flag = torch.tensor([1.0 if value else 0.0], device=accelerator.device)
    return bool(accelerator.reduce(flag, reduction="sum").item() > 0)
