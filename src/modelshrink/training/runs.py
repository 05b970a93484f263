"""The lifecycle of a step that trains: `TrainingRun`, which distill, quantize and contrastive drive alike.

    run = TrainingRun("distill", options, output, overwrite=overwrite, resume=resume, log=log)
    if run.finished():                 # --resume of a complete artifact: nothing to do
        return run.output
    accelerator = run.start(device)    # the accelerator and the artifact writer; every process checks the output
    ... build the model(s) ...
    staging = run.open(parents)        # the staging folder, the run's options and parents pinned
    result = train(..., save_best=save_best_with(save), ...)
    if not run.main:
        return run.output
    run.keep_best(result, save_final)  # the best validated weights, or the final ones
    ... metrics (which may read the weights now in staging) and the card ...
    return run.commit(result, metrics=..., card=..., resolved=..., metric=...)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

# A resumed run may extend its budget or change how often it logs, validates and saves, and how
# many checkpoints it keeps. Gradient checkpointing changes memory and time, not results.
MAY_CHANGE_ON_RESUME = ("max_steps", "epochs", "eval_every", "save_every", "save_total_limit", "log_every", "device",
                        "early_stopping", "gradient_checkpointing", "report_to", "tracking_dir")


# Options that say where and how a run goes, not what it makes: a finished artifact asked to resume with
# other values of these is still the artifact that was asked for.
NO_EFFECT_ON_RESULT = ("device", "save_every", "save_total_limit", "log_every", "gradient_checkpointing", "report_to",
                       "tracking_dir")


def finished(output: str | Path, *, overwrite: bool, resume: bool, log: Callable[[str], None],
             recorded: dict[str, Any] | None = None) -> bool:
    """Whether `--resume` was asked of an output that is already complete (then the step does nothing).
    With `recorded` (the options as the manifest records them), a complete output made with other options
    is refused, naming them: --resume keeps it as it is, which is not what those options ask for."""
    from modelshrink.artifacts import read_manifest
    from modelshrink.errors import UserError

    manifest = read_manifest(output) if resume and not overwrite else None
    if manifest is None:
        return False
    if recorded is not None:
        before = manifest.get("options", {})
        differ = [k for k in recorded if k in before and k not in NO_EFFECT_ON_RESULT and before[k] != recorded[k]]
        if differ:
            said = ", ".join(f"--{k.replace('_', '-')} {before[k]!r} (now {recorded[k]!r})" for k in differ)
            raise UserError(f"{output} is complete and was made with other options: {said}; --resume keeps a "
                            "complete artifact as it is: repeat its options, or pass --overwrite to make it again")
    log(f"{output} is already complete; nothing to resume")
    for role, path in changed_parents(manifest):
        log(f"warning: {output} was made from an earlier {path} ({role}), which has been made again since; "
            f"it is kept as it is: pass --overwrite instead of --resume to remake it from the new one")
    return True


def changed_parents(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, path) of each artifact parent whose manifest is no longer the one this artifact was made
    from (the parent was remade since). Data files are not hashed again here: they can be large."""
    from modelshrink.artifacts import MANIFEST_NAME, sha256_file

    changed = []
    for parent in manifest.get("parents", []):
        recorded, path = parent.get("manifest_sha256"), parent.get("path")
        current = Path(path) / MANIFEST_NAME if path else None
        if recorded and current is not None and current.is_file() and sha256_file(current) != recorded:
            changed.append((parent.get("role", "parent"), path))
    return changed


def parent_refs(*roles: tuple[str, str | None]) -> list[dict[str, Any]]:
    """The manifest's parents: one reference per (role, path or hub name) that was given."""
    from modelshrink.artifacts import parent_ref

    return [parent_ref(role, spec) for role, spec in roles if spec]


def start_run(output: Path, device: str, *, overwrite: bool, resume: bool, precision: str = "fp32",
              trackers: tuple[str, ...] = (), tracking_dir: str | None = None) -> tuple[Any, Any]:
    """The accelerator and the artifact writer of a step that trains, once every process has
    checked the output (before the main one creates the staging folder). `device` is the resolved
    one; a precision it cannot run (fp16 on a CPU) is refused here, before anything is written, and
    so are `trackers` that cannot start (`tracking.preflight`)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedDataParallelKwargs

    from modelshrink.artifacts import ArtifactWriter
    from modelshrink.precision import check_precision

    from modelshrink.training.tracking import preflight

    check_precision(precision, device)
    preflight(trackers, Path(tracking_dir) if tracking_dir else None)
    mixed = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[precision]
    # AcceleratorState is one per process and refuses to change its mixed precision; a process that
    # runs several steps (quickstart, the tests) starts it again. PartialState, which holds the
    # process group, stays.
    if AcceleratorState._shared_state.get("_mixed_precision", mixed) != mixed:
        AcceleratorState._reset_state()
    # Unused parameters (the BERT pooler of a bert2bert) would stop DDP without find_unused_parameters.
    accelerator = Accelerator(cpu=device == "cpu", mixed_precision=mixed,
                              kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    writer = ArtifactWriter(output, overwrite=overwrite, resume=resume, keep_on_failure=True)
    writer.check()
    accelerator.wait_for_everyone()
    return accelerator, writer


def open_run(accelerator: Any, writer: Any, recorded: dict[str, Any], parents: list[dict[str, Any]]) -> Path:
    """Create (or, resuming, check) the staging folder on the main process; every process gets its path.
    Every process checks a resumed run first, so a mismatch stops them all rather than leaving the
    others waiting for the main one."""
    from modelshrink.artifacts import check_run, pin_run

    if writer.resume and writer.staging.is_dir():
        check_run(writer.staging, recorded, parents, may_change=MAY_CHANGE_ON_RESUME)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        writer.open()
        pin_run(writer.staging, recorded, parents, may_change=MAY_CHANGE_ON_RESUME)
    accelerator.wait_for_everyone()
    return writer.staging


def keep_best(workdir: Path, result: Any, save_final: Callable[[Path], None]) -> None:
    """Leave in `workdir` the weights to publish: the best validated ones where validation saved
    them (`best/step-N`, N the best step), else the final ones (`save_final(folder)`); then drop the
    training leftovers (best weights, checkpoints)."""
    from modelshrink.artifacts import RUN_FILE
    from modelshrink.training.checkpoints import best_folder

    best = best_folder(workdir, result.best["step"]) if result is not None and result.best is not None else None
    if best is not None and best.is_dir():
        for f in best.iterdir():
            shutil.move(str(f), workdir / f.name)
    else:
        save_final(workdir)
    for leftover in ("best", "checkpoints"):
        shutil.rmtree(workdir / leftover, ignore_errors=True)
    (workdir / RUN_FILE).unlink(missing_ok=True)


def save_best_with(save: Callable[[Any, Path], None]) -> Callable[[Any, Path], None]:
    """The loop's `save_best`: replace `folder` with the model as `save(model, folder)` writes it."""
    def save_best(model: Any, folder: Path) -> None:
        shutil.rmtree(folder, ignore_errors=True)
        save(model, folder)

    return save_best


