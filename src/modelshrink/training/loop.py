"""The training loop, written out once and shared by `distill`, `quantize` and `contrastive`.

A task hands the loop a model, its examples, a collate function and a loss; the loop owns the rest:
AdamW with linear warmup and decay, gradient accumulation and clipping, batches by size or by a
token budget, periodic validation with best-checkpoint selection and early stopping, a JSON Lines
log, checkpoints (the newest `--save-total-limit` kept) and an exact resume, even after a kill -9
(`modelshrink.training.checkpoints`), and a stop on a NaN/inf loss. It runs
unchanged under `accelerate launch` (several processes or machines): each process takes every
world_size-th batch, DDP averages the gradients, and only the main process validates, writes and
reports progress.

Mixed precision (`--precision bf16|fp16`) is accelerate's: the model keeps float32 weights and its
forward pass runs under autocast; fp16 adds loss scaling, which the prepared optimizer steps through.
A teacher runs frozen in the half precision itself (`place_teacher`), and losses are float32.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from modelshrink.training.checkpoints import (TrainState, latest_checkpoint, load_checkpoint, prune_best,
                                     prune_checkpoints, save_checkpoint, write_best)
from modelshrink.training.batches import make_batches, process_batches
from modelshrink.training.train_log import TrainLog
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


# ---------------------------------------------------------------- precision and memory

def place_teacher(teacher: Any, device: Any, precision: str, compile: bool = False) -> Any:
    """The frozen teacher on the run's device with its weights in the run's precision (bf16/fp16 halve
    its memory; it is never trained, so it needs no float32 master weights). The losses cast its
    outputs to float32 where they meet the student's. With `compile` (it runs inside the compiled step), its
    output hooks are installed now (`install_output_hooks`)."""
    from modelshrink.precision import torch_dtype

    if compile:
        install_output_hooks(teacher)
    return teacher.to(device, dtype=torch_dtype(precision)).eval()


def install_output_hooks(model: Any) -> None:
    """Install now the hooks with which transformers collects hidden states and attention maps, on every module of
    `model` that records them. transformers installs them on the first call that asks for those outputs, under a
    lock: inside a compiled step that splits the graph and compiles the step again on the next call."""
    try:
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY, maybe_install_capturing_hooks
    except ImportError:  # a transformers that records outputs without hooks
        return
    for module in model.modules():
        if _CAN_RECORD_REGISTRY.get(module):
            maybe_install_capturing_hooks(module)


def enable_gradient_checkpointing(model: Any) -> None:
    """Recompute each layer's activations in the backward pass instead of keeping them: less memory
    for about a third more compute. Non-reentrant checkpointing, which DDP with unused parameters
    accepts (the reentrant kind would mark a parameter ready twice)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise UserError(f"--gradient-checkpointing: {type(model).__name__} does not support gradient "
                        "checkpointing; run without it")
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers' newer name; the old one warns there
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def run_facts(accelerator: Any, options: TrainOptions) -> dict[str, Any]:
    """How a run trained, for the manifest's `resolved`: the same keys in every step that trains."""
    return {"device": str(accelerator.device), "processes": accelerator.num_processes,
            "precision": options.precision, "gradient_checkpointing": options.gradient_checkpointing,
            "compile": options.compile}


# ---------------------------------------------------------------- pieces of the loop

