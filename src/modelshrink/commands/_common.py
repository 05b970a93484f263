"""What every command shares: one-line errors and exit codes, the stderr console, progress bars."""

from __future__ import annotations

import errno
import os
import shlex
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import typer

from modelshrink.errors import CheckFailed, UserError

EXIT_USER_ERROR = 1
EXIT_CHECK_FAILED = 3
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports it


class Terminated(KeyboardInterrupt):
    """SIGTERM (a batch scheduler's or `kill`'s stop) taken like Ctrl-C: the run stops where it is,
    keeps what it saved, and says how to continue."""


def stop_on_sigterm() -> None:
    """From now on SIGTERM raises `Terminated` in the main thread."""
    import signal
    import threading

    def terminate(signum: int, frame: object) -> None:
        raise Terminated()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, terminate)


def fail(message: str, code: int = EXIT_USER_ERROR) -> typer.Exit:
    # One line, whatever the message holds, so scripts can grep it.
    typer.echo("Error: " + " ".join(str(message).split()), err=True)
    return typer.Exit(code)


# errno values that mean "the output cannot take what is written": no space, quota, read-only
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS}
# ...and how libraries that wrap them (safetensors, torch's writers) spell them
_NO_SPACE = ("No space left on device", "StorageFull", "os error 28")


@contextmanager
def handle_errors(output: Path | None = None) -> Iterator[None]:
    """Turn library errors into exit codes: UserError -> 1, CheckFailed -> 3, Ctrl-C -> 130, SIGTERM
    -> 143, a full or read-only disk -> 1 (one line each). On Ctrl-C or a full disk the hint says what is
    left of the run writing `output` and the command that continues it, if there is one."""
    try:
        yield
    except UserError as e:
        raise fail(str(e)) from None
    except CheckFailed as e:
        if e.output:
            typer.echo(e.output)
        raise fail(str(e), EXIT_CHECK_FAILED) from None
    except KeyboardInterrupt as e:
        terminated = isinstance(e, Terminated)
        if main_process():
            typer.echo(("Terminated (SIGTERM). " if terminated else "Interrupted. ") + resume_hint(output), err=True)
        raise typer.Exit(EXIT_TERMINATED if terminated else EXIT_INTERRUPTED) from None
    except OSError as e:
        if e.errno not in _WRITE_ERRNOS:
            raise
        where = f" writing {e.filename}" if e.filename else ""
        raise fail(f"{e.strerror or e}{where}. {resume_hint(output)}") from None
    except RuntimeError as e:  # safetensors and torch wrap a full disk in their own errors
        if not any(marker in str(e) for marker in _NO_SPACE):
            raise
        raise fail(f"No space left on device: {str(e).splitlines()[0]}. {resume_hint(output)}") from None


def resume_hint(output: Path | None) -> str:
    """What an interrupted run left, said from what is on disk: the unfinished folder and the
    command that continues it (this command with --resume), or that nothing was kept."""
    if output is None:
        return ""
    from modelshrink.generation import shards
    from modelshrink.artifacts import staging_path
    from modelshrink.training.checkpoints import latest_checkpoint

    staging = staging_path(Path(output))
    if not staging.is_dir():
        return "Nothing was written."
    if latest_checkpoint(staging) is not None:
        saved = "from its last checkpoint"
    elif shards.has_rows(staging):
        saved = "keeping the rows already written"
    elif (staging / shards.PARTS).is_dir():
        saved = "(no row was finished yet)"
    else:
        saved = "from the start (no checkpoint was saved yet; --save-every N saves them)"
    argv = [a for a in sys.argv[1:] if a != "--overwrite"]
    command = shlex.join(["modelshrink", *argv, *([] if "--resume" in argv else ["--resume"])])
    launcher = " under the same launcher" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
    return f"The unfinished run is kept in {staging}; continue it {saved} with{launcher}: {command}"


def main_process() -> bool:
    """Whether this is the process that speaks: the only one, or rank 0 under `accelerate launch`
    or `torchrun` (which set RANK)."""
    return os.environ.get("RANK", "0") == "0"


def emit(path: Path) -> None:
    """stdout carries only the output path, so steps chain with $(...); under a launcher only the
    main process prints it."""
    if main_process():
        typer.echo(str(path))


def progress_seconds() -> float:
    """How often a non-terminal gets a progress line (MODELSHRINK_PROGRESS_SECONDS, default 30)."""
    try:
        return max(0.0, float(os.environ.get("MODELSHRINK_PROGRESS_SECONDS", "30")))
    except ValueError:
        return 30.0


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


