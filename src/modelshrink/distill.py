"""`distill`: shrink a teacher into a student (copied layers) and train it; or fine-tune a model.

The student is trained on gold summaries or on `pseudolabel` output (sequence-level distillation,
PLATE section 3.2) with label-smoothed cross-entropy, optionally plus word-level distillation
losses against the teacher (DQ-BART section 2.2, Appendix B): logits (KL with temperature, or
MSE), hidden states and attention (encoder self, decoder self, cross), each student layer matched to
the teacher layer it was copied from (the map φ).
"""

from __future__ import annotations

import datetime as _dt
import json
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from modelshrink import __version__
from modelshrink.artifacts import parent_ref, read_manifest, replay_command
from modelshrink.data import examples, open_data, pick_columns
from modelshrink.errors import UserError
from modelshrink.train import TrainResult, keep_best, open_run, start_run, train
from modelshrink.options.distill import DistillOptions





# ---------------------------------------------------------------- models

def _dims(config: Any) -> tuple[int, int]:
    """(hidden size, attention heads) of a seq2seq config."""
    inner = getattr(config, "encoder", None) or config
    hidden = getattr(inner, "d_model", None) or getattr(inner, "hidden_size")
    heads = (getattr(inner, "encoder_attention_heads", None) or getattr(inner, "num_heads", None)
             or getattr(inner, "num_attention_heads"))
    return int(hidden), int(heads)


def _same_tokenizer(a: Any, b: Any) -> str | None:
    """Why two tokenizers differ for word-level losses (which compare distributions over ids)."""
    if len(a) != len(b):
        return f"vocabulary sizes differ ({len(a)} and {len(b)})"
    if a.get_vocab() != b.get_vocab():
        return "the same size but different token ids"
    for name in ("pad_token_id", "eos_token_id", "bos_token_id", "cls_token_id", "sep_token_id"):
        if getattr(a, name, None) != getattr(b, name, None):
            return f"different {name} ({getattr(a, name, None)} and {getattr(b, name, None)})"
    return None


def build_student(options: DistillOptions, device: str, log: Callable[[str], None]) -> dict[str, Any]:
    """Teacher (or None), student, tokenizer, layer maps and where the student came from."""
    from modelshrink.models import load_seq2seq
    from modelshrink.shrink import check_layer_ids, first_layer_ids, layer_counts, shrink, spaced_layer_ids
    from modelshrink.warmstart import init_encoder_decoder

    teacher = None
    if options.teacher is not None:
        teacher, tokenizer, _ = load_seq2seq(options.teacher, "teacher", options.trust_remote_code, "cpu")
    if options.init_encoder_decoder is not None:
        encoder, _, decoder = options.init_encoder_decoder.partition(",")
        student, tokenizer = init_encoder_decoder(encoder, decoder or None, options.trust_remote_code, options.seed,
                                                  options.cross_attention_init)
        return {"teacher": None, "student": student, "tokenizer": tokenizer, "maps": None,
                "origin": {"init_encoder_decoder": options.init_encoder_decoder}}
    if options.student is not None:
        student, student_tokenizer, _ = load_seq2seq(options.student, "student", options.trust_remote_code, "cpu")
        maps = None
        if teacher is not None and options.word_level:
            why = _same_tokenizer(tokenizer, student_tokenizer)
            if why:
                raise UserError(f"teacher and student tokenizers differ ({why}); word-level losses compare "
                                "token distributions and need the same tokenizer")
            n_enc_t, n_dec_t = layer_counts(teacher)
            n_enc_s, n_dec_s = layer_counts(student)
            maps = {"encoder": spaced_layer_ids(n_enc_t, n_enc_s, "encoder"),
                    "decoder": spaced_layer_ids(n_dec_t, n_dec_s, "decoder")}
        return {"teacher": teacher, "student": student, "tokenizer": student_tokenizer, "maps": maps,
                "origin": {"student": options.student}}
    n_enc, n_dec = layer_counts(teacher)
    pick = spaced_layer_ids if options.layer_selection == "spaced" else first_layer_ids

    def ids(count: int | None, explicit: list[int] | None, n: int, side: str) -> list[int]:
        if explicit is not None:
            return check_layer_ids(list(explicit), n, side)
        return pick(n, n if count is None else count, side)

    maps = {"encoder": ids(options.encoder_layers, options.encoder_layer_ids, n_enc, "encoder"),
            "decoder": ids(options.decoder_layers, options.decoder_layer_ids, n_dec, "decoder")}
    student = shrink(teacher, maps["encoder"], maps["decoder"])
    log(f"student: encoder layers {maps['encoder']} of {n_enc}, decoder layers {maps['decoder']} of {n_dec}")
    return {"teacher": teacher, "student": student, "tokenizer": tokenizer, "maps": maps,
            "origin": {"teacher": options.teacher, "layer_map": maps}}


