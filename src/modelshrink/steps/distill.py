"""`distill`: shrink a teacher into a student (copied layers) and train it; or fine-tune a model.

The student is trained on gold summaries or on `pseudolabel` output (sequence-level distillation,
PLATE section 3.2) with label-smoothed cross-entropy, optionally plus word-level distillation
losses against the teacher (DQ-BART section 2.2, Appendix B): logits (KL with temperature, or
MSE), hidden states and attention (encoder self, decoder self, cross), each student layer matched to
the teacher layer it was copied from (the map φ). The student is built by `training/students.py`, trained by
`training/seq2seq.py`, and the run's lifecycle is `training/runs.TrainingRun`, as for `quantize`.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any, Callable

from modelshrink._version import __version__
from modelshrink.options.batching import resolve_batching
from modelshrink.options.distill import DistillOptions
from modelshrink.training.reading import settle_reading
from modelshrink.training.runs import TrainingRun, parent_refs
from modelshrink.training.seq2seq import read_pairs_for, train_seq2seq
from modelshrink.training.students import build_student, check_widths, student_metrics, trim_student
from modelshrink.training.loop import TrainResult, enable_gradient_checkpointing

SAVE_PRETRAINED = "A `save_pretrained` folder: plain `transformers` loads it."


def distill(options: DistillOptions, output: str | Path, *, overwrite: bool = False, resume: bool = False,
            progress: Callable[[dict[str, Any]], None] | None = None,
            log: Callable[[str], None] = lambda m: None) -> Path:
    """Build the student, train it, and write a model artifact; returns its path. The function behind
    `modelshrink distill`.

    ```python
    import modelshrink
    from modelshrink import DistillOptions

    # a 12-3 student (decoder layers 0, 6, 11 of the teacher) on PLATE
    # labels, validated by ROUGE-2
    options = DistillOptions(data="labels", teacher="teacher", decoder_layers=3,
                             epochs=3, validation="valid.jsonl", eval_every=500)
    student = modelshrink.distill(options, "student")
    ```
    """
    from modelshrink.models.loading import resolve_device, save_model, source_length

    device = resolve_device(options.device)
    options = resolve_batching(options, device)
    run = TrainingRun("distill", options, output, overwrite=overwrite, resume=resume, log=log)
    if run.finished():
        return run.output
    accelerator = run.start(device)
    rows, validation_rows = read_pairs_for(options)
    built = build_student(options, device, log)
    reading = settle_reading(built["student"], built["tokenizer"], options, "the student", log)
    if options.trim_vocab:
        built = trim_student(built, rows, log, options.trust_remote_code)
    student, tokenizer = built["student"], built["tokenizer"]
    check_widths(built["teacher"], student, options)
    if options.gradient_checkpointing:
        enable_gradient_checkpointing(student)
    max_source_length = source_length(options.max_source_length, tokenizer, student.config)
    staging = run.open(parent_refs(("data", options.data), ("teacher", options.teacher),
                                   ("student", options.student), ("validation", options.validation)))

    def save(model: Any, folder: Path) -> None:
        save_model(model, tokenizer, folder)

    result: TrainResult | None = None
    if options.max_steps != 0:
        student, result = train_seq2seq(options, built, rows, validation_rows, max_source_length, staging,
                                        accelerator, save, resume=resume, progress=progress, log=log)
    if not run.main:
        return run.output
    run.keep_best(result, lambda folder: save(student, folder))
    metrics = student_metrics(student, built["teacher"], result)
    origin = {**built["origin"], **({"vocabulary": built["vocabulary"]} if "vocabulary" in built else {})}
    card = model_card(options, run.output, origin, metrics, "distill", SAVE_PRETRAINED)
    return run.commit(result, metrics=metrics, card=card, metric=options.metric, always=("teacher", "student"),
                      resolved={"layer_map": built["maps"], "max_source_length": max_source_length, **reading,
                                **({"vocabulary": built["vocabulary"]} if "vocabulary" in built else {})})


def model_card(options: DistillOptions, output: Path, origin: dict[str, Any], metrics: dict[str, Any],
               step: str, storage: str) -> str:
    """The card's description of the student and its training; `storage` says how its weights are stored and
    loaded. The run adds the Reproduce and Lineage sections."""
    lines = [f"# {output.name}", "",
             f"Made by modelshrink {__version__} (`{step}`) on "
             f"{_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d')}. {storage}",
             "", "## Base model", ""]
    if "teacher" in origin and "layer_map" in origin:
        m = origin["layer_map"]
        lines.append(f"Student built from teacher `{origin['teacher']}` by copying encoder layers {m['encoder']} and "
                     f"decoder layers {m['decoder']} (embeddings, norms and LM head copied too).")
    elif "student" in origin:
        lines.append(f"Fine-tuned from `{origin['student']}`" + (f" with teacher `{options.teacher}`."
                                                                  if options.teacher else "."))
    else:
        start = ("a copy of each decoder layer's self-attention" if options.cross_attention_init == "self"
                 else f"random, seed {options.seed}")
        lines.append(f"Warm-started encoder-decoder from `{origin['init_encoder_decoder']}` (cross-attention "
                     f"initialised as {start}), then fine-tuned.")
    if "vocabulary" in origin:
        v = origin["vocabulary"]
        lines.append(f"Vocabulary trimmed to {v['kept']:,} of {v['of']:,} tokens (`--trim-vocab`): those the training "
                     "data uses, the special tokens and every single character.")
    lines += ["", f"Parameters: {metrics['parameters']:,}" + (
        f" (teacher {metrics['teacher_parameters']:,}, {metrics['parameter_ratio']}× fewer)"
        if "teacher_parameters" in metrics else ""), "", "## Training", ""]
    losses = [f"cross-entropy (label smoothing {options.label_smoothing})"]
    if options.kd_logits:
        losses.append(f"{options.kd_logits_weight} × logits {options.kd_logits}"
                      + (f" (T = {options.temperature})" if options.kd_logits == "kl" else ""))
    if options.kd_hidden:
        losses.append(f"{options.kd_hidden} × hidden-state MSE")
    if options.kd_attention:
        losses.append(f"{options.kd_attention} × attention MSE (encoder self, decoder self, cross)")
    lines.append(f"Data: `{options.data}`. Loss: {' + '.join(losses)}.")
    if "steps" in metrics:
        lines.append(f"{metrics['steps']} steps ({metrics['epochs']} epochs), AdamW lr {options.lr}, batch "
                     f"{options.batch_size} × {options.grad_accum}, {metrics['tokens_per_second']:.0f} tokens/s.")
    else:
        lines.append("Not trained (`--max-steps 0`): the layers as copied.")
    if "validation" in metrics:
        v = metrics["validation"]
        lines += ["", "## Validation", "", f"On `{options.validation}` (first {options.eval_limit} documents), "
                  f"best step {v['step']} by {options.metric}:", "",
                  "| ROUGE-1 | ROUGE-2 | ROUGE-L | ROUGE-Lsum | BLEU | chrF |", "|---|---|---|---|---|---|",
                  f"| {v['rouge1']:.2f} | {v['rouge2']:.2f} | {v['rougeL']:.2f} | {v['rougeLsum']:.2f} | "
                  f"{v.get('bleu', float('nan')):.2f} | {v.get('chrf', float('nan')):.2f} |"]
    return "\n".join(lines) + "\n"
