"""`quantize`: DQ-BART, direct or distillation-aware, stored as integers.

`direct` quantizes a trained model as it is (the paper's baseline, which collapses at low bits).
`distill` is distillation-aware quantization (section 2.3): the full-precision model (or
`--teacher`) teaches a student that keeps full-precision latent weights, runs its forward pass
quantized and learns through straight-through gradients, with task cross-entropy plus MSE on
logits, attention and hidden states (unweighted by default). `--encoder-layers` / `--decoder-layers`
shrink at the same time (the "Distillation-Aware Quantization + Distillation" rows). Training uses
`distill`'s data, losses and validation, and the shared loop.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, Callable, NamedTuple

from modelshrink.artifacts import ArtifactWriter, parent_ref
from modelshrink.cards import commit_model
from modelshrink.errors import UserError
from modelshrink.metrics.names import CLASSIFIER_METRICS, SEQ2SEQ_METRICS
from modelshrink.models.loading import ModelSource
from modelshrink.options.batching import resolve_batching
from modelshrink.options.distill import DistillOptions
from modelshrink.options.quantize import QuantizeOptions
from modelshrink.quant.model import save_quantized
from modelshrink.quant.modules import check_quantizable, per_tensor_widths, quantize_model, weights_once
from modelshrink.runtime.inputs import model_prefix
from modelshrink.steps import bit_budget
from modelshrink.training.reading import settle_reading
from modelshrink.training.runs import TrainingRun, finished, parent_refs, reproduce_section, save_best_with, training_metrics
from modelshrink.training.loop import enable_gradient_checkpointing, place_teacher, train

__all__ = ["QuantizeOptions", "quantize", "storage_metrics"]


class Models(NamedTuple):
    """The model to quantize and its full-precision teacher (the model itself without --teacher), each resolved
    once when the step starts."""

    model: ModelSource
    teacher: ModelSource


STORED_AS_INTEGERS = ("Weights stored as integers: load with modelshrink (`eval`, `export`, `modelshrink.quant.model."
                      "load_quantized`); plain `transformers.from_pretrained` finds no weights file it knows and fails.")
# Options that only a seq2seq model reads, and only a classifier reads.
SEQ2SEQ_ONLY = ("encoder_layers", "decoder_layers", "summary_column", "num_beams", "max_length", "max_target_length",
                "prefix", "target_lang", "source_lang")
CLASSIFIER_ONLY = ("text_pair_column", "label_column")


def nominal_bytes(folder: Path, stored: int) -> int:
    """The size of a quantized artifact if every b-bit code took exactly b bits, as DQ-BART counts
    (the packing stores ternary codes at 1.6 bits, 3-bit codes at 4 and 5-7-bit codes at 8)."""
    from modelshrink.quant.packing import packed_bytes

    config = json.loads((Path(folder) / "config.json").read_text())
    for info in (config.get("quantization_config") or {}).get("tensors", {}).values():
        numel = math.prod(info["shape"])
        stored += -(-numel * info["bits"] // 8) - packed_bytes(numel, info["bits"])
    return stored


def storage_metrics(folder: Path, model: Any, teacher_params: int) -> dict[str, Any]:
    """Parameters, bytes on disk, and the compression ratio as DQ-BART Table 1 computes it: the
    float32 size of the full-precision model we started from over the stored size; the same at the
    nominal bit widths (`nominal_bytes`), which is what the paper's sizes count."""
    from modelshrink.models.efficiency import parameter_count, weight_bytes

    stored = weight_bytes(folder)
    nominal = nominal_bytes(folder, stored)
    return {"parameters": parameter_count(model), "bytes_on_disk": stored,
            "float32_reference_bytes": 4 * teacher_params,
            "compression_ratio": round(4 * teacher_params / stored, 3) if stored else None,
            "bytes_at_nominal_bits": nominal,
            "compression_ratio_at_nominal_bits": round(4 * teacher_params / nominal, 3) if nominal else None}


def _card_head(output: str | Path, options: QuantizeOptions, metrics: dict[str, Any]) -> list[str]:
    return [
        f"# {Path(output).name}", "",
        f"`{options.model}` quantized by modelshrink (`quantize --method {options.method} --bits {options.bits}`). "
        + STORED_AS_INTEGERS, "",
        f"Parameters: {metrics['parameters']:,}. Bytes on disk: {metrics['bytes_on_disk']:,} "
        f"({metrics['compression_ratio']}× smaller than the float32 model).", ""]


