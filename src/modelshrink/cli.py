"""The `modelshrink` command: a root Typer app with one sub-command per step."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from modelshrink._version import __version__
from modelshrink.commands.contrastive import EPILOG as CONTRASTIVE_EPILOG, contrastive_command
from modelshrink.commands.distill import EPILOG as DISTILL_EPILOG, distill_command
from modelshrink.commands.eval import EPILOG as EVAL_EPILOG, eval_command
from modelshrink.commands.export import EPILOG as EXPORT_EPILOG, export_command
from modelshrink.commands.pseudolabel import EPILOG as PSEUDOLABEL_EPILOG, pseudolabel
from modelshrink.commands.quantize import EPILOG as QUANTIZE_EPILOG, quantize_command
from modelshrink.commands.quickstart import quickstart
from modelshrink.commands.run import RUN_EPILOG, RUN_SETTINGS, run_command

# Usage errors are one line (`Error: ...`), as every other error of the command line is; Typer calls this hook
# for every Click usage error, so the CLI and CliRunner alike print the line.
import typer.rich_utils  # noqa: E402

from modelshrink.commands._common import one_line_usage_error  # noqa: E402

typer.rich_utils.rich_format_error = one_line_usage_error

app = typer.Typer(
    name="modelshrink",
    help="Make transformer models small and fast while keeping their quality.\n\n"
         "Each step reads artifact folders and writes one; stdout carries only the output path, so steps "
         "chain:\n\n"
         "    pl=$(modelshrink pseudolabel runs/teacher train.jsonl -o runs/pl --lambda 2.0)",
    epilog="Example: `modelshrink quickstart` runs the end-to-end chain on the bundled sample, offline.",
    rich_markup_mode="markdown",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"modelshrink {__version__}")
        raise typer.Exit()


def _load_config(path: Path, group) -> dict:
    """A TOML recipe as Click's default_map: one table per command, keyed by option names as on the
    command line or in a manifest (`lambda`, `num-beams` or `num_beams`). The command line wins."""
    from modelshrink.commands._common import fail
    from modelshrink.commands._from_options import read_recipe, recipe_defaults

    default_map = {}
    for command_name, section in read_recipe(path).items():
        command = group.commands.get(command_name)
        if command is None or not isinstance(section, dict):
            raise fail(f"config {path}: [{command_name}] is not a modelshrink command; "
                       f"expected one of {', '.join(sorted(group.commands))}")
        default_map[command_name] = recipe_defaults(command, command_name, section, str(path))
    return default_map


@app.callback()
def root(
    ctx: typer.Context,
    config: Annotated[Optional[Path], typer.Option(
        "--config", "-c", exists=True, dir_okay=False,
        help="TOML recipe: a `[pseudolabel]` (etc.) table whose keys are that command's options; "
             "options given on the command line win.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show library warnings.")] = False,
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the version and exit.")] = None,
) -> None:
    if config is not None:
        ctx.default_map = _load_config(config, ctx.command)
    if not verbose:
        import os
        import warnings

        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        warnings.filterwarnings("ignore", category=UserWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)
        # the variable above is read when transformers is first imported, which may have happened
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()


app.command("pseudolabel", epilog=PSEUDOLABEL_EPILOG, no_args_is_help=True)(pseudolabel)
app.command("distill", epilog=DISTILL_EPILOG, no_args_is_help=True)(distill_command)
app.command("quantize", epilog=QUANTIZE_EPILOG, no_args_is_help=True)(quantize_command)
app.command("contrastive", epilog=CONTRASTIVE_EPILOG, no_args_is_help=True)(contrastive_command)
app.command("eval", epilog=EVAL_EPILOG, no_args_is_help=True)(eval_command)
app.command("export", epilog=EXPORT_EPILOG, no_args_is_help=True)(export_command)
app.command("run", epilog=RUN_EPILOG, **RUN_SETTINGS)(run_command)
app.command("quickstart")(quickstart)


def main() -> None:
    from modelshrink.commands._common import stop_on_sigterm

    stop_on_sigterm()
    succeeded = False
    try:
        app()
    except SystemExit as e:
        succeeded = e.code in (0, None)
        raise
    finally:
        _close_process_group(succeeded)


def _close_process_group(succeeded: bool) -> None:
    """Under a launcher, leave the process group before exiting: a gloo group torn down by the
    interpreter's exit instead could abort a process that had finished its work (seen as
    "terminate called without an active exception", SIGABRT, in a loaded CI run). After a success the
    processes first wait for each other, so that none tears down its connections while another still
    works alone (eval's latency measurement runs on the main process only: rank 1 aborted there once).

    destroy_process_group only drops the registry's reference: a DDP reducer left in a reference
    cycle still holds the group, and gloo's worker threads then die in the interpreter's
    finalization, which aborted rank 1 of a finished two-process `distill` once more. So the cycles
    are collected first, and a process that succeeded leaves without finalization (its artifact is
    written and its streams are flushed; nothing is left for exit handlers to do)."""
    import gc
    import os
    import sys

    if "torch.distributed" not in sys.modules:  # never import torch just to leave
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        gc.collect()
        if succeeded:
            try:
                dist.barrier()
            except Exception:  # a peer that failed: leave anyway, its own error is what the user needs
                pass
        dist.destroy_process_group()
        if succeeded:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


if __name__ == "__main__":
    main()
