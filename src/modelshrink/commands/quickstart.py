"""`modelshrink quickstart`: the end-to-end chain on the bundled sample, offline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from modelshrink.commands._common import DocsProgress, emit, handle_errors, log
from modelshrink.commands._from_options import OVERWRITE, QUIET, from_options, param
from modelshrink.options.quickstart import QuickstartOptions

OUTPUT = param("output", Annotated[Path, typer.Option("--output", "-o", help="Folder for the chain's artifacts.")],
               Path("modelshrink-quickstart"))


@from_options(QuickstartOptions, extra=[OUTPUT, OVERWRITE, QUIET])
def quickstart(options: QuickstartOptions, output: Path, overwrite: bool, quiet: bool) -> None:
    """Run the whole chain on the bundled Debian sample with the packaged MiniLM, offline (~15 min on 2 cores).

    Fine-tune a bert2bert teacher warm-started from MiniLM-L6; pseudo-label training documents at
    λ = 1 and λ = 2; distill a 6-2 student on each; quantize the λ = 2 student to 8-8-8 and 2-2-8
    (DQ-BART, distillation-aware); evaluate them all side by side (ROUGE with intervals, the λ = 2
    student tested against the λ = 1 one, size on disk and latency); export the best compressed
    student to ONNX and summarize a few documents with the torch-free runtime.

    Example: modelshrink quickstart -o runs/quickstart --overwrite
    """
    from modelshrink.quickstart import render_table, run_quickstart, table_rows

    with handle_errors(output), DocsProgress(quiet) as bars:
        summary = run_quickstart(options, output, overwrite=overwrite, progress=bars.task,
                                 train_progress=bars.train_task, log=log)
    # README's table, in README's format (* = significantly different from the teacher, p < 0.05)
    typer.echo(render_table(table_rows(summary["comparison"])), err=True)
    export = summary["export"]
    typer.echo(f"export ({export['check']}): {export['folder']}  serve it: modelshrink run {export['folder']} "
               "--input documents.jsonl", err=True)
    emit(Path(output))