def _check_model(options: QuantizeOptions) -> tuple[str, Models]:
    """'seq2seq' or 'classifier', and the model and teacher resolved once (the model teaches itself without
    --teacher); refuses a model that is quantized already and would teach itself."""
    from modelshrink.models.loading import resolve

    model = resolve(options.model, "model", options.trust_remote_code, options.allow_pickle)
    kind = check_quantizable(model.config)
    teacher = model if options.teacher is None else resolve(options.teacher, "teacher", options.trust_remote_code,
                                                             options.allow_pickle)
    if model.quantized:
        if options.method == "direct":
            raise UserError(f"{options.model} is already quantized; quantize its full-precision original")
        if teacher.quantized:
            raise UserError(f"{options.model} is already quantized, so it cannot teach itself; give a "
                            "full-precision --teacher")
    return kind, Models(model, teacher)


def quantize(options: QuantizeOptions, output: str | Path, *, overwrite: bool = False, resume: bool = False,
             progress: Callable[[dict[str, Any]], None] | None = None,
             log: Callable[[str], None] = lambda m: None) -> Path:
    """Quantize `options.model` (directly, or by distillation-aware training) into an artifact; returns its path.
    The function behind `modelshrink quantize`.

    ```python
    import modelshrink
    from modelshrink import QuantizeOptions

    # DQ-BART 2-2-8: ternary weights and embeddings, 8-bit activations,
    # the float model teaching
    options = QuantizeOptions(model="student", bits="2-2-8", data="labels",
                              epochs=3)
    small = modelshrink.quantize(options, "student-228")
    ```
    """
    from modelshrink.models.loading import resolve_device

    if options.method == "distill":
        options = resolve_batching(options, resolve_device(options.device))
    elif options.budget_mb is not None:  # direct: only the budget's calibration sample is batched, by a count
        options = resolve_batching(options, "cpu")
    kind, models = _check_model(options)
    if options.method == "direct":
        return quantize_direct(options, output, kind, models, overwrite=overwrite, resume=resume, log=log)
    if kind == "seq2seq":
        return quantize_seq2seq(options, output, models, overwrite=overwrite, resume=resume, progress=progress,
                                log=log)
    return quantize_classifier(options, output, models, overwrite=overwrite, resume=resume, progress=progress,
                               log=log)


def quantize_direct(options: QuantizeOptions, output: str | Path, kind: str, models: Models, *,
                    overwrite: bool, resume: bool, log: Callable[[str], None]) -> Path:
    """The model as it is, quantized (no training). `resume` keeps a complete output as it is (nothing
    to continue: an interrupted direct run left nothing behind)."""
    from modelshrink.models.efficiency import parameter_count
    from modelshrink.models.loading import load_classifier, load_seq2seq, resolve_device

    if finished(output, overwrite=overwrite, resume=resume, log=log, recorded=options.recorded()):
        return Path(output)
    spec = options.spec
    writer = ArtifactWriter(output, overwrite=overwrite)
    writer.check()
    device = resolve_device(options.device)
    resolved: dict[str, Any] = {}
    if kind == "seq2seq":
        model, tokenizer, _ = load_seq2seq(models.model, device=device)
        if options.budget_mb is not None:  # its calibration reads documents as the model does
            resolved = settle_reading(model, tokenizer, options, f"model {options.model}", log)
    else:
        model, tokenizer = load_classifier(models.model, device=device)
    float_params = parameter_count(model)
    plan = None
    if options.budget_mb is not None:  # the model as it is teaches its quantized self on the calibration sample
        spec, plan, counts = _direct_plan(options, kind, models.model, model, tokenizer, device, log)
    else:
        counts = _quantize_modules(model, options, log)
    log(f"quantized {counts['linear']} linear layers, {counts['embedding']} embedding modules, "
        f"{counts['lm_head']} LM head ({spec.base_label if plan else spec.label}, {spec.granularity}"
        + (f", activations clamped to +-{spec.activation_clip})" if spec.activation_clip else ")"))
    parents = [parent_ref("model", options.model)] + ([parent_ref("data", options.data)] if plan else [])
    with writer:
        save_quantized(model, tokenizer, writer.staging, spec)
        metrics = {**storage_metrics(writer.staging, model, float_params), "modules": counts}
        if plan is not None:
            plan.save(writer.staging)
            metrics["bit_plan"] = bit_budget.plan_metrics(plan, writer.staging)
        card = _card_head(output, options, metrics) + bit_budget.plan_card(plan) + reproduce_section(options, output, parents)
        (writer.staging / "README.md").write_text("\n".join(card) + "\n")
        return commit_model(writer, step="quantize", options=options.recorded(), parents=parents,
                            metrics=metrics, resolved={"bits": asdict(spec), "kind": kind, **resolved})


