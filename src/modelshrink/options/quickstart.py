"""Options of `modelshrink quickstart`: how much work each step of the chain does."""

from __future__ import annotations

from typing import ClassVar

from modelshrink.options import Options, opt, options_class


@options_class
class QuickstartOptions(Options):
    """Every option of `modelshrink quickstart`. The defaults fit about 15 minutes on 2 CPU cores; README's
    quickstart table is what they print."""

    STEP: ClassVar[str] = "quickstart"

    teacher_steps: int = opt(300, "Fine-tuning steps of the teacher.", min=1)
    student_steps: int = opt(60, "Training steps of each student.", min=1)
    quantize_steps: int = opt(30, "Distillation-aware quantization steps (8-8-8, 2-2-8).", min=1)
    pseudolabel_docs: int = opt(400, "Training documents the teacher labels.", min=1)
    eval_docs: int = opt(100, "Validation documents scored.", min=1)
    latency_docs: int = opt(8, "Validation documents timed one at a time (batch-1 latency).", min=1)
    batch_size: int = opt(16, "Documents per batch in every step.", min=1)
    max_source_length: int = opt(64, "Documents cut to this many tokens in every step.", min=1)
    max_target_length: int = opt(24, "Summaries cut to this many tokens for training, and generated up to it.",
                                 min=1)
    runtime_docs: int = opt(3, "Documents the exported model summarizes at the end, in the torch-free runtime.",
                            min=1)
