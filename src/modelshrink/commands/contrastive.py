"""`modelshrink contrastive`: ACKD — adaptive contrastive distillation of BERT-style classifiers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from modelshrink.commands._common import (DATA, OPT, VAL, Beta1, Beta2, Device, DocsProgress, EarlyStopping, Epochs,
                                          Eps, EvalEvery, GradAccum, LogEvery, Lr, MaxGradNorm, MaxSteps, MaxTokens,
                                          Overwrite, Resume, SaveEvery, Seed, Split, TrustRemoteCode, ValidationSplit,
                                          WarmupRatio, WarmupSteps, WeightDecay, emit, handle_errors, log, parse_ids)

EPILOG = """\
**Examples**

Fine-tune a teacher from a pretrained encoder (cross-entropy only; no teacher):

    modelshrink contrastive train.jsonl -o runs/teacher --student path/to/minilm --epochs 3 \\
        --validation validation.jsonl

A 3-layer student from the teacher's layers, trained by full ACKD (Eq. 4):

    modelshrink contrastive train.jsonl -o runs/ackd-3 --teacher runs/teacher --layers 3 --epochs 3 \\
        --validation validation.jsonl --alpha 0.5 --beta 20 --gamma 5e-3

The paper's ablations and baselines (same budget and seed):

    ... --no-sar          # CDL: w = 1
    ... --no-storage      # negatives from the batch only
    ... --no-acdl         # KD + PT (PKD)
    ... --no-acdl --no-pt # KD only
    ... --alpha 1 --no-pt --no-acdl   # cross-entropy only

Sentence pairs and regression targets binned into classes for the contrastive term:

    modelshrink contrastive stsb.jsonl -o runs/stsb-3 --teacher runs/stsb-teacher --layers 3 \\
        --text-column sentence1 --text-pair-column sentence2 --label-bins 5 --epochs 3

