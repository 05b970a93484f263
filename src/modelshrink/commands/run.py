"""`modelshrink run`: the torch-free runtime's own command line (`python -m modelshrink.runtime`).

The command declares no options of its own: it hands its arguments to `modelshrink.runtime.cli.main`, so
the two cannot drift, and `modelshrink run --help` is the runtime's help.
"""

from __future__ import annotations

import typer

RUN_EPILOG = """\
**Examples**

    modelshrink run runs/student-onnx --input docs.jsonl > summaries.jsonl
    modelshrink run runs/student-onnx --input docs.jsonl --num-beams 1 --limit 5
    python -m modelshrink.runtime runs/student-onnx --input docs.jsonl   # the same, importing no torch
"""
# Click passes every argument through (options included) and leaves --help to the runtime's argparse.
RUN_SETTINGS = {"context_settings": {"allow_extra_args": True, "ignore_unknown_options": True},
                "add_help_option": False}


def run_command(ctx: typer.Context) -> None:
    """Summarize or classify JSON lines with an export folder; one {"id", "prediction"} per line on stdout.
    Imports no torch. `modelshrink run --help` lists the options."""
    from modelshrink.runtime.cli import main

    code = main(list(ctx.args), prog="modelshrink run")
    if code:
        raise typer.Exit(code)