# ---------------------------------------------------------------- data

def _read_pairs(spec: str, split: str | None, options: DistillOptions, limit: int | None) -> list[Any]:
    source = open_data(spec, split)
    if not source.columns:
        raise UserError(f"data {spec} has no rows")
    text, summary = pick_columns(source.columns, options.text_column, options.summary_column, need_summary=True,
                                 source=spec)
    rows = list(examples(source, text, summary, limit=limit))
    if not rows:
        raise UserError(f"data {spec} has no rows")
    return rows


def tokenize_pairs(rows: list[Any], tokenizer: Any, max_source_length: int, max_target_length: int) -> list[dict]:
    sources = tokenizer([r.document for r in rows], truncation=True, max_length=max_source_length)["input_ids"]
    targets = tokenizer(text_target=[r.reference for r in rows], truncation=True,
                        max_length=max_target_length)["input_ids"]
    return [{"input_ids": s, "labels": t, "length": len(s) + len(t)} for s, t in zip(sources, targets)]


def make_collate(pad_id: int) -> Callable[[list[dict]], dict[str, Any]]:
    def collate(batch: list[dict]) -> dict[str, Any]:
        width = max(len(b["input_ids"]) for b in batch)
        target = max(len(b["labels"]) for b in batch)
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        labels = torch.full((len(batch), target), -100, dtype=torch.long)
        for i, b in enumerate(batch):
            input_ids[i, :len(b["input_ids"])] = torch.tensor(b["input_ids"])
            mask[i, :len(b["input_ids"])] = 1
            labels[i, :len(b["labels"])] = torch.tensor(b["labels"])
        return {"input_ids": input_ids, "attention_mask": mask, "labels": labels,
                "tokens": int(mask.sum()) + int((labels != -100).sum())}

    return collate


# ---------------------------------------------------------------- the loss

def make_loss(options: DistillOptions, teacher: Any, maps: dict[str, list[int]] | None):
    """Label-smoothed CE, plus the weighted word-level losses against the teacher."""
    from modelshrink import losses

    need_hidden, need_attention = options.kd_hidden > 0, options.kd_attention > 0

    def loss_fn(model: Any, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        core = model.module if hasattr(model, "module") else model  # DDP keeps the model in .module
        decoder_input_ids = core.prepare_decoder_input_ids_from_labels(labels=batch["labels"])
        inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      decoder_input_ids=decoder_input_ids, output_hidden_states=need_hidden,
                      output_attentions=need_attention)
        out = model(**inputs)
        ce = losses.label_smoothed_cross_entropy(out.logits, batch["labels"], options.label_smoothing)
        total, parts = ce, {"ce": ce.detach()}
        if teacher is not None and options.word_level:
            with torch.no_grad():
                t = teacher(**inputs)
            target_mask = (batch["labels"] != -100).long()
            source_mask = batch["attention_mask"]
            if options.kd_logits == "kl":
                kd = losses.kd_kl(out.logits, t.logits, target_mask, options.temperature)
            elif options.kd_logits == "mse":
                kd = losses.kd_mse(out.logits, t.logits, target_mask)
            if options.kd_logits is not None:
                total = total + options.kd_logits_weight * kd
                parts["kd_logits"] = kd.detach()
            if need_hidden:
                hidden = (losses.hidden_mse(out.encoder_hidden_states, t.encoder_hidden_states, maps["encoder"],
                                            source_mask)
                          + losses.hidden_mse(out.decoder_hidden_states, t.decoder_hidden_states, maps["decoder"],
                                              target_mask))
                total = total + options.kd_hidden * hidden
                parts["kd_hidden"] = hidden.detach()
            if need_attention:
                attention = (losses.attention_mse(out.encoder_attentions, t.encoder_attentions, maps["encoder"],
                                                  source_mask, source_mask)
                             + losses.attention_mse(out.decoder_attentions, t.decoder_attentions, maps["decoder"],
                                                    target_mask, target_mask)
                             + losses.attention_mse(out.cross_attentions, t.cross_attentions, maps["decoder"],
                                                    target_mask, source_mask))
                total = total + options.kd_attention * attention
                parts["kd_attention"] = attention.detach()
        parts["loss"] = total.detach()
        return total, parts

    return loss_fn


