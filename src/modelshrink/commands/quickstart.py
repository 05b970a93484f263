"""`modelshrink quickstart`: the end-to-end chain on the bundled sample, offline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from modelshrink.commands._common import DocsProgress, emit, handle_errors, log


def quickstart(
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for the chain's artifacts.")] = Path(
        "modelshrink-quickstart"),
    limit: Annotated[int, typer.Option(help="Documents of the bundled sample to pseudo-label.", min=1)] = 64,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output folder.")] = False,
) -> None:
    """Run the chain on the bundled Debian sample with the packaged MiniLM, offline.

    Today: warm-start a bert2bert teacher from MiniLM-L6, pseudo-label the sample at λ = 1 and λ = 2,
    and score both against the gold summaries with `eval`. The teacher is not fine-tuned until
    `distill` exists, so its summaries are noise; the run shows the artifacts, their manifests and
    the speed.

    Example: modelshrink quickstart -o runs/quickstart --overwrite
    """
    from rich.console import Console
    from rich.table import Table

    from modelshrink.quickstart import run_quickstart

    with handle_errors(), DocsProgress() as bars:
        summary = run_quickstart(output, limit=limit, overwrite=overwrite,
                                 progress=lambda label: bars.task(f"pseudolabel {label}"), log=log)
    table = Table(title="pseudo labels of the bundled sample (untrained teacher: expect ROUGE near 0)")
    for column in ("λ", "docs", "docs/s", "words", "ROUGE-1 (p vs first)", "ROUGE-2", "novel 1-grams %"):
        table.add_column(column)
    for run in summary["runs"].values():
        p = run["p_vs_first"]
        table.add_row(f"{run['lambda']:g}", str(run["documents"]), f"{run['docs_per_second']:.2f}",
                      f"{run['summary_words_mean']:.1f}",
                      f"{run['rouge1']:.2f}" + (f" (p={p['rouge1']:.2f})" if p else ""), f"{run['rouge2']:.2f}",
                      f"{run['novel_ngrams']['1']:.1f}")
    Console(stderr=True).print(table)
    emit(Path(output))
