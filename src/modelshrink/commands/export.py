"""`modelshrink export`: ONNX for deployment, validated against PyTorch (`modelshrink run` is in run.py)."""

from __future__ import annotations

from pathlib import Path

from modelshrink.commands._common import emit, handle_errors, log
from modelshrink.commands._from_options import OUTPUT, OVERWRITE, QUIET, from_options
from modelshrink.options.export import ExportOptions

EPILOG = """\
**Examples**

Export the compressed student (encoder, merged decoder; config, tokenizer, model card),
checked against PyTorch on documents from the validation set:

    modelshrink export runs/student -o runs/student-onnx --data valid.jsonl

int8 for CPU serving (one weight scale per output channel; each matmul on the integer kernel measured
fastest on this machine: onnxruntime's uint8 kernel, MatMulNBits, or where the processor has VNNI the s8
kernel, int8 weights; --kernel int8 for a folder that must run on any x86 processor):

    modelshrink export runs/student -o runs/student-onnx-int8 --int8

4-bit weights and embedding tables (onnxruntime's MatMulNBits, one scale and zero point per 32 weights):

    modelshrink export runs/student -o runs/student-onnx-int4 --int4

For transformers.js (graphs in onnx/, named by weight type; bart, t5 and classifiers):

    modelshrink export runs/student -o runs/student-js --layout transformers.js --int8

A `quantize` artifact keeps its low bits (ternary weights as 2-bit codes, 3-4-bit as 4-bit, 5-8-bit as 8-bit),
each matmul on the integer kernel measured fastest for it (--kernel; the table is in export_report.json):

    modelshrink export runs/student-228 -o runs/student-228-onnx

Then summarize without torch, or measure the deployed form with the same eval as every other model:

    modelshrink run runs/student-onnx --input docs.jsonl > summaries.jsonl
    modelshrink eval runs/student-onnx valid.jsonl -o runs/eval-student-onnx

Exit codes: 1 for a bad input (nothing written), 3 when the export was written but its outputs or
tokens differ from PyTorch's beyond the tolerance (see export_report.json in the folder).
"""


@from_options(ExportOptions, extra=[OUTPUT, OVERWRITE, QUIET])
def export_command(options: ExportOptions, output: Path, overwrite: bool, quiet: bool) -> None:
    """Export a model to ONNX (Optimum's file layout, or transformers.js's with --layout), validate it against PyTorch, and write a folder
    that runs with onnxruntime, tokenizers and numpy alone (`modelshrink run`, `modelshrink.runtime`).
    """
    from modelshrink.steps.export import export_model

    with handle_errors(output):
        path, _ = export_model(options, output, overwrite=overwrite, log=(lambda m: None) if quiet else log)
    emit(path)

