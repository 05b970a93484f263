"""`modelshrink quickstart`: the end-to-end chain on the bundled sample, offline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from modelshrink.commands._common import DocsProgress, emit, handle_errors, log, print_comparison


def quickstart(
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for the chain's artifacts.")] = Path(
        "modelshrink-quickstart"),
    teacher_steps: Annotated[int, typer.Option(help="Fine-tuning steps of the teacher.", min=1)] = 300,
    student_steps: Annotated[int, typer.Option(help="Training steps of each student.", min=1)] = 60,
    quantize_steps: Annotated[int, typer.Option(help="Distillation-aware quantization steps (8-8-8, 2-2-8).",
                                                min=1)] = 30,
    pseudolabel_docs: Annotated[int, typer.Option(help="Training documents the teacher labels.", min=1)] = 400,
    eval_docs: Annotated[int, typer.Option(help="Validation documents scored.", min=1)] = 100,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output folder.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars or lines.")] = False,
) -> None:
    """Run the whole chain on the bundled Debian sample with the packaged MiniLM, offline (~15 min on 2 cores).

    Fine-tune a bert2bert teacher warm-started from MiniLM-L6; pseudo-label training documents at
    λ = 1 and λ = 2; distill a 6-2 student on each; quantize the λ = 2 student to 8-8-8 and 2-2-8
    (DQ-BART, distillation-aware); evaluate them all side by side (ROUGE with intervals, the λ = 2
    student tested against the λ = 1 one, size on disk and latency); export the best compressed
    student to ONNX and summarize a few documents with the torch-free runtime.

    Example: modelshrink quickstart -o runs/quickstart --overwrite
    """
    from modelshrink.quickstart import QuickstartBudget, run_quickstart

    budget = QuickstartBudget(teacher_steps=teacher_steps, student_steps=student_steps, quantize_steps=quantize_steps,
                              pseudolabel_docs=pseudolabel_docs, eval_docs=eval_docs)
    with handle_errors(output), DocsProgress(quiet) as bars:
        summary = run_quickstart(output, budget=budget, overwrite=overwrite, progress=bars.task,
                                 train_progress=bars.train_task, log=log)
    print_comparison(summary["comparison"])
    emit(Path(output))
