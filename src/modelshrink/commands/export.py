"""`modelshrink export`: ONNX for deployment, validated; `modelshrink run`: the torch-free runtime."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from modelshrink.commands._common import emit, fail, handle_errors, log

EPILOG = """\
**Examples**

Export the compressed student (encoder, merged decoder; config, tokenizer, model card),
checked against PyTorch on documents from the validation set:

    modelshrink export runs/student -o runs/student-onnx --data valid.jsonl

int8 for CPU serving (onnxruntime dynamic quantization, one weight scale per output channel):

    modelshrink export runs/student -o runs/student-onnx-int8 --int8

A ternary `quantize` artifact keeps its integer weights (int8 initializers + DequantizeLinear):

    modelshrink export runs/student-228 -o runs/student-228-onnx

Then summarize without torch, or measure the deployed form with the same eval as every other model:

    modelshrink run runs/student-onnx --input docs.jsonl > summaries.jsonl
    modelshrink eval runs/student-onnx valid.jsonl -o runs/eval-student-onnx

Exit codes: 1 for a bad input (nothing written), 3 when the export was written but its outputs or
tokens differ from PyTorch's beyond the tolerance (see export_report.json in the folder).
"""

RUN_EPILOG = """\
**Examples**

    modelshrink run runs/student-onnx --input docs.jsonl > summaries.jsonl
    modelshrink run runs/student-onnx --input docs.jsonl --num-beams 1 --limit 5
    python -m modelshrink.runtime runs/student-onnx --input docs.jsonl   # the same, importing no torch
"""

CHECK = "Validation"


def export_command(
    model: Annotated[str, typer.Argument(help="A model artifact: seq2seq (also from quantize) or a sequence "
                                              "classifier.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to write the export to.")],
    opset: Annotated[int, typer.Option(help="ONNX opset, 14-20.")] = 17,
    int8: Annotated[bool, typer.Option("--int8", help="onnxruntime dynamic int8 quantization of the graphs.")] = False,
    per_channel: Annotated[Optional[bool], typer.Option(
        "--per-channel/--no-per-channel", help="With --int8: one weight scale per output channel (per tensor with "
                                               "--no-per-channel). [default: per channel]")] = None,
    merge: Annotated[bool, typer.Option(
        help="Seq2seq: one decoder_model_merged.onnx (an If between first step and steps with past, weights "
             "stored once) instead of decoder_model.onnx + decoder_with_past_model.onnx.")] = True,
    validate: Annotated[bool, typer.Option(help="Check outputs and generated tokens against PyTorch.",
                                           rich_help_panel=CHECK)] = True,
    atol: Annotated[Optional[float], typer.Option(
        help="Largest allowed absolute difference of any output (padded source positions are not compared). "
             "[default: 1e-4; with --int8, an RMS difference of a quarter of each output's RMS]",
        rich_help_panel=CHECK)] = None,
    data: Annotated[Optional[str], typer.Option(help="Documents to validate on. [default: made from the "
                                                     "tokenizer's vocabulary]", rich_help_panel=CHECK)] = None,
    text_column: Annotated[Optional[str], typer.Option(help="Document column of --data. [default: auto]",
                                                       rich_help_panel=CHECK)] = None,
    samples: Annotated[int, typer.Option(help="Documents whose outputs are compared.", rich_help_panel=CHECK)] = 4,
    generation_docs: Annotated[int, typer.Option(help="Documents summarized (greedy and beam) or classified by "
                                                      "both; 0 skips.", rich_help_panel=CHECK)] = 4,
    max_source_length: Annotated[Optional[int], typer.Option(
        help="Truncate documents to this many tokens. [default: the tokenizer's model_max_length]",
        rich_help_panel=CHECK)] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output.")] = False,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow the model's own code from the hub.")] = False,
) -> None:
    """Export a model to ONNX (Optimum's file layout), validate it against PyTorch, and write a folder
    that runs with onnxruntime, tokenizers and numpy alone (`modelshrink run`, `modelshrink.runtime`).
    """
    from modelshrink.export import ExportOptions, export_model

    with handle_errors():
        options = ExportOptions(model=model, opset=opset, int8=int8, per_channel=per_channel, validate=validate,
                                atol=atol, data=data, text_column=text_column, samples=samples,
                                generation_docs=generation_docs, max_source_length=max_source_length,
                                merge=merge, trust_remote_code=trust_remote_code)
        path, _ = export_model(options, output, overwrite=overwrite, log=log)
    emit(path)


def run_command(
    folder: Annotated[Path, typer.Argument(help="An export folder (from modelshrink export).")],
    input: Annotated[Path, typer.Option("--input", "-i", exists=True, dir_okay=False,
                                        help="JSON lines with a document (or text) column; .gz too.")],
    column: Annotated[Optional[str], typer.Option(help="The text column. [default: document, article, text, "
                                                       "sentence or source]")] = None,
    limit: Annotated[Optional[int], typer.Option(help="Only the first N rows.")] = None,
    batch_size: Annotated[int, typer.Option(help="Documents per batch.")] = 16,
    num_beams: Annotated[Optional[int], typer.Option(help="Beam size. [default: the generation config's]")] = None,
    max_length: Annotated[Optional[int], typer.Option(help="Maximum summary length in tokens.")] = None,
) -> None:
    """Summarize or classify JSON lines with an export folder; one {"id", "prediction"} per line on stdout.
    Imports no torch."""
    from modelshrink.runtime import RuntimeError_, is_export, run_file

    if not is_export(folder):
        raise fail(f"{folder} is not an export folder (no config.json beside encoder_model.onnx or model.onnx); "
                   "write one with modelshrink export")
    try:
        for row in run_file(str(folder), str(input), column, limit, batch_size, num_beams=num_beams,
                            max_length=max_length):
            typer.echo(json.dumps(row, ensure_ascii=False))
    except RuntimeError_ as e:
        raise fail(str(e)) from None
