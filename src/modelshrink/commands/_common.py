"""What every command shares: one-line errors and exit codes, the stderr console, progress bars."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

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


def main_process() -> bool:
    """Whether this is the process that speaks: the only one, or rank 0 under `accelerate launch`
    or `torchrun` (which set RANK)."""
    return os.environ.get("RANK", "0") == "0"


def emit(path: Path) -> None:
    """stdout carries only the output path, so steps chain with $(...); under a launcher only the
    main process prints it."""
    if main_process():
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
        if main_process():  # the other processes of a launch draw no bars
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if main_process():
            self.progress.stop()

    def task(self, label: str) -> Callable[[int, int], None]:
        task_id = None
        if not main_process():
            return lambda done, total: None

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
        if not main_process():
            return lambda entry: None

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
