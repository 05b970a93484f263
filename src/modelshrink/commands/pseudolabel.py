"""`modelshrink pseudolabel`: teacher pseudo-labels with PLATE attention temperature."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from modelshrink.commands._common import (GEN_PANEL as GEN, SPLITS, DocsProgress, LengthPenalty, MaxLength,
                                         MaxSourceLength, MinLength, NoRepeatNgramSize, NumBeams, emit,
                                         handle_errors, log)

EPILOG = """\
**Examples**

Regular pseudo labels, then PLATE with λ = 2 (the paper's best fixed value):

    modelshrink pseudolabel runs/teacher train.jsonl -o runs/pl-regular
    modelshrink pseudolabel runs/teacher train.jsonl -o runs/pl-lambda2 --lambda 2.0

λ ~ U[1, 2] drawn per document (recorded in each row); cross attention alone at 2.0:

    modelshrink pseudolabel runs/teacher train.jsonl -o runs/pl-rnd --lambda-range 1 2
    modelshrink pseudolabel runs/teacher train.jsonl -o runs/pl-cross --lambda-cross 2.0

Continue an interrupted run (same options):

    modelshrink pseudolabel runs/teacher train.jsonl -o runs/pl-lambda2 --lambda 2.0 --resume
"""

PLATE = "Attention temperature (PLATE)"
BASE = "Baselines (PLATE Table 5, Appendix C)"
DATA = "Data"


def pseudolabel(
    teacher: Annotated[str, typer.Argument(help="Teacher: a save_pretrained folder, a modelshrink model artifact, "
                                                "or a hub name present in the local cache.")],
    data: Annotated[str, typer.Argument(help="Documents: .jsonl[.gz], .csv, .parquet, a datasets folder, a "
                                             "modelshrink dataset artifact, or a cached hub dataset.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to write the dataset artifact to.")],
    lam: Annotated[Optional[float], typer.Option(
        "--lambda", help="λ for every attention module: τ = sqrt(λ·d), logits / sqrt(λ). The paper uses 1.5 or "
                         "2.0. [default: 1.0]", rich_help_panel=PLATE)] = None,
    lambda_enc: Annotated[Optional[float], typer.Option(help="λ for encoder self-attention only (Table 4).",
                                                        rich_help_panel=PLATE)] = None,
    lambda_dec: Annotated[Optional[float], typer.Option(help="λ for decoder self-attention only.",
                                                        rich_help_panel=PLATE)] = None,
    lambda_cross: Annotated[Optional[float], typer.Option(help="λ for decoder cross-attention only.",
                                                          rich_help_panel=PLATE)] = None,
    lambda_range: Annotated[Optional[tuple[float, float]], typer.Option(
        metavar="A B", help="Draw λ ~ U[A, B] per document (seeded, recorded per row); the paper uses 1 2.",
        rich_help_panel=PLATE)] = None,
    num_beams: NumBeams = None,
    length_penalty: LengthPenalty = None,
    min_length: MinLength = None,
    max_length: MaxLength = None,
    no_repeat_ngram_size: NoRepeatNgramSize = None,
    max_source_length: MaxSourceLength = None,
    batch_size: Annotated[int, typer.Option(help="Documents per batch (sorted by length).",
                                            rich_help_panel=GEN)] = 16,
    seed: Annotated[int, typer.Option(help="Seed for --lambda-range draws and sampling.",
                                      rich_help_panel=GEN)] = 0,
    output_temperature: Annotated[Optional[float], typer.Option(
        help="Temperature T of the final softmax instead of the attention (Appendix C; the paper tries 0.5-2.0).",
        rich_help_panel=BASE)] = None,
    do_sample: Annotated[bool, typer.Option(help="Sample instead of beam search (one beam, full distribution "
                                                 "unless --top-p/--top-k).", rich_help_panel=BASE)] = False,
    top_p: Annotated[Optional[float], typer.Option(help="Nucleus sampling mass (with --do-sample).",
                                                   rich_help_panel=BASE)] = None,
    top_k: Annotated[Optional[int], typer.Option(help="Top-k sampling (with --do-sample).",
                                                 rich_help_panel=BASE)] = None,
    split: Annotated[Optional[str], typer.Option(
        help=f"Split of {SPLITS}.", rich_help_panel=DATA)] = None,
    text_column: Annotated[Optional[str], typer.Option(
        help="Document column. [default: auto: document/summary, article/highlights, dialogue/summary, "
             "text/summary]", rich_help_panel=DATA)] = None,
    summary_column: Annotated[Optional[str], typer.Option(
        help="Gold summary column, copied to `reference`. [default: auto]", rich_help_panel=DATA)] = None,
    id_column: Annotated[Optional[str], typer.Option(help="Row id column. [default: id if present, else the row "
                                                          "number]", rich_help_panel=DATA)] = None,
    limit: Annotated[Optional[int], typer.Option(help="Use only the first N documents.",
                                                 rich_help_panel=DATA)] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N, or auto.")] = "auto",
    resume: Annotated[bool, typer.Option(help="Continue an interrupted run into the same output.")] = False,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output.")] = False,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow the teacher's own code from the hub.")] = False,
) -> None:
    """Label documents with a teacher's summaries, optionally at a higher attention temperature (PLATE).

    Writes a dataset artifact whose data.jsonl rows are id, document, summary (the pseudo summary),
    reference (the gold summary, when the input has one) and lambda, in input order; it feeds
    `modelshrink distill` directly. The temperature is folded into the query projections, so a
    fixed λ costs nothing at run time; the teacher on disk is never changed.
    """
    from modelshrink.pseudolabel import PseudolabelOptions, pseudolabel as run

    with handle_errors(resume_hint="Run the same command with --resume to continue."):
        options = PseudolabelOptions(
            teacher=teacher, data=data, split=split, text_column=text_column, summary_column=summary_column,
            id_column=id_column, limit=limit, lam=lam, lambda_enc=lambda_enc, lambda_dec=lambda_dec,
            lambda_cross=lambda_cross, lambda_range=lambda_range, num_beams=num_beams,
            length_penalty=length_penalty, min_length=min_length, max_length=max_length,
            no_repeat_ngram_size=no_repeat_ngram_size, max_source_length=max_source_length, batch_size=batch_size,
            seed=seed, output_temperature=output_temperature, do_sample=do_sample, top_p=top_p, top_k=top_k,
            device=device, trust_remote_code=trust_remote_code)
        with DocsProgress() as bars:
            path = run(options, output, overwrite=overwrite, resume=resume, progress=bars.task("pseudolabel"),
                       log=log)
    emit(path)
