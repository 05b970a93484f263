"""The student of a seq2seq run: built from the teacher's layers (the map φ), given as a model of its own, or
warm-started from pretrained encoders (bert2bert); its widths checked against the teacher's where losses compare
them; and what a manifest records of it."""

from __future__ import annotations

from typing import Any, Callable

from modelshrink.errors import UserError
from modelshrink.families import attention_heads, hidden_size
from modelshrink.options.distill import DistillOptions
from modelshrink.training.runs import training_metrics
from modelshrink.training.loop import TrainResult


def check_widths(teacher: Any, student: Any, options: DistillOptions) -> None:
    """Hidden-state and attention losses compare tensors: the student must have the teacher's width and heads."""
    if teacher is None or not options.word_level or not (options.kd_hidden > 0 or options.kd_attention > 0):
        return
    dims = [(hidden_size(m.config), attention_heads(m.config)) for m in (student, teacher)]
    if dims[0] != dims[1]:
        raise UserError(f"--kd-hidden/--kd-attention need the student's hidden size and heads to match the "
                        f"teacher's: {dims[0]} vs {dims[1]}")


def build_student(options: DistillOptions, device: str, log: Callable[[str], None], *, teacher: Any = None,
                  student: Any = None) -> dict[str, Any]:
    """Teacher (or None), student, tokenizer, layer maps and where the student came from. `teacher` and `student`
    may be given resolved already (`models.loading.ModelSource`, what a step resolved when it started);
    otherwise `options.teacher` and `options.student` are resolved here."""
    from modelshrink.models.loading import load_seq2seq, tokenizer_mismatch
    from modelshrink.models.shrink import check_layer_ids, first_layer_ids, layer_counts, shrink, spaced_layer_ids
    from modelshrink.models.vocabulary import teacher_ids
    from modelshrink.models.warmstart import init_encoder_decoder

    teacher_source, student_source = teacher or options.teacher, student or options.student
    teacher = None
    if teacher_source is not None:
        teacher, tokenizer, _ = load_seq2seq(teacher_source, "teacher", options.trust_remote_code, "cpu",
                                             allow_pickle=options.allow_pickle)
    if options.init_encoder_decoder is not None:
        encoder, _, decoder = options.init_encoder_decoder.partition(",")
        student, tokenizer = init_encoder_decoder(encoder, decoder or None, options.trust_remote_code, options.seed,
                                                  options.cross_attention_init, allow_pickle=options.allow_pickle)
        return {"teacher": None, "student": student, "tokenizer": tokenizer, "maps": None,
                "origin": {"init_encoder_decoder": options.init_encoder_decoder}}
    if student_source is not None:
        student, student_tokenizer, _ = load_seq2seq(student_source, "student", options.trust_remote_code, "cpu",
                                                     allow_pickle=options.allow_pickle)
        maps, vocab_map = None, None
        if teacher is not None:  # a trimmed student's ids in the teacher's (its logits are a budget's targets too)
            try:
                vocab_map = teacher_ids(tokenizer, student_tokenizer)
            except UserError:
                if options.word_level:
                    raise
                tokenizer = None  # not the student's vocabulary: no map, now or after a trim
        if teacher is not None and options.word_level:
            why = tokenizer_mismatch(tokenizer, student_tokenizer) if vocab_map is None else None
            if why:
                raise UserError(f"teacher and student tokenizers differ ({why}); word-level losses compare "
                                "token distributions and need the same tokenizer")
            n_enc_t, n_dec_t = layer_counts(teacher)
            n_enc_s, n_dec_s = layer_counts(student)
            maps = {"encoder": spaced_layer_ids(n_enc_t, n_enc_s, "encoder"),
                    "decoder": spaced_layer_ids(n_dec_t, n_dec_s, "decoder")}
        return {"teacher": teacher, "student": student, "tokenizer": student_tokenizer, "maps": maps,
                "vocab_map": vocab_map, "teacher_tokenizer": tokenizer if teacher is not None else None,
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
    return {"teacher": teacher, "student": student, "tokenizer": tokenizer, "maps": maps, "teacher_tokenizer": tokenizer,
            "origin": {"teacher": options.teacher, "layer_map": maps}}


def trim_student(built: dict[str, Any], rows: list[Any], log: Callable[[str], None],
                 trust_remote_code: bool = False) -> dict[str, Any]:
    """`built` with its student and tokenizer trimmed to the tokens of the training rows (`--trim-vocab`,
    `models/vocabulary.py`), its `vocab_map` (student id -> teacher id) following, and what was kept."""
    from modelshrink.runtime.inputs import model_prefix
    from modelshrink.models.vocabulary import teacher_ids, trim_reported

    prefix = model_prefix(built["student"].config)  # the documents as the student reads them
    texts = (text for r in rows for text in (prefix + r.document, r.reference))
    tokenizer, kept = trim_reported(built["student"], built["tokenizer"], texts, f"the {len(rows):,} training pairs",
                                    log, trust_remote_code)
    teacher_tokenizer = built.get("teacher_tokenizer")
    vocab_map = teacher_ids(teacher_tokenizer, tokenizer) if teacher_tokenizer is not None else None
    return {**built, "tokenizer": tokenizer, "vocab_map": vocab_map, "vocabulary": kept}


def student_metrics(student: Any, teacher: Any | None, result: TrainResult | None) -> dict[str, Any]:
    from modelshrink.models.efficiency import parameter_count

    metrics: dict[str, Any] = {"parameters": parameter_count(student)}
    if teacher is not None:
        metrics["teacher_parameters"] = parameter_count(teacher)
        metrics["parameter_ratio"] = round(metrics["teacher_parameters"] / metrics["parameters"], 4)
    if result is not None:
        metrics.update(training_metrics(result))
    return metrics