def _quantize_modules(model: Any, options: QuantizeOptions, log: Callable[[str], None]) -> dict[str, int]:
    """`model`'s modules quantized to --bits (no budget), with the note on per-tensor scales where it applies."""
    counts = quantize_model(model, options.spec)
    note = options.scale_note(per_tensor_widths(model))
    if note:
        log(note)
    return counts


def _direct_plan(options: QuantizeOptions, kind: str, source: ModelSource, model: Any, tokenizer: Any, device: str,
                 log: Callable[[str], None]):
    """--method direct --budget-mb: a second, full-precision copy of the model gives the calibration's targets."""
    from modelshrink.training import classify
    from modelshrink.models.loading import load_classifier, load_seq2seq, source_length
    from modelshrink.training.seq2seq import read_pairs

    if kind == "seq2seq":
        teacher, _, _ = load_seq2seq(source, device=device)
        rows = read_pairs(options.data, options.split, options, options.limit)
        length = source_length(options.max_source_length, tokenizer, model.config)

        def objective(sample: list[Any]) -> Any:
            return bit_budget.seq2seq_objective(sample, tokenizer, teacher.eval(), length, options.max_target_length,
                                                options.batch_size, device, prefix=model_prefix(model.config))
    else:
        teacher, tokenizer = load_classifier(source, device=device)
        rows, _ = _classifier_rows(options, teacher.config)
        length = source_length(options.max_source_length, tokenizer, model.config)

        def objective(sample: list[Any]) -> Any:
            return bit_budget.classifier_objective(classify.tokenize_labeled(sample, tokenizer, length),
                                                   tokenizer.pad_token_id, teacher.eval(), options.batch_size, device)
    return bit_budget.quantize_within_budget(options, model, objective, rows, None, log)


# ---------------------------------------------------------------- seq2seq: DQ-BART 2.3

def distillation_settings(options: QuantizeOptions) -> DistillOptions:
    """The student, losses and validation this quantization trains with, as distill's functions read
    them: the model (or its copied layers, when shrinking) learns from the full-precision teacher with
    MSE on logits, hidden states and attention."""
    if any(getattr(options, k) for k in CLASSIFIER_ONLY):
        raise UserError("--text-pair-column / --label-column are for classifiers; this is a seq2seq model")
    if options.metric is not None and options.metric not in SEQ2SEQ_METRICS:
        raise UserError(f"--metric {options.metric} is for classifiers; a seq2seq model is validated by ROUGE, "
                        "BLEU and chrF")
    shrinking = options.encoder_layers or options.decoder_layers
    shared = {f.name for f in fields(DistillOptions)} & {f.name for f in fields(QuantizeOptions)}
    values = {name: getattr(options, name) for name in shared}
    values.update(teacher=options.teacher or options.model, student=None if shrinking else options.model,
                  kd_logits="mse", metric=options.metric or "rouge2")
    return DistillOptions(**values)


def quantize_seq2seq(options: QuantizeOptions, output: str | Path, models: Models, *,
                     overwrite: bool, resume: bool,
                     progress: Callable[[dict[str, Any]], None] | None, log: Callable[[str], None]) -> Path:
    """Distillation-aware quantization of a seq2seq model (optionally shrunk at the same time)."""
    from modelshrink.models.loading import resolve_device, source_length
    from modelshrink.training.seq2seq import read_pairs_for, train_seq2seq
    from modelshrink.steps.distill import model_card
    from modelshrink.training.students import build_student, check_widths, student_metrics

    settings = distillation_settings(options)
    run = TrainingRun("quantize", options, output, overwrite=overwrite, resume=resume, log=log)
    if run.finished():
        return run.output
    device = resolve_device(options.device)
    accelerator = run.start(device)
    rows, validation_rows = read_pairs_for(settings)
    shrinking = settings.student is None
    built = build_student(settings, device, log, teacher=models.teacher, student=None if shrinking else models.model)
    student, tokenizer = built["student"], built["tokenizer"]
    reading = settle_reading(student, tokenizer, settings, "the quantized model", log)
    check_widths(built["teacher"], student, settings)
    max_source_length = source_length(settings.max_source_length, tokenizer, student.config)
    spec, plan = options.spec, None
    if options.budget_mb is not None:
        spec, plan, counts = _seq2seq_plan(options, settings, built, rows, max_source_length,
                                           run.staging if resume else None, accelerator, log)
    else:
        counts = _quantize_modules(student, options, log)
    if options.gradient_checkpointing:
        enable_gradient_checkpointing(student)
    staging = run.open(parent_refs(("data", settings.data), ("teacher", settings.teacher),
                                   ("student", settings.student), ("validation", settings.validation)))
    if plan is not None and run.main:
        plan.save(staging)

    def save(model: Any, folder: Path) -> None:
        save_quantized(model, tokenizer, folder, spec)

    result = None
    if options.max_steps != 0:
        student, result = train_seq2seq(settings, built, rows, validation_rows, max_source_length, staging,
                                        accelerator, save, resume=resume, progress=progress, log=log,
                                        hparams=options.recorded())
    if not run.main:
        return run.output
    run.keep_best(result, lambda folder: save(student, folder))
    metrics = student_metrics(student, built["teacher"], result)
    metrics.update({**storage_metrics(staging, student, metrics["teacher_parameters"]), "modules": counts})
    if plan is not None:
        metrics["bit_plan"] = bit_budget.plan_metrics(plan, staging, result.seconds if result else None)
    card = model_card(settings, run.output, built["origin"], metrics, "quantize", STORED_AS_INTEGERS)
    return run.commit(result, metrics=metrics, card=card + "\n".join(bit_budget.plan_card(plan)), metric=settings.metric,
                      resolved={"bits": asdict(spec), "kind": "seq2seq", **reading, "layer_map": built["maps"],
                                "max_source_length": max_source_length})


