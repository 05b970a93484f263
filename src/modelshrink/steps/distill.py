"""`distill`: shrink a teacher into a student (copied layers) and train it; or fine-tune a model.

The student is trained on gold summaries or on `pseudolabel` output (sequence-level distillation,
PLATE section 3.2) with label-smoothed cross-entropy, optionally plus word-level distillation
losses against the teacher (DQ-BART section 2.2, Appendix B): logits (KL with temperature, or
MSE), hidden states and attention (encoder self, decoder self, cross), each student layer matched to
the teacher layer it was copied from (the map φ).
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.nn.utils import parametrize

from modelshrink._version import __version__
from modelshrink.cards import commit_model
from modelshrink.data import examples, open_data, pick_columns
from modelshrink.errors import UserError
from modelshrink.families import attention_heads, hidden_size
from modelshrink.options.distill import DistillOptions
from modelshrink.runs import (finished, keep_best, open_run, parent_refs, reproduce_section, save_best_with,
                              start_run, training_metrics, write_validation)
from modelshrink.train import TrainResult, enable_gradient_checkpointing, place_teacher, run_facts, train


# ---------------------------------------------------------------- models

def check_widths(teacher: Any, student: Any, options: DistillOptions) -> None:
    """Hidden-state and attention losses compare tensors: the student must have the teacher's width and heads."""
    if teacher is None or not options.word_level or not (options.kd_hidden > 0 or options.kd_attention > 0):
        return
    dims = [(hidden_size(m.config), attention_heads(m.config)) for m in (student, teacher)]
    if dims[0] != dims[1]:
        raise UserError(f"--kd-hidden/--kd-attention need the student's hidden size and heads to match the "
                        f"teacher's: {dims[0]} vs {dims[1]}")


def build_student(options: DistillOptions, device: str, log: Callable[[str], None]) -> dict[str, Any]:
    """Teacher (or None), student, tokenizer, layer maps and where the student came from."""
    from modelshrink.models import load_seq2seq, tokenizer_mismatch
    from modelshrink.shrink import check_layer_ids, first_layer_ids, layer_counts, shrink, spaced_layer_ids
    from modelshrink.warmstart import init_encoder_decoder

    teacher = None
    if options.teacher is not None:
        teacher, tokenizer, _ = load_seq2seq(options.teacher, "teacher", options.trust_remote_code, "cpu",
                                              allow_pickle=options.allow_pickle)
    if options.init_encoder_decoder is not None:
        encoder, _, decoder = options.init_encoder_decoder.partition(",")
        student, tokenizer = init_encoder_decoder(encoder, decoder or None, options.trust_remote_code, options.seed,
                                                  options.cross_attention_init, allow_pickle=options.allow_pickle)
        return {"teacher": None, "student": student, "tokenizer": tokenizer, "maps": None,
                "origin": {"init_encoder_decoder": options.init_encoder_decoder}}
    if options.student is not None:
        student, student_tokenizer, _ = load_seq2seq(options.student, "student", options.trust_remote_code, "cpu",
                                                              allow_pickle=options.allow_pickle)
        maps = None
        if teacher is not None and options.word_level:
            why = tokenizer_mismatch(tokenizer, student_tokenizer)
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

def read_pairs(spec: str, split: str | None, options: DistillOptions, limit: int | None) -> list[Any]:
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