class PlainLines:
    """Progress as plain lines for a stderr that is not a terminal (CI logs, `2> log`, nohup): the
    first update, then one line every `every` seconds, then the last one, each with done/total,
    rate and ETA. Rates count what was done in this run (not rows an earlier run left)."""

    def __init__(self, label: str, unit: str, every: float):
        self.label, self.unit, self.every = label, unit, every
        self.start: tuple[float, int] | None = None
        self.last_print = -float("inf")
        self.printed: int | None = None  # `done` of the last line

    def update(self, done: int, total: int, extra: str = "") -> None:
        now = time.monotonic()
        if self.start is None:
            self.start = (now, done)
        finished = done >= total
        if (not finished and now - self.last_print < self.every) or (finished and self.printed == done):
            return
        self.last_print, self.printed = now, done
        elapsed = now - self.start[0]
        rate = (done - self.start[1]) / elapsed if elapsed > 0 and done > self.start[1] else None
        parts = [f"{self.label}: {done}/{total}" + (f" {self.unit}" if self.unit else "")
                 + (f" ({100 * done / total:.0f}%)" if total else "")]
        if extra:
            parts.append(extra)
        if rate:
            parts.append(f"{rate:.2f} {self.unit or 'it'}/s")
            parts.append(f"elapsed {_duration(elapsed)}")
            parts.append("done" if finished else f"ETA {_duration((total - done) / rate)}")
        typer.echo(", ".join(parts), err=True)


class DocsProgress:
    """Progress on stderr: rich bars on a terminal, plain lines elsewhere (see `PlainLines`),
    nothing with `quiet` or on a process other than the main one. `task(label)` gives a library the
    (done, total) callback of a bar with documents/s and ETA; `train_task(label)` the callback of a
    training bar (step of total, loss, learning rate, tokens/s). One live display holds every bar."""

    def __init__(self, quiet: bool = False) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn

        self.mode = "none" if quiet or not main_process() else "bars" if sys.stderr.isatty() else "lines"
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=Console(file=sys.stderr))

    def __enter__(self) -> "DocsProgress":
        if self.mode == "bars":
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.mode == "bars":
            self.progress.stop()

    def task(self, label: str) -> Callable[[int, int], None]:
        if self.mode == "none":
            return lambda done, total: None
        if self.mode == "lines":
            return PlainLines(label, "docs", progress_seconds()).update
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
        if self.mode == "none":
            return lambda entry: None
        task_id = None
        lines = PlainLines(label, "steps", progress_seconds())

        def update(entry: dict) -> None:
            nonlocal task_id
            info = f"loss {entry.get('loss', float('nan')):.4f} lr {entry['lr']:.2e} {entry['tokens_per_s']:.0f} tok/s"
            if self.mode == "lines":
                lines.update(entry["step"], entry["total_steps"], info)
            elif task_id is None:
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


def print_comparison(result: dict[str, Any]) -> None:
    """eval --compare's table of systems on stderr (eval --compare and quickstart print it)."""
    from rich.table import Table

    from modelshrink.evaluation.compare import QUALITY

    keys = QUALITY[result["task"]]
    table = Table(title=f"compare ({result['significance']['method']} test against {result['significance']['against']};"
                        " * p < 0.05)")
    for column in ("system", *keys, "words", "params", "MB on disk", "p50 ms"):
        table.add_column(column, justify="right")
    for row in result["systems"]:
        cells = []
        name = row["name"].removeprefix("eval-")
        for key in keys:
            p = row["p_vs_first"].get(key, row["p_vs_first"].get("correct"))
            cells.append("-" if row[key] is None else f"{row[key]:.2f}{'*' if p is not None and p < 0.05 else ''}")
        table.add_row(name, *cells, "-" if row["length_words"] is None else f"{row['length_words']:.1f}",
                      "-" if row["parameters"] is None else f"{row['parameters']:,}",
                      "-" if row["bytes_on_disk"] is None else f"{row['bytes_on_disk'] / 1e6:.1f}",
                      "-" if row["latency_ms_p50"] is None else f"{row['latency_ms_p50']:.1f}")
    stderr_console().print(table)


def one_line_usage_error(error: Any) -> None:
    """A usage error (Click's: an unknown option, a value that does not parse, a missing argument or file) as
    one line on stderr naming the command to ask for help, instead of Typer's usage text and boxed message;
    the exit code stays Click's 2. A bare command with no arguments still shows its help."""
    if type(error).__name__ == "NoArgsIsHelpError":
        return
    ctx = getattr(error, "ctx", None)
    where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    typer.echo("Error: " + " ".join(error.format_message().split()) + where, err=True)
