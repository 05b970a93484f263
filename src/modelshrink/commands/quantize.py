"""`modelshrink quantize`: DQ-BART joint distillation and quantization, stored as integers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from modelshrink.commands._common import DocsProgress, emit, handle_errors, log

EPILOG = """\
**Examples**

Distillation-aware 8-bit and ternary quantization of a student (the teacher is the input model):

    modelshrink quantize runs/student -o runs/student-888 --bits 8-8-8 --data train.jsonl --max-steps 2000
    modelshrink quantize runs/student -o runs/student-228 --bits 2-2-8 --data train.jsonl --epochs 3

Quantize and shrink at once from a 6-6 teacher (the paper's "2-2-8 6-3" row):

    modelshrink quantize runs/teacher -o runs/q-228-6-3 --bits 2-2-8 --decoder-layers 3 --data train.jsonl --epochs 3

The direct baseline (no training; the paper shows it collapses):

    modelshrink quantize runs/student -o runs/student-228-direct --bits 2-2-8 --method direct
"""

TRAIN = "Training (--method distill; as in distill)"


def quantize_command(
    model: Annotated[str, typer.Argument(help="A trained full-precision model: seq2seq, or a BERT-style "
                                              "classifier.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to write the quantized artifact to.")],
    bits: Annotated[str, typer.Option(help="W-E-A: bits of linear weights, word embeddings, activations. 2 = ternary "
                                           "(TWN), 3-8 = symmetric linear.")] = "8-8-8",
    method: Annotated[str, typer.Option(help="distill (distillation-aware training, DQ-BART 2.3) or direct.")] = "distill",
    granularity: Annotated[str, typer.Option(help="Scale of linear weights: per tensor or per output row. Embeddings: "
                                                  "always per row.")] = "tensor",
    allow_low_activation_bits: Annotated[bool, typer.Option(help="Permit activations below 8 bits.")] = False,
    data: Annotated[Optional[str], typer.Option(help="Training pairs for --method distill.", rich_help_panel=TRAIN)] = None,
    teacher: Annotated[Optional[str], typer.Option(help="Full-precision teacher. [default: MODEL itself]",
                                                   rich_help_panel=TRAIN)] = None,
    encoder_layers: Annotated[Optional[int], typer.Option(help="Also shrink: encoder layers copied from the teacher.",
                                                          rich_help_panel=TRAIN)] = None,
    decoder_layers: Annotated[Optional[int], typer.Option(help="Also shrink: decoder layers copied from the teacher.",
                                                          rich_help_panel=TRAIN)] = None,
    kd_logits_weight: Annotated[float, typer.Option(help="Weight of the logits MSE.", rich_help_panel=TRAIN)] = 1.0,
    kd_hidden: Annotated[float, typer.Option(help="Weight of the hidden-state MSE.", rich_help_panel=TRAIN)] = 1.0,
    kd_attention: Annotated[float, typer.Option(help="Weight of the attention MSE.", rich_help_panel=TRAIN)] = 1.0,
    label_smoothing: Annotated[float, typer.Option(help="Label smoothing of the task loss.",
                                                   rich_help_panel=TRAIN)] = 0.0,
    max_steps: Annotated[Optional[int], typer.Option(help="Optimizer steps.", rich_help_panel=TRAIN)] = None,
    epochs: Annotated[Optional[float], typer.Option(help="Epochs.", rich_help_panel=TRAIN)] = None,
    lr: Annotated[float, typer.Option(help="Peak learning rate.", rich_help_panel=TRAIN)] = 5e-5,
    warmup_steps: Annotated[Optional[int], typer.Option(help="Warmup steps.", rich_help_panel=TRAIN)] = None,
    batch_size: Annotated[int, typer.Option(help="Pairs per batch and process.", rich_help_panel=TRAIN)] = 16,
    grad_accum: Annotated[int, typer.Option(help="Gradient accumulation.", rich_help_panel=TRAIN)] = 1,
    seed: Annotated[int, typer.Option(help="Seed.", rich_help_panel=TRAIN)] = 0,
    validation: Annotated[Optional[str], typer.Option(help="Validation pairs (ROUGE).", rich_help_panel=TRAIN)] = None,
    eval_every: Annotated[Optional[int], typer.Option(help="Validate every N steps.", rich_help_panel=TRAIN)] = None,
    eval_limit: Annotated[int, typer.Option(help="Validation documents.", rich_help_panel=TRAIN)] = 200,
    save_every: Annotated[Optional[int], typer.Option(help="Checkpoint every N steps.", rich_help_panel=TRAIN)] = None,
    log_every: Annotated[int, typer.Option(help="Log every N steps.", rich_help_panel=TRAIN)] = 10,
    max_source_length: Annotated[Optional[int], typer.Option(help="Truncate documents.", rich_help_panel=TRAIN)] = None,
    max_target_length: Annotated[Optional[int], typer.Option(help="Truncate summaries. [default: 128]",
                                                             rich_help_panel=TRAIN)] = None,
    limit: Annotated[Optional[int], typer.Option(help="First N training pairs.", rich_help_panel=TRAIN)] = None,
    text_column: Annotated[Optional[str], typer.Option(help="Document / sentence column. [default: auto]",
                                                       rich_help_panel=TRAIN)] = None,
    text_pair_column: Annotated[Optional[str], typer.Option(help="Classifiers: second sentence of a pair.",
                                                            rich_help_panel=TRAIN)] = None,
    label_column: Annotated[Optional[str], typer.Option(help="Classifiers: the label column. [default: label]",
                                                        rich_help_panel=TRAIN)] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, or auto.")] = "auto",
    resume: Annotated[bool, typer.Option(help="Continue an interrupted --method distill run.")] = False,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output.")] = False,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow models' own code from the hub.")] = False,
) -> None:
    """Quantize a model (DQ-BART): W-E-A bits, direct or distillation-aware, stored as packed integers.

    The artifact holds int8 / 4-bit / ternary (1.6 bits per weight) integers with their scales, and
    reports parameters, bytes on disk and the compression ratio against the float32 model.
    """
    from modelshrink.quantize import QuantizeOptions, quantize

    main = os.environ.get("RANK", "0") == "0"
    training = dict(encoder_layers=encoder_layers, decoder_layers=decoder_layers, kd_logits_weight=kd_logits_weight,
                    kd_hidden=kd_hidden, kd_attention=kd_attention, label_smoothing=label_smoothing,
                    max_steps=max_steps, epochs=epochs, lr=lr, warmup_steps=warmup_steps, batch_size=batch_size,
                    grad_accum=grad_accum, seed=seed, validation=validation, eval_every=eval_every,
                    eval_limit=eval_limit, save_every=save_every, log_every=log_every,
                    max_source_length=max_source_length, max_target_length=max_target_length, limit=limit,
                    text_column=text_column, text_pair_column=text_pair_column, label_column=label_column)
    with handle_errors(resume_hint="Run the same command with --resume (needs --save-every)."):
        options = QuantizeOptions(model=model, bits=bits, method=method, granularity=granularity,
                                  allow_low_activation_bits=allow_low_activation_bits, teacher=teacher, data=data,
                                  training={k: v for k, v in training.items() if v is not None}, device=device,
                                  trust_remote_code=trust_remote_code)
        with DocsProgress() as bars:
            path = quantize(options, output, overwrite=overwrite, resume=resume,
                            progress=bars.train_task(f"quantize {bits}"), log=log if main else (lambda m: None))
    if main:
        emit(path)