def decoder_inputs(model: Any, labels: torch.Tensor) -> torch.Tensor:
    """The decoder's inputs for teacher forcing on `labels`: the model's own rule (mBART's moves the language
    code to the front), else the labels shifted right behind the decoder start token (M2M100/NLLB, whose
    forward does the same with labels), -100 read as padding."""
    if hasattr(model, "prepare_decoder_input_ids_from_labels"):
        return model.prepare_decoder_input_ids_from_labels(labels=labels)
    config = model.config
    shifted = labels.new_full(labels.shape, config.pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = config.decoder_start_token_id
    return shifted.masked_fill(shifted == -100, config.pad_token_id)


def make_loss(options: DistillOptions, teacher: Any, maps: dict[str, list[int]] | None):
    """Label-smoothed CE, plus the weighted word-level losses against the teacher.

    Without --kd-logits (and unless --no-fused-cross-entropy), the CE never materialises the logits: the
    student's forward stops before its LM head and `losses.linear_cross_entropy` takes the loss from the
    hidden state chunk by chunk (every supported family; `lm_head` says how each makes its logits). A head
    that is not a plain linear (a quantized student's) keeps the logits, and so does --kd-logits, which
    compares them; a teacher whose logits no loss reads skips its head."""
    from modelshrink import lm_head, losses
    from modelshrink.precision import torch_dtype

    need_hidden, need_attention = options.kd_hidden > 0, options.kd_attention > 0
    fused = options.fused_cross_entropy and options.kd_logits is None
    # The head's matmul in the autocast dtype, as the model's own head runs (autocast ends with the forward).
    compute_dtype = torch_dtype(options.precision)

    def cross_entropy(model: Any, core: Any, inputs: dict[str, Any], labels: torch.Tensor) -> tuple[Any, torch.Tensor]:
        head = lm_head.find(core) if fused else None
        with lm_head.bypassed(head):
            out = model(**inputs)
        if head is None:
            return out, losses.label_smoothed_cross_entropy(out.logits, labels, options.label_smoothing)
        # out.logits is the head's input here
        return out, losses.linear_cross_entropy(out.logits, head.weight, head.bias(), labels,
                                                label_smoothing=options.label_smoothing, compute_dtype=compute_dtype)

    def loss_fn(model: Any, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        core = model.module if hasattr(model, "module") else model  # DDP keeps the model in .module
        decoder_input_ids = decoder_inputs(core, batch["labels"])
        # No key/value cache: training never reuses one (and gradient checkpointing refuses it).
        inputs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      decoder_input_ids=decoder_input_ids, output_hidden_states=need_hidden,
                      output_attentions=need_attention, use_cache=False)
        out, ce = cross_entropy(model, core, inputs, batch["labels"])
        total, parts = ce, {"ce": ce.detach()}
        if teacher is not None and options.word_level:
            with torch.no_grad(), lm_head.bypassed(lm_head.find(teacher) if fused else None):
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
    """ROUGE (F1 ×100) and sacreBLEU's corpus BLEU and chrF (eval's code) of generated text on the validation
    rows: summaries and translations are validated alike, and --metric picks what keeps a checkpoint."""
    from modelshrink.generation import generate, plan_batches, resolve_generation
    from modelshrink.metrics import translation
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
        references = [r.reference for r in rows]
        scores = {k: round(float(np.mean(v)), 4) for k, v in rouge_per_document(predictions, references).items()}
        corpus = translation.corpus_scores(translation.sentence_statistics(predictions, references))
        return {**scores, **{k: round(v, 4) for k, v in corpus.items()}}

    return validate


# ---------------------------------------------------------------- shared with quantize

def read_pairs_for(options: DistillOptions) -> tuple[list[Any], list[Any] | None]:
    """Training rows and validation rows (None without --validation)."""
    train_rows = read_pairs(options.data, options.split, options, options.limit)
    validation_rows = (read_pairs(options.validation, options.validation_split, options, options.eval_limit)
                       if options.validation else None)
    return train_rows, validation_rows


def train_seq2seq(options: DistillOptions, built: dict[str, Any], rows: list[Any], validation_rows: list[Any] | None,
                  max_source_length: int, staging: Path, accelerator: Any, save: Callable[[Any, Path], None], *,
                  resume: bool, progress: Any, log: Callable[[str], None],
                  hparams: dict[str, Any] | None = None) -> tuple[Any, TrainResult]:
    """Train `built["student"]` on the pairs with distill's losses; returns the trained student and the result.
    `hparams` are what the trackers record as the run's options (quantize's own; `options.recorded()` by default)."""
    teacher, student, tokenizer = built["teacher"], built["student"], built["tokenizer"]
    attention_kernel = student.config._attn_implementation
    if options.kd_attention > 0:  # fused attention kernels do not return attention weights
        if attention_kernel in ("sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"):
            student.set_attn_implementation("eager")
        teacher.set_attn_implementation("eager")
    if teacher is not None and options.word_level:
        teacher = place_teacher(teacher, accelerator.device, options.precision)
    else:
        teacher = None  # sequence-level distillation needs no teacher at training time
    tokenized = tokenize_pairs(rows, tokenizer, max_source_length, options.max_target_length)
    validate = (make_validate(validation_rows, tokenizer, options, max_source_length, accelerator.device)
                if validation_rows else None)
    result = train(student, tokenized, make_collate(tokenizer.pad_token_id), make_loss(options, teacher, built["maps"]),
                   options.train_options(), staging, accelerator=accelerator, validate=validate,
                   save_best=save_best_with(save), resume=resume, progress=progress, log=log,
                   hparams=hparams if hparams is not None else options.recorded(),
                   # a quantized student's fake-quantized weights once per step (nothing else is parametrized)
                   step_context=parametrize.cached)
    student = accelerator.unwrap_model(student)
    student.set_attn_implementation(attention_kernel)
    return student, result


# ---------------------------------------------------------------- the step

def distill(options: DistillOptions, output: str | Path, *, overwrite: bool = False, resume: bool = False,
            progress: Callable[[dict[str, Any]], None] | None = None,
            log: Callable[[str], None] = lambda m: None) -> Path:
    """Build the student, train it, and write a model artifact; returns its path. The function behind
    `modelshrink distill`.

    Example::

        import modelshrink
        from modelshrink import DistillOptions

        # a 12-3 student (decoder layers 0, 6, 11 of the teacher) on PLATE labels, validated by ROUGE-2
        student = modelshrink.distill(DistillOptions(data="labels", teacher="teacher", decoder_layers=3, epochs=3,
                                                     validation="valid.jsonl", eval_every=500), "student")
    """
    from modelshrink.models import resolve_device, save_model, source_length

    output = Path(output)
    if finished(output, overwrite=overwrite, resume=resume, log=log, recorded=options.recorded()):
        return output
    device = resolve_device(options.device)
    accelerator, writer = start_run(output, device, overwrite=overwrite, resume=resume, precision=options.precision,
                                    trackers=options.trackers, tracking_dir=options.tracking_dir)
    rows, validation_rows = read_pairs_for(options)
    built = build_student(options, device, log)
    student, tokenizer = built["student"], built["tokenizer"]
    check_widths(built["teacher"], student, options)
    if options.gradient_checkpointing:
        enable_gradient_checkpointing(student)
    max_source_length = source_length(options.max_source_length, tokenizer, student.config)
    parents = parent_refs(("data", options.data), ("teacher", options.teacher), ("student", options.student),
                          ("validation", options.validation))
    staging = open_run(accelerator, writer, options.recorded(), parents)

    def save(model: Any, folder: Path) -> None:
        save_model(model, tokenizer, folder)

    result: TrainResult | None = None
    if options.max_steps != 0:
        student, result = train_seq2seq(options, built, rows, validation_rows, max_source_length, staging,
                                        accelerator, save, resume=resume, progress=progress, log=log)
    if not accelerator.is_main_process:
        return output

    keep_best(staging, result, lambda folder: save(student, folder))
    metrics = student_metrics(student, built["teacher"], result)
    write_validation(staging, result, options.metric)
    card = model_card(options, output, built["origin"], metrics, "distill")
    (staging / "README.md").write_text(card + "\n".join(reproduce_section(options, output, parents,
                                                                       always=("teacher", "student"))) + "\n")
    resolved = {"layer_map": built["maps"], "max_source_length": max_source_length, **run_facts(accelerator, options)}
    return commit_model(writer, step="distill", options=options.recorded(), parents=parents,
                        metrics=metrics, resolved=resolved)


def student_metrics(student: Any, teacher: Any | None, result: TrainResult | None) -> dict[str, Any]:
    from modelshrink.efficiency import parameter_count

    metrics: dict[str, Any] = {"parameters": parameter_count(student)}
    if teacher is not None:
        metrics["teacher_parameters"] = parameter_count(teacher)
        metrics["parameter_ratio"] = round(metrics["teacher_parameters"] / metrics["parameters"], 4)
    if result is not None:
        metrics.update(training_metrics(result))
    return metrics


def model_card(options: DistillOptions, output: Path, origin: dict[str, Any], metrics: dict[str, Any],
               step: str) -> str:
    """The card's description of the student and its training; the caller adds what is its own
    (the Reproduce and Lineage sections)."""
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
                  f"best step {v['step']} by {options.metric}:", "",
                  "| ROUGE-1 | ROUGE-2 | ROUGE-L | ROUGE-Lsum | BLEU | chrF |", "|---|---|---|---|---|---|",
                  f"| {v['rouge1']:.2f} | {v['rouge2']:.2f} | {v['rougeL']:.2f} | {v['rougeLsum']:.2f} | "
                  f"{v.get('bleu', float('nan')):.2f} | {v.get('chrf', float('nan')):.2f} |"]
    return "\n".join(lines) + "\n"
