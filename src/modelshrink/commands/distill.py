"""`modelshrink distill`: shrink a teacher into a student and train it (or fine-tune a model)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from modelshrink.commands._common import (DATA, GEN_PANEL, OPT, VAL, Beta1, Beta2, Device, DocsProgress,
                                          EarlyStopping, Epochs, Eps, EvalEvery, GradAccum, LogEvery, Lr, MaxGradNorm,
                                          MaxLength, MaxSourceLength, MaxSteps, MaxTokens, NumBeams, Overwrite,
                                          Resume, SaveEvery, Seed, Split, TrustRemoteCode, ValidationSplit,
                                          WarmupRatio, WarmupSteps, WeightDecay, emit, handle_errors, log, parse_ids)

EPILOG = """\
**Examples**

Shrink a 12-6 teacher to 12-3 (decoder layers 0, 3, 5) and train it on PLATE pseudo labels:

    modelshrink distill runs/pl-lambda2 -o runs/student-12-3 --teacher runs/teacher --decoder-layers 3 \\
        --epochs 3 --validation valid.jsonl --eval-every 500

Add DQ-BART's word-level losses (logits, hidden states, attention):

    modelshrink distill train.jsonl -o runs/student-kd --teacher runs/teacher --encoder-layers 6 \\
        --decoder-layers 3 --kd-logits mse --kd-hidden 1 --kd-attention 1 --max-steps 20000

Make a teacher from a pretrained encoder (bert2bert warm start), or only write the shrunk student:

    modelshrink distill train.jsonl -o runs/teacher --init-encoder-decoder path/to/minilm --epochs 3
    modelshrink distill train.jsonl -o runs/student-init --teacher runs/teacher --decoder-layers 1 --max-steps 0

Several processes or machines:

    accelerate launch --multi_gpu --num_processes 2 -m modelshrink distill train.jsonl -o runs/s ...
