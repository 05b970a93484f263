"""What every command shares: one-line errors and exit codes, the stderr console, progress bars."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Callable, Iterator, Optional

import typer

from modelshrink.errors import CheckFailed, UserError

EXIT_USER_ERROR = 1
EXIT_CHECK_FAILED = 3
EXIT_INTERRUPTED = 130


def fail(message: str, code: int = EXIT_USER_ERROR) -> typer.Exit:
    # One line, whatever the message holds, so scripts can grep it.
    typer.echo("Error: " + " ".join(str(message).split()), err=True)
    return typer.Exit(code)


@contextmanager
def handle_errors(resume_hint: str | None = None) -> Iterator[None]:
    """Turn library errors into exit codes: UserError -> 1, CheckFailed -> 3, Ctrl-C -> 130."""
    try:
        yield
    except UserError as e:
        raise fail(str(e)) from None
    except CheckFailed as e:
        if e.output:
            typer.echo(e.output)
        raise fail(str(e), EXIT_CHECK_FAILED) from None
    except KeyboardInterrupt:
        typer.echo("Interrupted." + (f" {resume_hint}" if resume_hint else ""), err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None


def parse_ids(value: Optional[str], flag: str) -> Optional[list[int]]:
    """Comma-separated layer numbers ("0,6,11") of a command-line option."""
    if value is None:
        return None
    try:
        return [int(x) for x in value.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise fail(f"{flag} takes comma-separated layer numbers such as 0,6,11; got {value}") from None


def emit(path: Path) -> None:
    """stdout carries only the output path, so steps chain with $(...)."""
    typer.echo(str(path))


class DocsProgress:
    """Rich progress bars on stderr. `task(label)` gives a library the (done, total) callback of a
    bar with documents/s and ETA; `train_task(label)` the callback of a training bar (step of total,
    loss, learning rate, tokens/s). One live display holds every bar of a command."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn

        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=Console(file=sys.stderr))

    def __enter__(self) -> "DocsProgress":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def task(self, label: str) -> Callable[[int, int], None]:
        task_id = None

        def update(done: int, total: int) -> None:
            nonlocal task_id
            if task_id is None:  # the first call brings the total (and rows done by an earlier run)
                task_id = self.progress.add_task(label, total=total, completed=done, info="")
                return
            self.progress.update(task_id, completed=done)
            speed = self.progress.tasks[task_id].speed
            if speed:
                self.progress.update(task_id, info=f"{speed:.2f} docs/s")

        return update

    def train_task(self, label: str) -> Callable[[dict], None]:
        task_id = None

        def update(entry: dict) -> None:
            nonlocal task_id
            info = f"loss {entry.get('loss', float('nan')):.4f} lr {entry['lr']:.2e} {entry['tokens_per_s']:.0f} tok/s"
            if task_id is None:
                task_id = self.progress.add_task(label, total=entry["total_steps"], completed=entry["step"], info=info)
            else:
                self.progress.update(task_id, completed=entry["step"], info=info)

        return update


def stderr_console():
    """A rich console on stderr; when stderr is not a terminal (CI logs, pipes) it is 160 columns
    wide instead of rich's 80, so tables are not cut."""
    from rich.console import Console

    return Console(file=sys.stderr, width=None if sys.stderr.isatty() else 160)


def log(message: str) -> None:
    typer.echo(message, err=True)


# Generation options shared by every command that generates; defaults come from the model's config.
GEN_PANEL = "Generation (defaults: the model's generation config)"
NumBeams = Annotated[Optional[int], typer.Option(help="Beam size.", rich_help_panel=GEN_PANEL)]
LengthPenalty = Annotated[Optional[float], typer.Option(help="Beam length penalty.", rich_help_panel=GEN_PANEL)]
MinLength = Annotated[Optional[int], typer.Option(help="Minimum summary length in tokens.",
                                                  rich_help_panel=GEN_PANEL)]
MaxLength = Annotated[Optional[int], typer.Option(help="Maximum summary length in tokens.",
                                                  rich_help_panel=GEN_PANEL)]
NoRepeatNgramSize = Annotated[Optional[int], typer.Option(help="Block repeated n-grams of this size.",
                                                          rich_help_panel=GEN_PANEL)]
MaxSourceLength = Annotated[Optional[int], typer.Option(
    help="Truncate documents to this many tokens. [default: the tokenizer's model_max_length]",
    rich_help_panel=GEN_PANEL)]

# The shared training loop's options, for every command that trains (help panel "Optimization").
DATA = "Data"
SPLITS = "a folder of split files, a datasets folder or a hub dataset"
Split = Annotated[Optional[str], typer.Option(help=f"Split of DATA ({SPLITS}).", rich_help_panel=DATA)]
ValidationSplit = Annotated[Optional[str], typer.Option(help="Split of --validation.", rich_help_panel=DATA)]
OPT = "Optimization"
MaxSteps = Annotated[Optional[int], typer.Option(help="Optimizer steps; 0 writes the initialized student untrained.",
                                                 rich_help_panel=OPT)]
Epochs = Annotated[Optional[float], typer.Option(help="Epochs (when --max-steps is not given).", rich_help_panel=OPT)]
Lr = Annotated[float, typer.Option(help="Peak learning rate (AdamW).", rich_help_panel=OPT)]
Beta1 = Annotated[float, typer.Option(help="AdamW β1.", rich_help_panel=OPT)]
Beta2 = Annotated[float, typer.Option(help="AdamW β2.", rich_help_panel=OPT)]
Eps = Annotated[float, typer.Option(help="AdamW ε.", rich_help_panel=OPT)]
WeightDecay = Annotated[float, typer.Option(help="AdamW weight decay (not on biases and norms).", rich_help_panel=OPT)]
WarmupSteps = Annotated[Optional[int], typer.Option(help="Linear warmup steps. [default: from --warmup-ratio]",
                                                    rich_help_panel=OPT)]
WarmupRatio = Annotated[float, typer.Option(help="Warmup as a share of all steps.", rich_help_panel=OPT)]
MaxGradNorm = Annotated[float, typer.Option(help="Gradient clipping (0 = off).", rich_help_panel=OPT)]
GradAccum = Annotated[int, typer.Option(help="Gradient accumulation steps.", rich_help_panel=OPT)]
MaxTokens = Annotated[Optional[int], typer.Option(help="Batch by a padded-token budget instead of a count.",
                                                  rich_help_panel=OPT)]
Seed = Annotated[int, typer.Option(help="Seed of data order, dropout and new weights.", rich_help_panel=OPT)]
LogEvery = Annotated[int, typer.Option(help="Write train_log.jsonl every N steps.", rich_help_panel=OPT)]
SaveEvery = Annotated[Optional[int], typer.Option(help="Checkpoint every N steps (for --resume).", rich_help_panel=OPT)]
VAL = "Validation"
EvalEvery = Annotated[Optional[int], typer.Option(help="Validate every N steps (and at the end).", rich_help_panel=VAL)]
EarlyStopping = Annotated[Optional[int], typer.Option(help="Stop after N validations without improvement.",
                                                      rich_help_panel=VAL)]
Device = Annotated[str, typer.Option(help="cpu, cuda, or auto (under accelerate launch, its choice).")]
Resume = Annotated[bool, typer.Option(help="Continue an interrupted run from its last checkpoint.")]
Overwrite = Annotated[bool, typer.Option(help="Replace an existing output.")]
TrustRemoteCode = Annotated[bool, typer.Option(help="Allow models' own code from the hub.")]