Several processes or machines (the feature storage gathers every process's batch):

    accelerate launch --multi_gpu --num_processes 2 -m modelshrink contrastive train.jsonl -o runs/s ...
"""

START = "Teacher and student"
LOSS = "Loss (Eq. 4: α·CE + (1 − α)·KD + β·PT + γ·A-CDL; paper's search ranges in brackets)"


def contrastive_command(
    data: Annotated[str, typer.Argument(help="Labelled training data: jsonl, csv/tsv, parquet, a datasets folder "
                                             "or a cached hub name.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to write the classifier artifact to.")],
    teacher: Annotated[Optional[str], typer.Option(help="Fine-tuned teacher classifier. Without it, --student is "
                                                        "fine-tuned by cross-entropy alone.",
                                                   rich_help_panel=START)] = None,
    student: Annotated[Optional[str], typer.Option(help="A separate student: a classifier, or a pretrained encoder "
                                                        "(gets a new head).", rich_help_panel=START)] = None,
    layers: Annotated[Optional[int], typer.Option(help="Student of this many layers copied from the teacher.",
                                                  rich_help_panel=START)] = None,
    layer_selection: Annotated[str, typer.Option(help="spaced (first and last kept; 6→3 = 0,3,5) or first (PKD).",
                                                 rich_help_panel=START)] = "spaced",
    layer_ids: Annotated[Optional[str], typer.Option(metavar="IDS", help="Explicit teacher layers, e.g. 0,2,4.",
                                                     rich_help_panel=START)] = None,
    feature_map: Annotated[str, typer.Option(help="Layers where PT and A-CDL compare [CLS] features: skip (PKD; "
                                                  "12→6 = teacher 2,4,6,8,10), last (PKD), or copied.",
                                             rich_help_panel=START)] = "skip",
    alpha: Annotated[float, typer.Option(help="α, cross-entropy vs KD [0.1, 0.3, 0.5].", rich_help_panel=LOSS)] = 0.5,
    beta: Annotated[float, typer.Option(help="β, patient loss [20, 40, 60].", rich_help_panel=LOSS)] = 20.0,
    gamma: Annotated[float, typer.Option(help="γ, A-CDL [5e-4, 5e-3, 5e-2].", rich_help_panel=LOSS)] = 5e-3,
    temperature: Annotated[float, typer.Option(help="T of KD (loss × T²) [PKD: 5, 10, 20].",
                                               rich_help_panel=LOSS)] = 5.0,
    kd: Annotated[bool, typer.Option(help="The KD term.", rich_help_panel=LOSS)] = True,
    pt: Annotated[bool, typer.Option(help="The patient loss term.", rich_help_panel=LOSS)] = True,
    acdl: Annotated[bool, typer.Option(help="The contrastive term.", rich_help_panel=LOSS)] = True,
    sar: Annotated[bool, typer.Option(help="Sample adaptive reweighting (--no-sar: w = 1, plain CDL).",
                                      rich_help_panel=LOSS)] = True,
    storage: Annotated[bool, typer.Option(help="Dynamic feature storage (--no-storage: negatives from the batch).",
                                          rich_help_panel=LOSS)] = True,
    storage_size: Annotated[int, typer.Option(help="Samples kept in the storage (FIFO).",
                                              rich_help_panel=LOSS)] = 1000,
    predictor_layers: Annotated[int, typer.Option(help="Depth of the SAR predictor MLP [2, 3, 4].",
                                                  rich_help_panel=LOSS)] = 2,
    label_bins: Annotated[Optional[int], typer.Option(help="Regression labels: equal-width bins used as classes by "
                                                           "the contrastive term.", rich_help_panel=LOSS)] = None,
    max_steps: MaxSteps = None,
    epochs: Epochs = None,
    lr: Lr = 5e-5,
    beta1: Beta1 = 0.9,
    beta2: Beta2 = 0.999,
    eps: Eps = 1e-8,
    weight_decay: WeightDecay = 0.01,
    warmup_steps: WarmupSteps = None,
    warmup_ratio: WarmupRatio = 0.1,
    max_grad_norm: MaxGradNorm = 1.0,
    grad_accum: GradAccum = 1,
    batch_size: Annotated[int, typer.Option(help="Sentences per batch and process [8, 16, 32].",
                                            rich_help_panel=OPT)] = 32,
    max_tokens: MaxTokens = None,
    seed: Seed = 0,
    log_every: LogEvery = 10,
    save_every: SaveEvery = None,
    validation: Annotated[Optional[str], typer.Option(help="Labelled validation data (accuracy, F1, MCC; Pearson "
                                                           "for regression).", rich_help_panel=VAL)] = None,
    eval_every: EvalEvery = None,
    eval_limit: Annotated[Optional[int], typer.Option(help="Validation rows used. [default: all]",
                                                      rich_help_panel=VAL)] = None,
    metric: Annotated[str, typer.Option(help="Keep the checkpoint best by this: accuracy, f1, mcc (pearson, "
                                             "spearman for regression).", rich_help_panel=VAL)] = "accuracy",
    early_stopping: EarlyStopping = None,
    text_column: Annotated[Optional[str], typer.Option(help="Sentence column. [default: auto]",
                                                       rich_help_panel=DATA)] = None,
    text_pair_column: Annotated[Optional[str], typer.Option(help="Second sentence of a pair.",
                                                            rich_help_panel=DATA)] = None,
    label_column: Annotated[Optional[str], typer.Option(help="Label column. [default: label]",
                                                        rich_help_panel=DATA)] = None,
    split: Split = None,
    validation_split: ValidationSplit = None,
    limit: Annotated[Optional[int], typer.Option(help="Use only the first N training rows.",
                                                 rich_help_panel=DATA)] = None,
    max_length: Annotated[int, typer.Option(help="Truncate inputs to this many tokens (paper: 128).",
                                            rich_help_panel=DATA)] = 128,
    device: Device = "auto",
    resume: Resume = False,
    overwrite: Overwrite = False,
    trust_remote_code: TrustRemoteCode = False,
) -> None:
    """Distill a BERT-style classifier with ACKD (adaptive contrastive distillation), or fine-tune one.

    Writes a classifier artifact (`save_pretrained` folder with tokenizer) with train_log.jsonl,
    validation.json, a model card README.md and modelshrink.json.
    """
    from modelshrink.contrastive import ContrastiveOptions, contrastive

    main = os.environ.get("RANK", "0") == "0"
    with handle_errors(resume_hint="Run the same command with --resume to continue from the last checkpoint "
                                   "(needs --save-every)."):
        options = ContrastiveOptions(
            data=data, teacher=teacher, student=student, layers=layers, layer_selection=layer_selection,
            layer_ids=parse_ids(layer_ids, "--layer-ids"), feature_map=feature_map, alpha=alpha, beta=beta, gamma=gamma,
            temperature=temperature, kd=kd, pt=pt, acdl=acdl, sar=sar, storage=storage, storage_size=storage_size,
            predictor_layers=predictor_layers, label_bins=label_bins, validation=validation, eval_limit=eval_limit,
            split=split, validation_split=validation_split, text_column=text_column,
            text_pair_column=text_pair_column, label_column=label_column, limit=limit, max_length=max_length,
            lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, warmup_steps=warmup_steps,
            warmup_ratio=warmup_ratio, max_grad_norm=max_grad_norm, grad_accum=grad_accum, batch_size=batch_size,
            max_tokens=max_tokens, max_steps=max_steps, epochs=epochs, seed=seed, log_every=log_every,
            eval_every=eval_every, save_every=save_every, metric=metric, early_stopping=early_stopping,
            device=device, trust_remote_code=trust_remote_code)
        with DocsProgress() as bars:
            path = contrastive(options, output, overwrite=overwrite, resume=resume,
                               progress=bars.train_task("contrastive"), log=log if main else (lambda m: None))
    if main:
        emit(path)
