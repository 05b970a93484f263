"""`modelshrink contrastive`: ACKD — adaptive contrastive distillation of BERT-style classifiers."""

from __future__ import annotations

from modelshrink.commands._common import DocsProgress, emit, handle_errors, log, main_process
from modelshrink.commands._from_options import OUTPUT, OVERWRITE, QUIET, RESUME, from_options
from modelshrink.options.contrastive import ContrastiveOptions

EPILOG = """\
**Examples**

Fine-tune a teacher from a pretrained encoder (cross-entropy only; no teacher):

    modelshrink contrastive train.jsonl -o runs/teacher --student path/to/minilm --epochs 3 \\
        --validation validation.jsonl

A 3-layer student from the teacher's layers, trained by full ACKD (Eq. 4):

    modelshrink contrastive train.jsonl -o runs/ackd-3 --teacher runs/teacher --layers 3 --epochs 3 \\
        --validation validation.jsonl --alpha 0.5 --beta 20 --gamma 5e-3

A smaller student: only the tokens the training sentences use (MiniLM on rt-polarity: 30,522 -> 14,504):

    modelshrink contrastive train.jsonl -o runs/ackd-3-trim --teacher runs/teacher --layers 3 --trim-vocab

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


@from_options(ContrastiveOptions, extra=[OUTPUT, RESUME, OVERWRITE, QUIET])
def contrastive_command(options: ContrastiveOptions, output, resume: bool, overwrite: bool,
                        quiet: bool) -> None:
    """Distill a BERT-style classifier with ACKD (adaptive contrastive distillation), or fine-tune one.

    Writes a classifier artifact (`save_pretrained` folder with tokenizer) with train_log.jsonl,
    validation.json, a model card README.md and modelshrink.json.
    """
    from modelshrink.steps.contrastive import contrastive

    main = main_process()
    with handle_errors(output), DocsProgress(quiet) as bars:
        path = contrastive(options, output, overwrite=overwrite, resume=resume,
                           progress=bars.train_task("contrastive"), log=log if main else (lambda m: None))
    if main:
        emit(path)