@dataclass
class _Validation:
    """Validation on the main process with best-checkpoint selection and early stopping."""

    validate: ValidateFn
    save_best: Callable[[Any, Path], None] | None
    options: TrainOptions
    accelerator: Any
    workdir: Path
    train_log: TrainLog
    log: Callable[[str], None]
    anchor: int | None = None  # the best step the latest checkpoint names: its weights stay until a newer one

    def checkpointed(self, state: TrainState) -> None:
        """A checkpoint of `state` is whole: the best it names is the one a resume needs."""
        self.anchor = state.best["step"] if state.best else None
        prune_best(self.workdir, {self.anchor})

    def __call__(self, ddp: Any, state: TrainState) -> bool:
        """Validate now; returns whether to stop early (the same on every process)."""
        stop = False
        state.last_eval_step = state.step
        if self.accelerator.is_main_process:
            metric = self.options.metric
            ddp.eval()
            metrics = self.validate(self.accelerator.unwrap_model(ddp))
            ddp.train()
            score = metrics[metric]
            improved = state.best is None or score > state.best["score"]
            if improved:
                state.best = {"step": state.step, "score": score, "metric": metric, "metrics": metrics}
                state.evals_without_gain = 0
                if self.save_best is not None:
                    write_best(self.save_best, self.accelerator.unwrap_model(ddp), self.workdir, state.step)
                    prune_best(self.workdir, {state.step, self.anchor})
            else:
                state.evals_without_gain += 1
            self.train_log.write({"step": state.step, "event": "validation", **metrics,
                                  "best_step": state.best["step"]})
            self.log(f"step {state.step}: validation {metric} {score:.2f}" + (
                " (best)" if improved else f" (best {state.best['score']:.2f} at step {state.best['step']})"))
            patience = self.options.early_stopping
            stop = patience is not None and state.evals_without_gain >= patience
        return _broadcast(self.accelerator, stop)


class _Pending:
    """What the steps since the last read left on the device, read back only where something needs it: a log
    line, a checkpoint, validation, the end (`read`). A read per micro-batch (`bool(torch.isfinite(loss))`,
    `float(part)`) waits for every kernel queued before it and leaves the GPU idle while the host catches up,
    and under several processes an all-reduce per step stalls all of them.

    The trade-off: a NaN/inf loss no longer stops the run before its optimizer step. The optimizer may take up
    to log_every - 1 more steps on NaN weights before the stop (with --save-every or --eval-every, fewer).
    Nothing written is affected: every read comes before the log line, the validation (and its best weights)
    and the checkpoint of its step, so none made after the first bad loss is written, and the stop names that
    step, as before."""

    def __init__(self, device: Any):
        self.bad_step = torch.zeros((), dtype=torch.long, device=device)  # the first step with a NaN/inf loss; 0: none
        self.tokens = 0  # this process's since the last read: host ints from the collated batches
        self.parts: dict[str, list[torch.Tensor]] = {}  # the latest step's loss parts, one per micro-batch
        self.micro_batches = 1

    def saw(self, loss: torch.Tensor, step: int) -> None:
        self.bad_step.masked_fill_((self.bad_step == 0) & ~torch.isfinite(loss.detach()), step)

    def read(self, accelerator: Any) -> tuple[int, int]:
        """(all processes' tokens since the last read, the first bad step on any process or 0): one
        all-gather under several processes, one device-to-host copy."""
        if accelerator.num_processes == 1:
            tokens, bad = self.tokens, int(self.bad_step)
        else:
            mine = torch.stack([self.bad_step.new_tensor(self.tokens), self.bad_step]).reshape(1, 2)
            rows = accelerator.gather(mine).tolist()
            tokens, bad = sum(row[0] for row in rows), min((row[1] for row in rows if row[1]), default=0)
        self.tokens = 0
        return tokens, bad

    def mean_parts(self) -> dict[str, float]:
        """The latest step's loss parts, each the mean over its micro-batches, summed on the host in the order
        and precision of reading them one by one (the logged numbers do not depend on when they are read)."""
        values = [v for vs in self.parts.values() for v in vs]
        if not values:
            return {}
        dtype = functools.reduce(torch.promote_types, (v.dtype for v in values))
        numbers = iter(torch.stack([v.reshape(()).to(dtype) for v in values]).tolist())
        means = {}
        for name, vs in self.parts.items():
            means[name] = 0.0
            for _ in vs:
                means[name] += next(numbers) / self.micro_batches
        return means


