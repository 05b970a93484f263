"""`quantize`: DQ-BART, direct or distillation-aware, stored as integers.

`direct` quantizes a trained model as it is (the paper's baseline, which collapses at low bits).
`distill` is distillation-aware quantization (section 2.3): the full-precision model (or
`--teacher`) teaches a student that keeps full-precision latent weights, runs its forward pass
quantized and learns through straight-through gradients, with task cross-entropy plus MSE on
logits, attention and hidden states (unweighted by default). `--encoder-layers` / `--decoder-layers`
shrink at the same time (the "Distillation-Aware Quantization + Distillation" rows). Training is
`distill`'s loop, reused.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from modelshrink.artifacts import ArtifactWriter, parent_ref
from modelshrink.errors import UserError
from modelshrink.quant.modules import check_quantizable, parse_bits, quantize_model
from modelshrink.quant.model import save_quantized


@dataclass
class QuantizeOptions:
    model: str
    bits: str = "8-8-8"
    method: str = "distill"
    granularity: str = "tensor"
    allow_low_activation_bits: bool = False
    teacher: str | None = None
    data: str | None = None
    # distill's options for --method distill (names as on distill's command line)
    training: dict[str, Any] = field(default_factory=dict)
    device: str = "auto"
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        self.spec = parse_bits(self.bits, self.allow_low_activation_bits, self.granularity)
        if self.method not in ("direct", "distill"):
            raise UserError(f"--method must be direct or distill, got {self.method}")
        if self.method == "distill" and self.data is None:
            raise UserError("--method distill trains: give --data (and a budget, --max-steps or --epochs)")
        if self.method == "direct" and (self.data or self.teacher or self.training.get("encoder_layers")
                                        or self.training.get("decoder_layers")):
            raise UserError("--method direct quantizes the model as it is: --data, --teacher and layer counts go "
                            "with --method distill")

    def recorded(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(d.pop("training"))
        return d


def storage_metrics(folder: Path, model: Any, teacher_params: int) -> dict[str, Any]:
    """Parameters, bytes on disk, and the compression ratio as DQ-BART Table 1 computes it: the
    float32 size of the full-precision model we started from over the stored size."""
    from modelshrink.efficiency import parameter_count, weight_bytes

    stored = weight_bytes(folder)
    return {"parameters": parameter_count(model), "bytes_on_disk": stored,
            "float32_reference_bytes": 4 * teacher_params,
            "compression_ratio": round(4 * teacher_params / stored, 3) if stored else None}


def quantize(options: QuantizeOptions, output: str | Path, *, overwrite: bool = False, resume: bool = False,
             progress: Callable[[dict[str, Any]], None] | None = None,
             log: Callable[[str], None] = lambda m: None) -> Path:
    from modelshrink.efficiency import parameter_count
    from modelshrink.models import load_classifier, load_config, load_seq2seq, resolve_device

    from modelshrink.quant.model import is_quantized

    spec = options.spec
    config = load_config(options.model, "model", options.trust_remote_code)
    kind = check_quantizable(config)
    if is_quantized(config):
        if options.method == "direct":
            raise UserError(f"{options.model} is already quantized; quantize its full-precision original")
        if options.teacher is None or is_quantized(load_config(options.teacher, "teacher")):
            raise UserError(f"{options.model} is already quantized, so it cannot teach itself; give a "
                            "full-precision --teacher")
    if options.method == "direct":
        writer = ArtifactWriter(output, overwrite=overwrite)
        writer.check()
        device = resolve_device(options.device)
        if kind == "seq2seq":
            model, tokenizer, _ = load_seq2seq(options.model, "model", options.trust_remote_code, device)
        else:
            model, tokenizer = load_classifier(options.model, "model", options.trust_remote_code, device)
        float_params = parameter_count(model)
        counts = quantize_model(model, spec)
        log(f"quantized {counts['linear']} linear layers, {counts['embedding']} embedding modules, "
            f"{counts['lm_head']} LM head ({spec.label}, {spec.granularity})")
        with writer:
            save_quantized(model, tokenizer, writer.staging, spec)
            metrics = {**storage_metrics(writer.staging, model, float_params), "modules": counts}
            (writer.staging / "README.md").write_text(_card(output, options, metrics))
            return writer.commit(step="quantize", kind="model", options=options.recorded(),
                                 parents=[parent_ref("model", options.model)], metrics=metrics,
                                 resolved={"bits": asdict(spec), "kind": kind})
    classifier_keys = ("text_column", "text_pair_column", "label_column")
    if kind != "seq2seq":
        return _quantize_classifier(options, output, overwrite=overwrite, resume=resume, progress=progress, log=log)
    if any(options.training.get(k) for k in ("text_pair_column", "label_column")):
        raise UserError("--text-pair-column / --label-column are for classifiers; this is a seq2seq model")
    from modelshrink.distill import DistillOptions, distill

    teacher = options.teacher or options.model
    shrinking = options.training.get("encoder_layers") or options.training.get("decoder_layers")
    defaults = dict(kd_logits="mse", kd_logits_weight=1.0, kd_hidden=1.0, kd_attention=1.0, label_smoothing=0.0)
    distill_options = DistillOptions(data=options.data, teacher=teacher,
                                     student=None if shrinking else options.model, device=options.device,
                                     trust_remote_code=options.trust_remote_code,
                                     **{**defaults, **{k: v for k, v in options.training.items()
                                                       if k not in classifier_keys[1:]}})
    teacher_params = parameter_count(load_seq2seq(teacher, "teacher", options.trust_remote_code)[0])
    counts: dict[str, int] = {}

    def prepare(model: Any) -> None:
        counts.update(quantize_model(model, spec))

    def describe(folder: Path, model: Any, metrics: dict[str, Any]) -> dict[str, Any]:
        return {**storage_metrics(folder, model, teacher_params), "modules": counts}

    return distill(distill_options, output, overwrite=overwrite, resume=resume, progress=progress, log=log,
                   step="quantize", prepare_student=prepare,
                   save_student=lambda model, tokenizer, folder: save_quantized(model, tokenizer, folder, spec),
                   describe=describe, recorded=options.recorded())


CLASSIFIER_TRAINING = ("kd_logits_weight", "kd_hidden", "kd_attention", "max_steps", "epochs", "lr", "warmup_steps",
                       "batch_size", "grad_accum", "seed", "validation", "eval_every", "eval_limit", "save_every",
                       "log_every", "max_source_length", "limit", "text_column", "text_pair_column", "label_column",
                       "label_smoothing")


def _quantize_classifier(options: QuantizeOptions, output: str | Path, *, overwrite: bool, resume: bool,
                         progress: Callable[[dict[str, Any]], None] | None, log: Callable[[str], None]) -> Path:
    """Distillation-aware quantization of a sequence classifier: the full-precision classifier teaches
    its quantized copy (task loss + MSE on logits, hidden states and attention), through the shared loop."""
    import json
    import shutil

    from modelshrink import classify
    from modelshrink.distill import _same_tokenizer
    from modelshrink.efficiency import parameter_count
    from modelshrink.models import load_classifier, resolve_device, task_of
    from modelshrink.quant.model import save_quantized
    from modelshrink.train import TrainOptions, keep_best, open_run, start_run, train

    t = dict(options.training)
    unknown = sorted(set(t) - set(CLASSIFIER_TRAINING))
    if unknown:
        raise UserError(f"{', '.join('--' + k.replace('_', '-') for k in unknown)} do not apply to classifiers")
    spec = options.spec
    accelerator, writer = start_run(Path(output), resolve_device(options.device), overwrite=overwrite, resume=resume)
    teacher_spec = options.teacher or options.model
    teacher, teacher_tok = load_classifier(teacher_spec, "teacher", options.trust_remote_code, "cpu")
    student, tokenizer = load_classifier(options.model, "model", options.trust_remote_code, "cpu")
    why = _same_tokenizer(teacher_tok, tokenizer)
    if why:
        raise UserError(f"teacher and student tokenizers differ ({why}); the distillation losses need the same one")
    if teacher.config.num_labels != student.config.num_labels:
        raise UserError(f"teacher has {teacher.config.num_labels} labels, the model {student.config.num_labels}")
    task = task_of(student.config)
    read = dict(text_column=t.get("text_column"), text_pair_column=t.get("text_pair_column"),
                label_column=t.get("label_column"), num_labels=student.config.num_labels,
                label2id=student.config.label2id, task=task)
    rows = classify.read_labeled(options.data, limit=t.get("limit"), **read)
    validation = classify.read_labeled(t["validation"], limit=t.get("eval_limit", 200), **read) \
        if t.get("validation") else None
    from modelshrink.shrink import spaced_layer_ids

    n_teacher, n_student = teacher.config.num_hidden_layers, student.config.num_hidden_layers
    layer_map = spaced_layer_ids(n_teacher, n_student, "encoder")
    teacher_params = parameter_count(teacher)
    counts = quantize_model(student, spec)
    if t.get("kd_attention", 1.0):
        teacher.set_attn_implementation("eager")  # the student's quantized attention returns its weights
    teacher.to(accelerator.device).eval()
    max_length = t.get("max_source_length") or min(getattr(tokenizer, "model_max_length", 512) or 512, 512)
    parents = [parent_ref("model", options.model), parent_ref("data", options.data)] + (
        [parent_ref("teacher", options.teacher)] if options.teacher else [])
    staging = open_run(accelerator, writer, options.recorded(), parents)
    train_options = TrainOptions(metric="accuracy" if task == "classification" else "pearson", device=options.device,
                                 **{k: t[k] for k in ("max_steps", "epochs", "lr", "warmup_steps", "batch_size",
                                                      "grad_accum", "seed", "eval_every", "save_every", "log_every")
                                    if k in t})

    def save_best(model: Any, folder: Path) -> None:
        shutil.rmtree(folder, ignore_errors=True)
        save_quantized(model, tokenizer, folder, spec)

    result = train(student, classify.tokenize_labeled(rows, tokenizer, max_length),
                   classify.make_collate(tokenizer.pad_token_id),
                   classify.make_loss(teacher, t.get("kd_logits_weight", 1.0), t.get("kd_hidden", 1.0),
                                      t.get("kd_attention", 1.0), layer_map, t.get("label_smoothing", 0.0)),
                   train_options, staging, accelerator=accelerator,
                   validate=classify.make_validate(validation, tokenizer, train_options.batch_size,
                                                   accelerator.device, max_length) if validation else None,
                   save_best=save_best, resume=resume, progress=progress, log=log)
    student = accelerator.unwrap_model(student)
    if not accelerator.is_main_process:
        return Path(output)
    keep_best(staging, result, lambda folder: save_quantized(student, tokenizer, folder, spec))
    metrics = {**storage_metrics(staging, student, teacher_params), "modules": counts, "steps": result.steps,
               "tokens_per_second": result.tokens_per_second, "final_loss": result.final_loss}
    if result.validation is not None:
        metrics["validation"] = {"step": result.best["step"], **result.validation}
        (staging / "validation.json").write_text(json.dumps(metrics["validation"], indent=2) + "\n")
    (staging / "README.md").write_text(_card(output, options, metrics))
    return writer.commit(step="quantize", kind="model", options=options.recorded(), parents=parents, metrics=metrics,
                         resolved={"bits": asdict(spec), "kind": "classifier", "task": task, "layer_map": layer_map})


def _card(output: str | Path, options: QuantizeOptions, metrics: dict[str, Any]) -> str:
    return "\n".join([
        f"# {Path(output).name}", "",
        f"`{options.model}` quantized by modelshrink (`quantize --method {options.method} --bits {options.bits}`). "
        "The weights "
        "are stored as integers; load it with modelshrink (`eval`, `export`, or `modelshrink.quant.model."
        "load_quantized`): plain `transformers.from_pretrained` finds no weights file it knows and fails.", "",
        f"Parameters: {metrics['parameters']:,}. Bytes on disk: {metrics['bytes_on_disk']:,} "
        f"({metrics['compression_ratio']}× smaller than the float32 model).", ""])