def write_validation(folder: Path, result: Any, metric: str) -> dict[str, Any] | None:
    """`validation.json`, one schema for every step: {"step": best step, "metric": the metric that
    chose it, then every validation metric at that step}. Returns what it wrote (None without validation)."""
    if result is None or result.best is None or result.validation is None:
        return None
    record = {"step": result.best["step"], "metric": metric, **result.validation}
    (folder / "validation.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def training_metrics(result: Any) -> dict[str, Any]:
    """What a manifest records of a training run."""
    metrics = {"steps": result.steps, "epochs": result.epochs, "train_tokens": result.train_tokens,
               "train_seconds": result.seconds, "tokens_per_second": result.tokens_per_second,
               "final_loss": result.final_loss}
    if result.best is not None and result.validation is not None:
        metrics["validation"] = {"step": result.best["step"], **result.validation}
    return metrics


def reproduce_section(options: Any, output: str | Path, parents: list[dict[str, Any]] | None = None,
                      always: tuple[str, ...] = ()) -> list[str]:
    """A model card's closing lines: the command that repeats this run (its own step), then where
    its inputs came from."""
    lines = ["", "## Reproduce", "", "```bash", options.replay(output, always=always), "```"]
    if parents:
        lines += ["", "## Lineage", ""]
        for p in parents:
            pin = p.get("manifest_sha256") or p.get("sha256")
            lines.append(f"- {p['role']}: `{p.get('path') or p.get('hub')}`" + (f" (sha256 {pin[:12]}…)" if pin else ""))
    return lines


class TrainingRun:
    """One run of a step that trains, from the output's check to the committed artifact (see the module's
    docstring for the order of the calls); the step builds its models and calls `train` between `open` and
    `keep_best`. `staging` is known from `start` on (a resumed run reads what it left there before `open`)."""

    def __init__(self, step: str, options: Any, output: str | Path, *, overwrite: bool = False, resume: bool = False,
                 log: Callable[[str], None] = lambda m: None):
        self.step, self.options, self.output = step, options, Path(output)
        self.overwrite, self.resume, self.log = overwrite, resume, log
        self.accelerator: Any = None
        self.writer: Any = None
        self.parents: list[dict[str, Any]] = []

    def finished(self) -> bool:
        return finished(self.output, overwrite=self.overwrite, resume=self.resume, log=self.log,
                        recorded=self.options.recorded())

    def start(self, device: str) -> Any:
        self.accelerator, self.writer = start_run(self.output, device, overwrite=self.overwrite, resume=self.resume,
                                                  precision=self.options.precision, trackers=self.options.trackers,
                                                  tracking_dir=self.options.tracking_dir)
        return self.accelerator

    @property
    def main(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def staging(self) -> Path:
        return self.writer.staging

    def open(self, parents: list[dict[str, Any]]) -> Path:
        self.parents = parents
        return open_run(self.accelerator, self.writer, self.options.recorded(), parents)

    def keep_best(self, result: Any, save_final: Callable[[Path], None]) -> None:
        keep_best(self.staging, result, save_final)

    def commit(self, result: Any, *, metrics: dict[str, Any], card: str, resolved: dict[str, Any], metric: str,
               always: tuple[str, ...] = ()) -> Path:
        """validation.json, the card closed by its Reproduce and Lineage sections, the manifest with how the run
        trained (`run_facts`); the artifact committed, its path returned."""
        from modelshrink.cards import commit_model
        from modelshrink.training.loop import run_facts

        write_validation(self.staging, result, metric)
        closing = reproduce_section(self.options, self.output, self.parents, always=always)
        (self.staging / "README.md").write_text(card + "\n".join(closing) + "\n")
        return commit_model(self.writer, step=self.step, options=self.options.recorded(), parents=self.parents,
                            metrics=metrics, resolved={**resolved, **run_facts(self.accelerator, self.options)})