def _to_device(batch: dict[str, Any], device: Any) -> dict[str, Any]:
    """The collated batch on the device. On CUDA its CPU tensors go through pinned memory without blocking the
    host, which goes on to queue the forward pass while they copy."""
    if device.type != "cuda":
        return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
    return {k: (v.pin_memory() if v.device.type == "cpu" else v).to(device, non_blocking=True)
            if torch.is_tensor(v) else v for k, v in batch.items()}


def _out_of_memory(batch: dict[str, Any]) -> str:
    ids = batch.get("input_ids")
    shape = f" of {' × '.join(str(n) for n in ids.shape)} tokens" if torch.is_tensor(ids) else ""
    return (f"the GPU ran out of memory on a batch{shape}: lower --max-tokens or --batch-size (--grad-accum keeps "
            "the step's size), or add --gradient-checkpointing")


def _accumulate(ddp: Any, micro_batches: list[dict[str, Any]], loss_fn: LossFn, accelerator: Any,
                pending: _Pending, step: int) -> None:
    """Forward and backward over step `step`'s micro-batches (gradients averaged over them); their loss
    parts, tokens and any NaN/inf loss go to `pending`, on the device, unread."""
    n = len(micro_batches)
    pending.parts, pending.micro_batches = {}, n
    for micro, batch in enumerate(micro_batches):
        pending.tokens += int(batch["tokens"])  # counted on the host by the collate function
        batch = _to_device(batch, accelerator.device)
        sync = micro == n - 1  # DDP averages gradients across processes on the last micro-batch only
        context = accelerator.no_sync(ddp) if not sync and accelerator.num_processes > 1 else contextlib.nullcontext()
        with context:
            try:
                loss, parts = loss_fn(ddp, batch)  # float32 (the losses cast), whatever the autocast dtype
                pending.saw(loss, step)
                accelerator.backward(loss / n)
            except torch.cuda.OutOfMemoryError:
                raise UserError(_out_of_memory(batch)) from None
        for name, value in parts.items():
            pending.parts.setdefault(name, []).append(torch.as_tensor(value, device=accelerator.device).detach())


def _settle(pending: _Pending, accelerator: Any, state: TrainState, train_log: TrainLog, workdir: Path) -> dict[str, float]:
    """Read what `pending` holds into `state` and the log window, or stop every process if a loss was NaN/inf;
    returns the latest step's mean loss parts."""
    tokens, bad = pending.read(accelerator)
    if bad:
        raise TrainingDiverged(_diverged_message(bad, workdir))
    state.tokens += tokens
    train_log.window_tokens += tokens
    parts = pending.mean_parts()
    state.last_loss = parts.get("loss")
    return parts


def compiled(loss_fn: LossFn) -> LossFn:
    """`loss_fn` (the model's forward pass and the loss) under torch.compile, the backward through its compiled
    graph; `COMPILE_BACKEND` is torch's default (inductor) unless a test sets another. Inductor draws dropout masks
    from torch's own generator (`fallback_random`), so that a compiled run repeats the eager run's numbers (a tiny
    BART's distill losses over 4 steps: equal to 5 decimals; with inductor's own generator they differ from step
    1) rather than another seed's."""
    import torch._inductor.config

    torch._inductor.config.fallback_random = True
    return torch.compile(loss_fn, backend=COMPILE_BACKEND, dynamic=None)


COMPILE_BACKEND = "inductor"


# ---------------------------------------------------------------- the loop