def make_validate(rows: list[Any], tokenizer: Any, options: DistillOptions, max_source_length: int, device: Any):
    """ROUGE (F1 ×100, eval's code) of generated summaries on the validation rows."""
    from modelshrink.generation import generate, plan_batches, resolve_generation
    from modelshrink.metrics.rouge import rouge_per_document

    def validate(model: Any) -> dict[str, float]:
        settings = resolve_generation(model.generation_config, num_beams=options.num_beams,
                                      max_length=options.max_length)
        predictions: list[str | None] = [None] * len(rows)
        for batch in plan_batches(iter(rows), tokenizer, options.batch_size, max_source_length):
            padded = tokenizer.pad({"input_ids": batch.token_ids}, return_tensors="pt")
            texts = generate(model, tokenizer, padded["input_ids"].to(device), padded["attention_mask"].to(device),
                             settings)
            for example, text in zip(batch.rows, texts):
                predictions[example.index] = text
        scores = rouge_per_document(predictions, [r.reference for r in rows])
        return {k: round(float(np.mean(v)), 4) for k, v in scores.items()}

    return validate


# ---------------------------------------------------------------- the step

def distill(options: DistillOptions, output: str | Path, *, overwrite: bool = False, resume: bool = False,
            progress: Callable[[dict[str, Any]], None] | None = None, log: Callable[[str], None] = lambda m: None,
            step: str = "distill", prepare_student: Callable[[Any], Any] | None = None,
            save_student: Callable[[Any, Any, Path], Any] | None = None,
            describe: Callable[[Path, Any, dict[str, Any]], dict[str, Any]] | None = None,
            recorded: dict[str, Any] | None = None) -> Path:
    """Build the student, train it, and write a model artifact; returns its path.

    Other steps reuse this run: `prepare_student(model)` changes the student before training (e.g.
    quantization surgery), `save_student(model, tokenizer, folder)` writes it in its own format,
    `describe(folder, model, metrics)` adds metrics once it is written, and `step` / `recorded`
    name the step and the options its manifest records."""
    from modelshrink.models import default_source_length, resolve_device, save_model

    output = Path(output)
    if resume and not overwrite and read_manifest(output) is not None:
        log(f"{output} is already complete; nothing to resume")
        return output
    device = resolve_device(options.device)
    accelerator, writer = start_run(output, device, overwrite=overwrite, resume=resume)
    main = accelerator.is_main_process
    train_rows = _read_pairs(options.data, options.split, options, options.limit)
    validation_rows = (_read_pairs(options.validation, options.validation_split, options, options.eval_limit)
                       if options.validation else None)
    built = build_student(options, device, log)
    teacher, student, tokenizer, maps = built["teacher"], built["student"], built["tokenizer"], built["maps"]
    if prepare_student is not None:
        prepare_student(student)
    save = save_student or save_model
    if teacher is not None and options.word_level:
        if (options.kd_hidden > 0 or options.kd_attention > 0) and _dims(teacher.config) != _dims(student.config):
            raise UserError(f"--kd-hidden/--kd-attention need the student's hidden size and heads to match the "
                            f"teacher's: {_dims(student.config)} vs {_dims(teacher.config)}")
    max_source_length = options.max_source_length or default_source_length(tokenizer, student.config)
    parents = [parent_ref("data", options.data)] + [
        parent_ref(role, spec) for role, spec in (("teacher", options.teacher), ("student", options.student),
                                                  ("validation", options.validation)) if spec]
    staging = open_run(accelerator, writer, options.recorded(), parents)

    result: TrainResult | None = None
    if options.max_steps != 0:
        attention_kernel = student.config._attn_implementation
        if options.kd_attention > 0:  # fused attention kernels do not return attention weights
            if attention_kernel in ("sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"):
                student.set_attn_implementation("eager")
            teacher.set_attn_implementation("eager")
        if teacher is not None and options.word_level:
            teacher.to(accelerator.device).eval()
        else:
            teacher = None  # sequence-level distillation needs no teacher at training time
        tokenized = tokenize_pairs(train_rows, tokenizer, max_source_length, options.max_target_length)
        validate = (make_validate(validation_rows, tokenizer, options, max_source_length, accelerator.device)
                    if validation_rows else None)

        def save_best(model: Any, folder: Path) -> None:
            shutil.rmtree(folder, ignore_errors=True)
            save(model, tokenizer, folder)

        result = train(student, tokenized, make_collate(tokenizer.pad_token_id), make_loss(options, teacher, maps),
                       options.train_options(), staging, accelerator=accelerator, validate=validate,
                       save_best=save_best, resume=resume, progress=progress, log=log)
        student = accelerator.unwrap_model(student)
        student.set_attn_implementation(attention_kernel)
    if not main:
        return output

    keep_best(staging, result, lambda folder: save(student, tokenizer, folder))
    metrics = _metrics(student, teacher_params=_params(built["teacher"]), result=result)
    if describe is not None:
        metrics.update(describe(staging, student, metrics))
    if result is not None and result.validation is not None:
        (staging / "validation.json").write_text(json.dumps(
            {"step": result.best["step"], "metric": options.metric, **result.validation}, indent=2) + "\n")
    (staging / "README.md").write_text(model_card(options, output, built["origin"], metrics, parents, step))
    resolved = {"layer_map": maps, "max_source_length": max_source_length, "device": str(accelerator.device),
                "processes": accelerator.num_processes}
    return writer.commit(step=step, kind="model", options=recorded or options.recorded(), parents=parents,
                         metrics=metrics, resolved=resolved)