"""

START = "Starting point"
LOSS = "Losses"


def distill_command(
    data: Annotated[str, typer.Argument(help="Training pairs: gold (document, summary) or a pseudolabel artifact.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to write the model artifact to.")],
    teacher: Annotated[Optional[str], typer.Option(help="Teacher model: the student copies its layers, and "
                                                        "word-level losses compare against it.",
                                                   rich_help_panel=START)] = None,
    student: Annotated[Optional[str], typer.Option(help="A separate student model (or, alone, a model to "
                                                        "fine-tune).", rich_help_panel=START)] = None,
    init_encoder_decoder: Annotated[Optional[str], typer.Option(
        metavar="ENCODER[,DECODER]", help="Warm-start an encoder-decoder from pretrained BERT/RoBERTa encoders.",
        rich_help_panel=START)] = None,
    cross_attention_init: Annotated[str, typer.Option(
        help="With --init-encoder-decoder: start cross-attention as a copy of each decoder layer's self-attention "
             "(self), or random.", rich_help_panel=START)] = "self",
    encoder_layers: Annotated[Optional[int], typer.Option(help="Student encoder layers copied from the teacher. "
                                                               "[default: all]", rich_help_panel=START)] = None,
    decoder_layers: Annotated[Optional[int], typer.Option(help="Student decoder layers copied from the teacher. "
                                                               "[default: all]", rich_help_panel=START)] = None,
    layer_selection: Annotated[str, typer.Option(help="spaced (first and last kept; 12→3 = 0,6,11; one layer = the "
                                                      "last) or first.", rich_help_panel=START)] = "spaced",
    encoder_layer_ids: Annotated[Optional[str], typer.Option(metavar="IDS", help="Explicit teacher encoder layers, "
                                                             "e.g. 0,6,11.", rich_help_panel=START)] = None,
    decoder_layer_ids: Annotated[Optional[str], typer.Option(metavar="IDS", help="Explicit teacher decoder layers.",
                                                             rich_help_panel=START)] = None,
    kd_logits: Annotated[Optional[str], typer.Option(help="Logit distillation: kl (with --temperature) or mse "
                                                          "(DQ-BART). [default: off]", rich_help_panel=LOSS)] = None,
    kd_logits_weight: Annotated[float, typer.Option(help="Weight of the logit loss.", rich_help_panel=LOSS)] = 1.0,
    temperature: Annotated[float, typer.Option(help="Temperature of --kd-logits kl (loss scaled by T²).",
                                               rich_help_panel=LOSS)] = 2.0,
    kd_hidden: Annotated[float, typer.Option(help="Weight of the hidden-state MSE (0 = off).",
                                             rich_help_panel=LOSS)] = 0.0,
    kd_attention: Annotated[float, typer.Option(help="Weight of the attention MSE: encoder self, decoder self, "
                                                     "cross (0 = off).", rich_help_panel=LOSS)] = 0.0,
    label_smoothing: Annotated[float, typer.Option(help="Label smoothing of the cross-entropy (PLATE: 0.1).",
                                                   rich_help_panel=LOSS)] = 0.1,
    max_steps: MaxSteps = None,
    epochs: Epochs = None,
    lr: Lr = 5e-5,
    beta1: Beta1 = 0.9,
    beta2: Beta2 = 0.999,
    eps: Eps = 1e-8,
    weight_decay: WeightDecay = 0.01,
    warmup_steps: WarmupSteps = None,
    warmup_ratio: WarmupRatio = 0.0,
    max_grad_norm: MaxGradNorm = 1.0,
    grad_accum: GradAccum = 1,
    batch_size: Annotated[int, typer.Option(help="Pairs per batch and process.", rich_help_panel=OPT)] = 16,
    max_tokens: MaxTokens = None,
    seed: Seed = 0,
    log_every: LogEvery = 10,
    save_every: SaveEvery = None,
    validation: Annotated[Optional[str], typer.Option(help="Validation pairs, scored by ROUGE.",
                                                      rich_help_panel=VAL)] = None,
    eval_every: EvalEvery = None,
    eval_limit: Annotated[Optional[int], typer.Option(help="Validation documents used.", rich_help_panel=VAL)] = 200,
    metric: Annotated[str, typer.Option(help="Keep the checkpoint best by this: rouge1, rouge2, rougeL, rougeLsum.",
                                        rich_help_panel=VAL)] = "rouge2",
    early_stopping: EarlyStopping = None,
    num_beams: NumBeams = None,
    max_length: MaxLength = None,
    max_source_length: MaxSourceLength = None,
    max_target_length: Annotated[int, typer.Option(help="Truncate summaries to this many tokens for training.",
                                                   rich_help_panel=GEN_PANEL)] = 128,
    split: Split = None,
    validation_split: ValidationSplit = None,
    text_column: Annotated[Optional[str], typer.Option(help="Document column. [default: auto]",
                                                       rich_help_panel=DATA)] = None,
    summary_column: Annotated[Optional[str], typer.Option(help="Summary column. [default: auto]",
                                                          rich_help_panel=DATA)] = None,
    limit: Annotated[Optional[int], typer.Option(help="Use only the first N training pairs.",
                                                 rich_help_panel=DATA)] = None,
    device: Device = "auto",
    resume: Resume = False,
    overwrite: Overwrite = False,
    trust_remote_code: TrustRemoteCode = False,
) -> None:
    """Shrink a teacher into a student (copied layers) and train it, on gold pairs or pseudo labels,
    optionally with word-level distillation losses; or fine-tune a model (a teacher) when there is none.

    Writes a model artifact (`save_pretrained` folder with tokenizer and generation config) with
    train_log.jsonl, validation.json, a model card README.md and modelshrink.json.
    """
    from modelshrink.distill import DistillOptions, distill

    main = os.environ.get("RANK", "0") == "0"
    with handle_errors(resume_hint="Run the same command with --resume to continue from the last checkpoint "
                                   "(needs --save-every)."):
        options = DistillOptions(
            data=data, teacher=teacher, student=student, init_encoder_decoder=init_encoder_decoder,
            cross_attention_init=cross_attention_init, encoder_layers=encoder_layers, decoder_layers=decoder_layers,
            layer_selection=layer_selection,
            encoder_layer_ids=parse_ids(encoder_layer_ids, "--encoder-layer-ids"),
            decoder_layer_ids=parse_ids(decoder_layer_ids, "--decoder-layer-ids"), kd_logits=kd_logits,
            kd_logits_weight=kd_logits_weight, temperature=temperature, kd_hidden=kd_hidden,
            kd_attention=kd_attention, label_smoothing=label_smoothing, validation=validation,
            eval_limit=eval_limit, split=split, validation_split=validation_split, text_column=text_column,
            summary_column=summary_column, limit=limit, max_source_length=max_source_length,
            max_target_length=max_target_length, num_beams=num_beams, max_length=max_length, lr=lr, beta1=beta1,
            beta2=beta2, eps=eps, weight_decay=weight_decay, warmup_steps=warmup_steps, warmup_ratio=warmup_ratio,
            max_grad_norm=max_grad_norm, grad_accum=grad_accum, batch_size=batch_size, max_tokens=max_tokens,
            max_steps=max_steps, epochs=epochs, seed=seed, log_every=log_every, eval_every=eval_every,
            save_every=save_every, metric=metric, early_stopping=early_stopping, device=device,
            trust_remote_code=trust_remote_code)
        with DocsProgress() as bars:
            path = distill(options, output, overwrite=overwrite, resume=resume, progress=bars.train_task("distill"),
                           log=log if main else (lambda m: None))
    if main:
        emit(path)