def train(model: Any, examples: list[dict[str, Any]], collate: Callable[[list[dict[str, Any]]], dict[str, Any]],
          loss_fn: LossFn, options: TrainOptions, workdir: Path, *, accelerator: Any,
          validate: ValidateFn | None = None, save_best: Callable[[Any, Path], None] | None = None,
          resume: bool = False, progress: Callable[[dict[str, Any]], None] | None = None,
          log: Callable[[str], None] = lambda m: None, hparams: dict[str, Any] | None = None,
          step_context: Callable[[], Any] = contextlib.nullcontext) -> TrainResult:
    """Train `model` in place; returns what happened. `examples` carry `length` (tokens) for batching.
    `save_best(model, folder)` is called on the main process whenever validation improves. With
    `options.report_to`, the main process's trackers get every train_log.jsonl line and `hparams` (the
    step's recorded options; the training options where not given). `step_context()` is entered around each
    optimizer step's forward and backward passes (quantize: `quant.modules.weights_once`, so that each fake-quantized
    weight is computed once per step, not at every use in every micro-batch); not with `options.compile`, where
    one graph computes each fake-quantized weight once per micro-batch."""
    main, world = accelerator.is_main_process, accelerator.num_processes
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
    train_log = TrainLog(workdir / "train_log.jsonl", main)
    checkpoint = latest_checkpoint(workdir) if resume else None
    if checkpoint is not None:
        state = load_checkpoint(checkpoint, model, optimizer, scheduler, accelerator.scaler)
        train_log.start(resumed_at=state.step)
        train_log.window_tokens = state.tokens_since_log
        log(f"resuming from {checkpoint.name}")
    else:
        state = TrainState()
        torch.manual_seed(options.seed)
        train_log.start(resumed_at=None)
    # Model and optimizer go through accelerate: DDP across processes, autocast, and with fp16 the
    # loss scaler (the prepared optimizer steps through it; clip_grad_norm_ unscales first). The
    # scheduler does not: its wrapper would step once per process, and steps here count optimizer
    # updates, whatever the number of processes. Checkpoints hold `optimizer`, the torch one inside.
    ddp, stepper = accelerator.prepare(model, optimizer)
    ddp.train()
    if options.compile:
        install_output_hooks(model)
        # no step_context: a weight cached by one micro-batch's compiled graph cannot be backpropagated through
        # again by the next one's (gradient accumulation), so each graph makes its own
        loss_fn, step_context = compiled(loss_fn), contextlib.nullcontext
    validation = (_Validation(validate, save_best, options, accelerator, workdir, train_log, log)
                  if validate is not None else None)
    if validation and main:  # drop the bests a killed run saved after its last checkpoint
        validation.checkpointed(state)

    train_log.trackers = _start_trackers(options, workdir, hparams, checkpoint is not None, state.step, main, log)
    try:
        _loop(ddp, stepper, optimizer, scheduler, state, examples, lengths, collate, loss_fn, options, workdir,
              accelerator, validation, train_log, total, progress, step_context)
    finally:
        if train_log.trackers is not None:
            train_log.trackers.finish()
    epochs = round(state.epoch + state.batch_in_epoch / max(1, per_epoch * options.grad_accum), 4)
    return TrainResult(steps=state.step, epochs=epochs, train_tokens=state.tokens, seconds=round(state.seconds, 3),
                       tokens_per_second=round(state.tokens / state.seconds, 1) if state.seconds > 0 else 0.0,
                       final_loss=state.last_loss, best=state.best,
                       validation=state.best["metrics"] if state.best else None)


def _start_trackers(options: TrainOptions, workdir: Path, hparams: dict[str, Any] | None, resumed: bool, step: int,
                    main: bool, log: Callable[[str], None]) -> Any:
    """--report-to's trackers on the main process (None elsewhere, or without --report-to), named after the
    artifact (its staging folder `.NAME.partial` is `workdir`)."""
    if not (main and options.trackers):
        return None
    from modelshrink.training.tracking import Trackers

    name = workdir.name
    name = name[1:-len(".partial")] if name.startswith(".") and name.endswith(".partial") else name
    folder = Path(options.tracking_dir) if options.tracking_dir else workdir / "runs"
    return Trackers(options.trackers, folder, name, hparams if hparams is not None else options.recorded(),
                    resumed_at=step if resumed else None, warn=log)