def _seq2seq_plan(options: QuantizeOptions, settings: DistillOptions, built: dict[str, Any], rows: list[Any],
                  max_source_length: int, staging: Path | None, accelerator: Any, log: Callable[[str], None]):
    """--budget-mb on a seq2seq student: the teacher's logits are the calibration's targets."""

    teacher, student, tokenizer = built["teacher"], built["student"], built["tokenizer"]
    device = accelerator.device
    student.to(device)

    def objective(sample: list[Any]) -> Any:
        return bit_budget.seq2seq_objective(sample, tokenizer, teacher.to(device).eval(), max_source_length,
                                            settings.max_target_length, settings.batch_size, device,
                                            built.get("vocab_map"), model_prefix(student.config))

    return bit_budget.quantize_within_budget(options, student, objective, rows, staging, log, accelerator)


# ---------------------------------------------------------------- classifiers

def _classifier_metric(options: QuantizeOptions, task: str) -> str:
    if options.metric is None:
        return "accuracy" if task == "classification" else "pearson"
    if options.metric not in CLASSIFIER_METRICS:
        raise UserError(f"--metric {options.metric} is for seq2seq models; a classifier is validated by "
                        f"{', '.join(CLASSIFIER_METRICS)}")
    return options.metric


def _classifier_rows(options: QuantizeOptions, config: Any) -> tuple[list[Any], list[Any] | None]:
    """The labelled training rows of --data and the validation rows (None without --validation)."""
    from modelshrink.training import classify
    from modelshrink.models.loading import task_of

    read = dict(text_column=options.text_column, text_pair_column=options.text_pair_column,
                label_column=options.label_column, num_labels=config.num_labels, label2id=config.label2id,
                task=task_of(config))
    rows = classify.read_labeled(options.data, limit=options.limit, **read)
    validation = (classify.read_labeled(options.validation, limit=options.eval_limit, **read)
                  if options.validation else None)
    return rows, validation


def _classifier_pair(models: Models, options: QuantizeOptions, log: Callable[[str], None]) -> tuple[Any, ...]:
    """(teacher, student, tokenizer, rows, validation rows), refused in one line where labels or tokenizers differ (a
    model trimmed from the teacher's vocabulary, `contrastive --trim-vocab`, gets a teacher that reads its ids)."""
    from modelshrink.models.loading import load_classifier, tokenizer_mismatch
    from modelshrink.models.vocabulary import reading_student_ids, split_otherwise

    (teacher, teacher_tok), (student, tokenizer) = load_classifier(models.teacher), load_classifier(models.model)
    if why := tokenizer_mismatch(teacher_tok, tokenizer):
        teacher = reading_student_ids(teacher, teacher_tok, tokenizer, why)
    if teacher.config.num_labels != student.config.num_labels:
        raise UserError(f"teacher has {teacher.config.num_labels} labels, the model {student.config.num_labels}")
    rows, validation = _classifier_rows(options, student.config)
    if why:  # words the trimmed vocabulary lacks reach the teacher in the student's pieces
        split, n = split_otherwise(teacher_tok, tokenizer, (t for r in rows for t in (r["text"], r["text_pair"])))
        log(f"teacher: reads the trimmed model's ids; {split:,} of {n:,} training texts tokenize otherwise in its own "
            "tokenizer (words the trimmed vocabulary lacks)")
    return teacher, student, tokenizer, rows, validation


