"""Training a seq2seq student, shared by `distill` and `quantize`: pairs read and tokenized, batches, the loss
(label-smoothed cross-entropy plus the word-level distillation losses against the teacher, each student layer
matched to the teacher layer it was copied from), validation by ROUGE, BLEU and chrF, and the loop around them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from modelshrink.data import examples, open_data, pick_columns
from modelshrink.errors import UserError
from modelshrink.runtime.inputs import model_prefix, with_prefix
from modelshrink.languages import language_codes
from modelshrink.options.distill import DistillOptions
from modelshrink.quant.modules import weights_once
from modelshrink.training.runs import save_best_with
from modelshrink.training.loop import TrainResult, place_teacher, train


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


def tokenize_pairs(rows: list[Any], tokenizer: Any, max_source_length: int, max_target_length: int,
                   prefix: str = "") -> list[dict]:
    """Sources (behind the model's `prefix`, modelshrink.runtime.inputs) and targets as ids; a tokenizer that marks targets
    with a language (M2M100, NLLB) must have been told which (training.reading)."""
    if hasattr(tokenizer, "tgt_lang") and tokenizer.tgt_lang is None and language_codes(tokenizer):
        raise UserError(f"the tokenizer ({type(tokenizer).__name__}) marks targets with their language and none is "
                        "set: pass --target-lang (or train on labels that name one)")
    sources = tokenizer(with_prefix([r.document for r in rows], prefix), truncation=True,
                        max_length=max_source_length)["input_ids"]
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


def no_layerdrop(model: Any) -> str:
    """Turn off the LayerDrop of `model`'s stacks (M2M100's and NLLB's configs ask for 0.05): a dropped layer
    returns no hidden state, and the layer-matched losses need every one. Returns what was on ("" for nothing)."""
    dropped = []
    for name, module in model.named_modules():
        if getattr(module, "layerdrop", 0):
            dropped.append(f"{name.rsplit('.', 1)[-1]} {module.layerdrop:g}")
            module.layerdrop = 0.0
    return ", ".join(dropped)


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


def make_loss(options: DistillOptions, teacher: Any, maps: dict[str, list[int]] | None,
              vocab_map: list[int] | None = None):
    """Label-smoothed CE, plus the weighted word-level losses against the teacher.

    Without --kd-logits (and unless --no-fused-cross-entropy), the CE never materialises the logits: the
    student's forward stops before its LM head and `losses.linear_cross_entropy` takes the loss from the
    hidden state chunk by chunk (every supported family; `lm_head` says how each makes its logits). A head
    that is not a plain linear (a quantized student's) keeps the logits, and so does --kd-logits, which
    compares them; a teacher whose logits no loss reads skips its head. A trimmed student's ids (`vocab_map`:
    the teacher's id of each) are the teacher's inputs in its own ids, and its logits are taken at the student's
    tokens."""
    from modelshrink.models import lm_head
    from modelshrink.training import losses
    from modelshrink.precision import torch_dtype

    need_hidden, need_attention = options.kd_hidden > 0, options.kd_attention > 0
    # None: wherever exact and checked (not with --kd-logits, which compares the logits; not compiled)
    fused = options.fused_cross_entropy is not False and options.kd_logits is None and not options.compile
    # The head's matmul in the autocast dtype, as the model's own head runs (autocast ends with the forward).
    compute_dtype = torch_dtype(options.precision)
    to_teacher = placed_map(vocab_map) if vocab_map is not None else None

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
                index = to_teacher(batch["input_ids"].device) if to_teacher is not None else None
                t = teacher(**(inputs if index is None else teacher_inputs(inputs, index)))
            if index is not None and options.kd_logits is not None:
                t.logits = t.logits.index_select(-1, index)
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


def placed_map(vocab_map: list[int]) -> Callable[[Any], torch.Tensor]:
    """device -> the teacher's id of each student id there, copied to each device once, not every step."""
    index, placed = torch.tensor(vocab_map, dtype=torch.long), {}

    def on(device: Any) -> torch.Tensor:
        if device not in placed:
            placed[device] = index.to(device)
        return placed[device]

    return on


def teacher_inputs(inputs: dict[str, Any], index: torch.Tensor) -> dict[str, Any]:
    """A trimmed student's batch in its teacher's ids (`index`: the teacher's id of each, on the batch's device)."""
    from modelshrink.models.vocabulary import in_teacher_ids

    return {**inputs, **{k: in_teacher_ids(index, inputs[k]) for k in ("input_ids", "decoder_input_ids")}}


def make_validate(rows: list[Any], tokenizer: Any, options: DistillOptions, max_source_length: int, device: Any):
    """ROUGE (F1 ×100) and sacreBLEU's corpus BLEU and chrF (eval's code) of generated text on the validation
    rows: summaries and translations are validated alike, and --metric picks what keeps a checkpoint."""
    from modelshrink.generation.settings import generate, plan_batches, resolve_generation
    from modelshrink.metrics import translation
    from modelshrink.metrics.rouge import rouge_per_document

    def validate(model: Any) -> dict[str, float]:
        settings = resolve_generation(model.generation_config, num_beams=options.num_beams,
                                      max_length=options.max_length)
        predictions: list[str | None] = [None] * len(rows)
        batches = plan_batches(iter(rows), tokenizer, options.batch_size, max_source_length,
                               prefix=model_prefix(model.config))
        for batch in batches:
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
        teacher = place_teacher(teacher, accelerator.device, options.precision, options.compile)
    else:
        teacher = None  # sequence-level distillation needs no teacher at training time
    if built["maps"] is not None and (options.kd_hidden or options.kd_attention) and (dropped := no_layerdrop(student)):
        log(f"LayerDrop off while hidden states and attention are matched layer by layer ({dropped}; the config keeps "
            "its values)")
    tokenized = tokenize_pairs(rows, tokenizer, max_source_length, options.max_target_length,
                               model_prefix(student.config))
    validate = (make_validate(validation_rows, tokenizer, options, max_source_length, accelerator.device)
                if validation_rows else None)
    result = train(student, tokenized, make_collate(tokenizer.pad_token_id), make_loss(options, teacher, built["maps"], built.get("vocab_map")),
                   options.train_options(), staging, accelerator=accelerator, validate=validate,
                   save_best=save_best_with(save), resume=resume, progress=progress, log=log,
                   hparams=hparams if hparams is not None else options.recorded(),
                   # a quantized student's fake-quantized weights once per step (nothing else is parametrized)
                   step_context=weights_once)
    student = accelerator.unwrap_model(student)
    student.set_attn_implementation(attention_kernel)
    return student, result
