"""`modelshrink quantize`: DQ-BART joint distillation and quantization, stored as integers."""

from __future__ import annotations

from modelshrink.commands._common import DocsProgress, emit, handle_errors, log, main_process
from modelshrink.commands._from_options import OUTPUT, OVERWRITE, QUIET, RESUME, from_options
from modelshrink.options.quantize import QuantizeOptions

EPILOG = """\
**Examples**

Distillation-aware 8-bit and ternary quantization of a student (the teacher is the input model):

    modelshrink quantize runs/student -o runs/student-888 --bits 8-8-8 --data train.jsonl --max-steps 2000
    modelshrink quantize runs/student -o runs/student-228 --bits 2-2-8 --data train.jsonl --epochs 3

Quantize and shrink at once from a 6-6 teacher (the paper's "2-2-8 6-3" row):

    modelshrink quantize runs/teacher -o runs/q-228-6-3 --bits 2-2-8 --decoder-layers 3 --data train.jsonl --epochs 3

The direct baseline (no training; the paper shows it collapses):

    modelshrink quantize runs/student -o runs/student-228-direct --bits 2-2-8 --method direct

Bits per layer: ternary, but 8-bit cross-attention and 4-bit decoder feed-forward blocks:

    modelshrink quantize runs/teacher -o runs/q-mixed --bits 2-2-8,cross_attention=8,decoder.ffn=4 --data train.jsonl --epochs 3

The best model under 20 MB: each layer group's bits chosen from its measured sensitivity (the plan is printed first):

    modelshrink quantize runs/teacher -o runs/q-20mb --budget-mb 20 --data train.jsonl --epochs 3
"""


@from_options(QuantizeOptions, extra=[OUTPUT, RESUME, OVERWRITE, QUIET])
def quantize_command(options: QuantizeOptions, output, resume: bool, overwrite: bool,
                     quiet: bool) -> None:
    """Quantize a model (DQ-BART): W-E-A bits (per layer, or chosen under --budget-mb), direct or distillation-aware,
    stored as packed integers.

    The artifact holds int8 / 4-bit / ternary (1.6 bits per weight) integers with their scales, and
    reports parameters, bytes on disk and the compression ratio against the float32 model.
    """
    from modelshrink.steps.quantize import quantize

    main = main_process()
    with handle_errors(output), DocsProgress(quiet) as bars:
        path = quantize(options, output, overwrite=overwrite, resume=resume,
                        progress=bars.train_task(f"quantize {options.bits}"), log=log if main else (lambda m: None))
    if main:
        emit(path)