def _classifier_plan(options: QuantizeOptions, teacher: Any, student: Any, tokenizer: Any, rows: list[Any],
                     max_length: int, run: TrainingRun):
    """--budget-mb on a classifier: the full-precision classifier's logits are the calibration's targets."""
    from modelshrink.training import classify

    device = run.accelerator.device
    student.to(device)

    def objective(sample: list[Any]) -> Any:
        return bit_budget.classifier_objective(classify.tokenize_labeled(sample, tokenizer, max_length),
                                               tokenizer.pad_token_id, teacher.to(device).eval(), options.batch_size,
                                               device)

    return bit_budget.quantize_within_budget(options, student, objective, rows,
                                             run.staging if run.resume else None, run.log, run.accelerator)


def quantize_classifier(options: QuantizeOptions, output: str | Path, models: Models, *,
                        overwrite: bool, resume: bool,
                        progress: Callable[[dict[str, Any]], None] | None, log: Callable[[str], None]) -> Path:
    """Distillation-aware quantization of a sequence classifier: the full-precision classifier teaches
    its quantized copy (task loss + MSE on logits, hidden states and attention), through the shared loop."""

    from modelshrink.training import classify
    from modelshrink.models.efficiency import parameter_count
    from modelshrink.families import encoder_layer_count
    from modelshrink.models.loading import resolve_device, source_length, task_of
    from modelshrink.models.shrink import spaced_layer_ids

    defaults = {f.name: f.default for f in fields(QuantizeOptions)}
    given = [k for k in SEQ2SEQ_ONLY if getattr(options, k) != defaults[k]]
    if given:
        raise UserError(f"{', '.join('--' + k.replace('_', '-') for k in given)} do not apply to classifiers")
    run = TrainingRun("quantize", options, output, overwrite=overwrite, resume=resume, log=log)
    if run.finished():
        return run.output
    accelerator = run.start(resolve_device(options.device))
    teacher, student, tokenizer, rows, validation = _classifier_pair(models, options, log)
    task = task_of(student.config)
    layer_map = spaced_layer_ids(encoder_layer_count(teacher.config), encoder_layer_count(student.config), "encoder")
    teacher_params = parameter_count(teacher)
    max_length = source_length(options.max_source_length, tokenizer, student.config)
    spec, plan = options.spec, None
    if options.budget_mb is not None:
        spec, plan, counts = _classifier_plan(options, teacher, student, tokenizer, rows, max_length, run)
    else:
        counts = _quantize_modules(student, options, log)
    if options.gradient_checkpointing:
        enable_gradient_checkpointing(student)
    if options.kd_attention:
        teacher.set_attn_implementation("eager")  # the student's quantized attention returns its weights
    teacher = place_teacher(teacher, accelerator.device, options.precision, options.compile)
    staging = run.open(parent_refs(("model", options.model), ("data", options.data), ("teacher", options.teacher)))
    if plan is not None and run.main:
        plan.save(staging)
    train_options = options.train_options()
    train_options.metric = _classifier_metric(options, task)

    def save(model: Any, folder: Path) -> None:
        save_quantized(model, tokenizer, folder, spec)

    result = train(student, classify.tokenize_labeled(rows, tokenizer, max_length),
                   classify.make_collate(tokenizer.pad_token_id),
                   classify.make_loss(teacher, options.kd_logits_weight, options.kd_hidden, options.kd_attention,
                                      layer_map, options.label_smoothing),
                   train_options, staging, accelerator=accelerator,
                   validate=classify.make_validate(validation, tokenizer, train_options.batch_size,
                                                   accelerator.device, max_length) if validation else None,
                   save_best=save_best_with(save), resume=resume, progress=progress, log=log,
                   hparams=options.recorded(), step_context=weights_once)
    student = accelerator.unwrap_model(student)
    if not run.main:
        return run.output
    run.keep_best(result, lambda folder: save(student, folder))
    metrics = {**storage_metrics(staging, student, teacher_params), "modules": counts, **training_metrics(result)}
    if plan is not None:
        metrics["bit_plan"] = bit_budget.plan_metrics(plan, staging, result.seconds)
    card = "\n".join(_card_head(run.output, options, metrics) + bit_budget.plan_card(plan))
    return run.commit(result, metrics=metrics, card=card, metric=train_options.metric,
                      resolved={"bits": asdict(spec), "kind": "classifier", "task": task, "layer_map": layer_map})