def _params(model: Any) -> int | None:
    if model is None:
        return None
    from modelshrink.efficiency import parameter_count

    return parameter_count(model)


def _metrics(student: Any, teacher_params: int | None, result: TrainResult | None) -> dict[str, Any]:
    from modelshrink.efficiency import parameter_count

    metrics: dict[str, Any] = {"parameters": parameter_count(student)}
    if teacher_params:
        metrics["teacher_parameters"] = teacher_params
        metrics["parameter_ratio"] = round(teacher_params / metrics["parameters"], 4)
    if result is not None:
        metrics.update({"steps": result.steps, "epochs": result.epochs, "train_tokens": result.train_tokens,
                        "train_seconds": result.seconds, "tokens_per_second": result.tokens_per_second,
                        "final_loss": result.final_loss})
        if result.best is not None:
            metrics["validation"] = {"step": result.best["step"], **result.validation}
    return metrics


def model_card(options: DistillOptions, output: Path, origin: dict[str, Any], metrics: dict[str, Any],
               parents: list[dict[str, Any]], step: str = "distill") -> str:
    lines = [f"# {output.name}", "",
             f"Made by modelshrink {__version__} (`{step}`) on "
             f"{_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d')}. "
             + ("Weights stored as integers: load with modelshrink (`eval`, `export`, `modelshrink.quant.model."
                "load_quantized`); plain `transformers.from_pretrained` finds no weights file it knows and fails."
                if step == "quantize" else "A `save_pretrained` folder: plain `transformers` loads it."),
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
                  f"best step {v['step']} by {options.metric}:", "", "| ROUGE-1 | ROUGE-2 | ROUGE-L | ROUGE-Lsum |",
                  "|---|---|---|---|", f"| {v['rouge1']:.2f} | {v['rouge2']:.2f} | {v['rougeL']:.2f} | "
                  f"{v['rougeLsum']:.2f} |"]
    lines += ["", "## Reproduce", "", "```bash", replay_command("distill", options, output), "```", "", "## Lineage", ""]
    for p in parents:
        pin = p.get("manifest_sha256") or p.get("sha256")
        lines.append(f"- {p['role']}: `{p.get('path') or p.get('hub')}`" + (f" (sha256 {pin[:12]}…)" if pin else ""))
    return "\n".join(lines) + "\n"
