"""`modelshrink distill`: shrink a teacher into a student and train it (or fine-tune a model)."""

from __future__ import annotations

from modelshrink.commands._common import DocsProgress, emit, handle_errors, log, main_process
from modelshrink.commands._from_options import OUTPUT, OVERWRITE, QUIET, RESUME, from_options
from modelshrink.options.distill import DistillOptions

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

On a GPU, bf16 autocast (the teacher in bf16 too) and activations recomputed in the backward pass:

    modelshrink distill train.jsonl -o runs/student-kd --teacher runs/teacher --decoder-layers 3 \\
        --kd-logits kl --precision bf16 --gradient-checkpointing --epochs 3

Repeat a run from its manifest (its `options` as a TOML table):

    modelshrink distill --config recipe.toml -o runs/student-again

Several processes or machines:

    accelerate launch --multi_gpu --num_processes 2 -m modelshrink distill train.jsonl -o runs/s ...
"""


@from_options(DistillOptions, extra=[OUTPUT, RESUME, OVERWRITE, QUIET])
def distill_command(options: DistillOptions, output, resume: bool, overwrite: bool,
                    quiet: bool) -> None:
    """Shrink a teacher into a student (copied layers) and train it, on gold pairs or pseudo labels,
    optionally with word-level distillation losses; or fine-tune a model (a teacher) when there is none.

    Writes a model artifact (`save_pretrained` folder with tokenizer and generation config) with
    train_log.jsonl, validation.json, a model card README.md and modelshrink.json.
    """
    from modelshrink.steps.distill import distill

    main = main_process()
    with handle_errors(output), DocsProgress(quiet) as bars:
        path = distill(options, output, overwrite=overwrite, resume=resume, progress=bars.train_task("distill"),
                       log=log if main else (lambda m: None))
    if main:
        emit(path)
