"""Options of the shared training loop, for every step that trains (distill, quantize, contrastive)."""

from __future__ import annotations

from dataclasses import fields
from typing import ClassVar

from modelshrink.errors import UserError
from modelshrink.options import Options, opt, options_class
from modelshrink.precision import PRECISIONS

# name -> (module to import, what to install)
TRACKERS = {"tensorboard": ("tensorboard", "pip install tensorboard"),
            "wandb": ("wandb", "pip install wandb"),
            "mlflow": ("mlflow", "pip install mlflow-skinny (or mlflow)")}
NONE = "none"


def parse_report_to(value: str) -> tuple[str, ...]:
    """`--report-to`'s trackers ("tensorboard,mlflow" -> ("tensorboard", "mlflow"); "none" -> ()); a UserError
    names an unknown one or `none` among others."""
    names = [n.strip().lower() for n in str(value).split(",") if n.strip()]
    unknown = [n for n in names if n != NONE and n not in TRACKERS]
    if unknown:
        raise UserError(f"--report-to {value}: unknown tracker {', '.join(unknown)}; choose from "
                        f"{', '.join(TRACKERS)} (comma-separated) or {NONE}")
    if NONE in names and len(names) > 1:
        raise UserError(f"--report-to {value}: {NONE} cannot go with a tracker")
    return tuple(dict.fromkeys(n for n in names if n != NONE))


def check_installed(names: tuple[str, ...]) -> None:
    """One line naming the package to install for each tracker asked for that is not installed (no import)."""
    from importlib.util import find_spec

    for name in names:
        module, install = TRACKERS[name]
        if find_spec(module) is None:
            raise UserError(f"--report-to {name}: {module} is not installed; {install}")


DATA = "Data"
SPLITS = "a folder of split files, a datasets folder or a hub dataset"
OPT = "Optimization"
VAL = "Validation"
SPEED = "Precision and memory"
TRACK = "Experiment tracking"


# what only a run with --validation reads (a step's options may add --eval-limit and --validation-split)
VALIDATION_ONLY = frozenset({"eval_every", "metric", "early_stopping", "eval_limit", "validation_split"})


@options_class
class TrainOptions(Options):
    """Training options shared by every step that trains (the steps' options extend these)."""

    GOES_WITH: ClassVar[dict[str, str]] = {"tracking_dir": "report_to",
                                           **{name: "validation" for name in VALIDATION_ONLY}}
    # --batch-size left out: this many examples a micro-batch on a CPU; on a GPU, --max-tokens GPU_MAX_TOKENS
    # instead (options/batching.py)
    BATCH_SIZE: ClassVar[int] = 16
    GPU_MAX_TOKENS: ClassVar[int | None] = 4096

    lr: float = opt(5e-5, "Peak learning rate (AdamW).", panel=OPT, above=0)
    beta1: float = opt(0.9, "AdamW β1.", panel=OPT, min=0, below=1)
    beta2: float = opt(0.999, "AdamW β2.", panel=OPT, min=0, below=1)
    eps: float = opt(1e-8, "AdamW ε.", panel=OPT, above=0)
    weight_decay: float = opt(0.01, "AdamW weight decay (not on biases and norms).", panel=OPT, min=0)
    warmup_steps: int | None = opt(None, "Linear warmup steps. [default: from --warmup-ratio]", panel=OPT, min=0)
    warmup_ratio: float = opt(0.0, "Warmup as a share of all steps.", panel=OPT, min=0, below=1)
    max_grad_norm: float = opt(1.0, "Gradient clipping (0 = off).", panel=OPT, min=0)
    grad_accum: int = opt(1, "Gradient accumulation steps.", panel=OPT, min=1)
    batch_size: int | None = opt(None, "Examples per batch and process. [default: 16; on a GPU, --max-tokens 4096 "
                                       "instead]", panel=OPT, min=1)
    max_tokens: int | None = opt(None, "Batch by a padded-token budget instead of a count: length-sorted examples "
                                       "packed up to N source tokens a micro-batch (longest × count). [default: "
                                       "4096 on a GPU unless --batch-size is given; none on a CPU]", panel=OPT,
                                 min=1)
    max_steps: int | None = opt(None, "Optimizer steps; 0 writes the initialized model untrained.", panel=OPT, min=0)
    epochs: float | None = opt(None, "Epochs (when --max-steps is not given).", panel=OPT, above=0)
    seed: int = opt(0, "Seed of data order, dropout and new weights.", panel=OPT)
    log_every: int = opt(10, "Write train_log.jsonl every N steps.", panel=OPT, min=1)
    save_every: int | None = opt(None, "Checkpoint every N steps (for --resume).", panel=OPT, min=1)
    save_total_limit: int = opt(2, "Keep only the newest N checkpoints (the best weights are kept apart); all are "
                                   "deleted when the run finishes.", panel=OPT, min=1)
    eval_every: int | None = opt(None, "Validate every N steps (and at the end).", panel=VAL, min=1)
    metric: str = opt("rouge2", "Keep the checkpoint best by this.", panel=VAL)
    early_stopping: int | None = opt(None, "Stop after N validations without improvement.", panel=VAL, min=1)
    device: str = opt("auto", "cpu, cuda, or auto (under accelerate launch, its choice).")
    precision: str = opt("fp32", "Mixed precision: fp32, bf16 (GPU or CPU) or fp16 (GPU, with loss scaling). The "
                                 "student keeps float32 weights; the teacher runs in this precision.", panel=SPEED,
                         choices=PRECISIONS)
    gradient_checkpointing: bool = opt(False, "Recompute activations in the backward pass: less memory, about a "
                                              "third more time.", panel=SPEED)
    compile: bool = opt(False, "torch.compile the training step's forward pass and loss (the backward is compiled "
                               "with it): a graph per batch shape, then shapes marked dynamic; the first steps "
                               "pay the compilation. Off by default: it pays on a GPU with few shapes, rarely on "
                               "a CPU.", panel=SPEED)
    report_to: str = opt("none", "Send train_log.jsonl's numbers and the options to trackers: tensorboard, wandb, "
                                 "mlflow (comma-separated) or none. Offline, into the artifact's runs/ (wandb "
                                 "offline unless WANDB_MODE=online; MLflow's file store unless "
                                 "MLFLOW_TRACKING_URI is set).", panel=TRACK, metavar="TRACKERS")
    tracking_dir: str | None = opt(None, "Where the trackers write. [default: the artifact's runs/]", panel=TRACK,
                                   metavar="DIR")

    def check(self) -> None:
        if self.max_steps is None and self.epochs is None:
            raise UserError("give a budget: --max-steps N or --epochs N")
        check_installed(parse_report_to(self.report_to))

    @property
    def trackers(self) -> tuple[str, ...]:
        """--report-to's trackers (() for none)."""
        return parse_report_to(self.report_to)

    def train_options(self) -> "TrainOptions":
        """The TrainOptions part of a step's options (which extend these)."""
        names = {f.name for f in fields(TrainOptions)}
        return TrainOptions(**{f.name: getattr(self, f.name) for f in fields(self) if f.name in names})
