"""The `modelshrink` command: a root Typer app with one sub-command per step."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from modelshrink import __version__
from modelshrink.commands.pseudolabel import EPILOG as PSEUDOLABEL_EPILOG, pseudolabel
from modelshrink.commands.quickstart import quickstart

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


def _load_config(path: Path) -> dict:
    import tomllib

    from modelshrink.commands._common import fail

    try:
        table = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise fail(f"cannot read config {path}: {e}") from None
    # Keys are the command-line option names with dashes or underscores; the command line wins.
    return {command: {key.replace("-", "_"): value for key, value in section.items()}
            for command, section in table.items() if isinstance(section, dict)}


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
        ctx.default_map = _load_config(config)
    if not verbose:
        import os
        import warnings

        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        warnings.filterwarnings("ignore", category=UserWarning)
        warnings.filterwarnings("ignore", category=FutureWarning)


app.command("pseudolabel", epilog=PSEUDOLABEL_EPILOG, no_args_is_help=True)(pseudolabel)
app.command("quickstart")(quickstart)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