def _loop(ddp: Any, stepper: Any, optimizer: Any, scheduler: Any, state: TrainState, examples: list[dict[str, Any]],
          lengths: list[int], collate: Callable, loss_fn: LossFn, options: TrainOptions, workdir: Path, accelerator: Any,
          validation: _Validation | None, train_log: TrainLog, total: int,
          progress: Callable[[dict[str, Any]], None] | None, step_context: Callable[[], Any]) -> None:
    """The steps from `state` to `total` (or an early stop), then the final validation; `state` records them."""
    main = accelerator.is_main_process
    started = time.perf_counter() - state.seconds
    train_log.window_start = time.perf_counter()
    # A checkpoint written where early stopping stopped the run (then killed before its output was
    # written) stops it again; a larger --early-stopping on resume lets it go on.
    patience = options.early_stopping
    stopped_early = patience is not None and state.evals_without_gain >= patience
    pending = _Pending(accelerator.device)
    while state.step < total and not stopped_early:
        mine = process_batches(lengths, options, state.epoch, accelerator)
        for position in range(state.batch_in_epoch, len(mine), options.grad_accum):
            group = mine[position:position + options.grad_accum]
            with step_context():
                _accumulate(ddp, [collate([examples[i] for i in indices]) for indices in group], loss_fn,
                            accelerator, pending, state.step + 1)
            if options.max_grad_norm > 0:
                accelerator.clip_grad_norm_(ddp.parameters(), options.max_grad_norm)
            stepper.step()
            scheduler.step()  # also after an update fp16's scaler skipped (inf gradients), as Trainer does
            stepper.zero_grad(set_to_none=True)
            state.step += 1
            state.batch_in_epoch = position + len(group)
            # The same on every process: each read below is a collective under several.
            logging = state.step % options.log_every == 0 or state.step >= total
            evaluating = bool(validation and options.eval_every and state.step % options.eval_every == 0)
            saving = bool(options.save_every and state.step % options.save_every == 0)
            if logging or evaluating or saving:
                parts = _settle(pending, accelerator, state, train_log, workdir)
            if logging:
                train_log.line(state, parts, scheduler.get_last_lr()[0], len(mine), total, progress)
            state.seconds = time.perf_counter() - started
            if evaluating:
                stopped_early = validation(ddp, state)
            if saving:
                if main:
                    state.tokens_since_log = train_log.window_tokens
                    save_checkpoint(workdir / "checkpoints" / f"step-{state.step}", accelerator.unwrap_model(ddp),
                                    optimizer, scheduler, state, accelerator.scaler)
                    prune_checkpoints(workdir, options.save_total_limit)  # only now that the new one is whole
                    if validation:
                        validation.checkpointed(state)
                accelerator.wait_for_everyone()  # for the checkpoint; a barrier every step would stall every step
            if state.step >= total or stopped_early:
                break
        else:
            state.epoch += 1
            state.batch_in_epoch = 0
    if validation and not stopped_early and state.last_eval_step != state.step:
        validation(ddp, state)  # the final weights are a candidate too
    state.seconds = time.perf_counter() - started


def _diverged_message(step: int, workdir: Path) -> str:
    checkpoint = latest_checkpoint(workdir)
    kept = (f"the last good checkpoint is {checkpoint} (continue from it with --resume)" if checkpoint
            else "no checkpoint was saved yet (set --save-every)")
    return (f"the loss became NaN or inf at step {step}; training stopped and {kept}; a lower --lr or "
            "--max-grad-norm usually helps (start over with --overwrite)")


def _broadcast(accelerator: Any, value: bool) -> bool:
    """The main process's decision, on every process."""
    if accelerator.num_processes == 1:
        return value
    from accelerate.utils import broadcast_object_list

    box = [value]
    broadcast_object_list(box, from_process=0)
    return bool(box[0])
