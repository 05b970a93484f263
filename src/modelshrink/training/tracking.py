"""Experiment trackers fed by the training loop: TensorBoard, Weights & Biases and MLflow, through accelerate's
tracker classes.

`--report-to tensorboard,mlflow` (any of `options.train.TRACKERS`, or `none`) on every step that trains sends each line the
loop writes to `train_log.jsonl` to the trackers as well: a training line's numbers as `train/<name>` (the loss
and each of its terms, `lr`, `tokens_per_s`, `tokens`, `seconds`, `epoch`), a validation line's as
`validation/<name>` (every metric and `best_step`), at the line's optimizer step. The run's options (the
manifest's `options`) are the hyper-parameters. Only the main process reports.

Offline by default, into the artifact's `runs/` (or `--tracking-dir`): TensorBoard's event files in
`runs/<artifact name>/`, MLflow's file store in `runs/mlruns` unless `MLFLOW_TRACKING_URI` names another,
wandb in offline mode (`wandb sync` uploads it later) unless `WANDB_MODE=online`.

`preflight` runs before any model loads and refuses, in one line, what cannot start (a tracker that is not
installed, a folder that cannot be written, wandb online with no way to reach its server); once training
runs, a tracker that fails warns once and is dropped, and the run goes on.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse

from modelshrink.errors import UserError

from modelshrink.options.train import check_installed

# keys of a train_log.jsonl line that are no scalar of their own
NOT_SCALARS = ("step", "event")


def _check_writable(folder: Path, what: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".modelshrink-write-check"):
            pass
    except OSError as e:
        raise UserError(f"{what}: cannot write to {folder} ({e.strerror or e}); choose a writable --tracking-dir")


def _wandb_mode() -> str:
    return os.environ.get("WANDB_MODE", "offline").lower()


def _reachable(url: str, timeout: float = 3.0) -> bool:
    parsed = urlparse(url)
    host, port = parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)
    if not host:
        return False
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def preflight(names: tuple[str, ...], folder: Path | None) -> None:
    """Everything a tracker needs that can be checked before the run loads a model: the package, a writable
    folder (`folder`, when it is not inside the artifact, which the artifact's own checks cover), MLflow's
    store when `MLFLOW_TRACKING_URI` is a local path, and wandb's server when it is to log online."""
    check_installed(names)
    if folder is not None and names:
        _check_writable(folder, f"--report-to {','.join(names)}")
    if "mlflow" in names:
        uri = os.environ.get("MLFLOW_TRACKING_URI", "")
        if uri.startswith("file:") or (uri and "://" not in uri):
            _check_writable(Path(urlparse(uri).path if uri.startswith("file:") else uri),
                            "--report-to mlflow (MLFLOW_TRACKING_URI)")
    if "wandb" in names and _wandb_mode() == "online":
        base = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
        if not _reachable(base):
            raise UserError(f"--report-to wandb: WANDB_MODE=online but {base} cannot be reached; unset WANDB_MODE "
                            "to log offline (then `wandb sync` the run's folder)")


def hyperparameters(options: dict[str, Any]) -> dict[str, bool | int | float | str]:
    """The run's options as plain values every tracker takes (None as "none", lists comma-joined)."""
    out: dict[str, bool | int | float | str] = {}
    for key, value in options.items():
        if value is None:
            out[key] = "none"
        elif isinstance(value, (list, tuple)):
            out[key] = ",".join(map(str, value))
        elif isinstance(value, (bool, int, float, str)):
            out[key] = value
        else:
            out[key] = str(value)
    return out


def scalars(entry: dict[str, Any]) -> dict[str, float]:
    """A train_log.jsonl line as the trackers' scalars: `train/<key>` or, for a validation line, `validation/<key>`."""
    prefix = "validation" if entry.get("event") == "validation" else "train"
    return {f"{prefix}/{k}": float(v) for k, v in entry.items()
            if k not in NOT_SCALARS and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _make(name: str, run_name: str, folder: Path, resumed_at: int | None) -> Any:
    if name == "tensorboard":
        from accelerate.tracking import TensorBoardTracker

        # a resumed run drops what the killed one logged after its checkpoint (it logs those steps again)
        kwargs = {"purge_step": resumed_at + 1} if resumed_at is not None else {}
        return TensorBoardTracker(run_name, str(folder), **kwargs)
    if name == "mlflow":
        import mlflow
        from accelerate.tracking import MLflowTracker

        if not os.environ.get("MLFLOW_TRACKING_URI"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store opt-in
            mlflow.set_tracking_uri((folder / "mlruns").resolve().as_uri())
        return MLflowTracker(experiment_name=os.environ.get("MLFLOW_EXPERIMENT_NAME", "modelshrink"),
                             run_name=run_name)
    if name == "wandb":
        from accelerate.tracking import WandBTracker

        return WandBTracker(os.environ.get("WANDB_PROJECT", "modelshrink"), name=run_name, dir=str(folder),
                            mode=_wandb_mode())
    raise ValueError(name)


class Trackers:
    """The trackers of one run on the main process. `log` and `finish` never raise: a tracker that fails
    warns once (through `warn`) and is dropped."""

    def __init__(self, names: tuple[str, ...], folder: Path, run_name: str, hparams: dict[str, Any], *,
                 resumed_at: int | None = None, warn: Callable[[str], None] = print):
        self.warn = warn
        self.active: dict[str, Any] = {}
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            try:
                tracker = _make(name, run_name, folder, resumed_at)
                tracker.start()
                tracker.store_init_configuration(hyperparameters(hparams))
            except Exception as e:  # checked by preflight; the run still goes on without it
                self.warn(f"warning: --report-to {name} did not start ({type(e).__name__}: {e}); "
                          "training goes on without it")
                continue
            self.active[name] = tracker

    def log(self, entry: dict[str, Any]) -> None:
        values = scalars(entry)
        for name, tracker in list(self.active.items()):
            try:
                tracker.log(values, step=int(entry["step"]))
            except Exception as e:
                self._drop(name, f"failed at step {entry['step']} ({type(e).__name__}: {e})")

    def finish(self) -> None:
        for name, tracker in list(self.active.items()):
            try:
                tracker.finish()
            except Exception as e:
                self._drop(name, f"did not finish ({type(e).__name__}: {e})")
        self.active.clear()

    def _drop(self, name: str, what: str) -> None:
        self.active.pop(name, None)
        self.warn(f"warning: --report-to {name} {what}; training goes on without it")
