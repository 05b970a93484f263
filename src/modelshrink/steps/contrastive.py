"""`contrastive`: ACKD distillation of BERT-style sequence classifiers, or plain fine-tuning.

With `--teacher` the student (the teacher's own layers, `--layers K`, or a separate `--student`)
learns by Eq. 4 of ACKD (see `modelshrink.training.ackd`). Without a teacher the `--student` — a classifier,
or a pretrained encoder such as MiniLM that gets a new head — is fine-tuned by cross-entropy alone,
which is how a user with only an encoder makes the teacher. Both go through the shared loop
(`modelshrink.training.loop`): progress, validation with the best checkpoint, exact resume, accelerate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from modelshrink._version import __version__
from modelshrink.training.ackd import ACKDObjective, feature_layer_pairs, layer_features
from modelshrink.errors import UserError
from modelshrink.families import encoder_layer_count
from modelshrink.metrics.names import CLASSIFICATION_METRICS
from modelshrink.options.batching import resolve_batching
from modelshrink.options.contrastive import ContrastiveOptions
from modelshrink.training.runs import TrainingRun, parent_refs, save_best_with, training_metrics
from modelshrink.training.loop import enable_gradient_checkpointing, place_teacher, train
from modelshrink.training.teacher_cache import cache_teacher

# ---------------------------------------------------------------- labels

def _label_scheme(rows_spec: str, options: ContrastiveOptions) -> dict[str, Any]:
    """How a new head reads this data: class ids (ints), class names (strings, sorted) or numbers
    (regression), found from the training labels."""
    from modelshrink.data import open_data

    column = options.label_column or "label"
    source = open_data(rows_spec, options.split)
    if column not in source.columns:
        raise UserError(f"{rows_spec} has no column '{column}'; columns found: {', '.join(source.columns)}")
    values = [row.get(column) for i, row in enumerate(source.rows()) if options.limit is None or i < options.limit]
    missing = next((i + 1 for i, v in enumerate(values) if v is None), None)
    if missing is not None:
        raise UserError(f"{rows_spec}: row {missing} has no label (column '{column}' is missing or null)")
    if all(isinstance(v, str) for v in values):
        names = sorted(set(values))
        return {"num_labels": len(names), "id2label": dict(enumerate(names)),
                "label2id": {n: i for i, n in enumerate(names)}}
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        n = int(max(values)) + 1
        return {"num_labels": n, "id2label": {i: str(i) for i in range(n)}, "label2id": {str(i): i for i in range(n)}}
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return {"num_labels": 1, "problem_type": "regression"}
    raise UserError(f"{rows_spec}: column '{column}' mixes label kinds; expected class ids, class names or numbers")


def bin_edges(values: list[float], bins: int) -> list[float]:
    """Equal-width bins over the training targets' range: the inner edges."""
    lo, hi = float(min(values)), float(max(values))
    return [lo + (hi - lo) * k / bins for k in range(1, bins)]


def to_bins(values: list[float], edges: list[float]) -> list[int]:
    return [int(b) for b in np.searchsorted(np.asarray(edges), np.asarray(values, dtype=float), side="right")]


# ---------------------------------------------------------------- the models

def build_models(options: ContrastiveOptions, log: Callable[[str], None]) -> dict[str, Any]:
    """Teacher (or None), student, tokenizer and the student's layer map; one-line errors for
    models that cannot be paired."""
    from modelshrink.models.loading import tokenizer_mismatch
    from modelshrink.models.loading import is_classifier, load_classifier, resolve, task_of
    from modelshrink.models.shrink import first_layer_ids, shrink_encoder, spaced_layer_ids

    torch.manual_seed(options.seed)  # a new head is random
    teacher = tokenizer = None
    head: dict[str, Any] | None = None
    if options.teacher is not None:
        teacher, tokenizer = load_classifier(options.teacher, "teacher", options.trust_remote_code,
                                             allow_pickle=options.allow_pickle)
        task_of(teacher.config)
        c = teacher.config
        head = {"num_labels": c.num_labels, "id2label": c.id2label, "label2id": c.label2id}
        if c.problem_type:
            head["problem_type"] = c.problem_type
    layer_ids, new_head = None, False
    if options.student is not None:
        source = resolve(options.student, "student", options.trust_remote_code, options.allow_pickle)
        new_head = not is_classifier(source.config)
        if head is None and new_head:
            head = _label_scheme(options.data, options)
        student, student_tok = load_classifier(source, new_head=head)
        if teacher is not None:
            why = tokenizer_mismatch(tokenizer, student_tok)
            if why:
                raise UserError(f"teacher and student tokenizers differ ({why}); distillation needs the same one")
            if student.config.num_labels != teacher.config.num_labels:
                raise UserError(f"the teacher predicts {teacher.config.num_labels} labels, the student "
                                f"{student.config.num_labels}")
        tokenizer = student_tok
    if options.layers is not None or options.layer_ids is not None:
        # PKD/ACKD: a pretrained encoder's layers under a fresh head (--student), else the fine-tuned teacher's own
        source, origin = (student, f"{options.student} (pretrained)") if options.student else (teacher, "teacher")
        n = encoder_layer_count(source.config)
        if options.layer_ids is not None:
            layer_ids = list(options.layer_ids)
        elif options.layer_selection == "first":
            layer_ids = first_layer_ids(n, options.layers, "encoder", "--layers")
        else:
            layer_ids = spaced_layer_ids(n, options.layers, "encoder", "--layers")
        student = shrink_encoder(source, layer_ids)
        log(f"student: layers {layer_ids} of {n} of {origin}")
    return {"teacher": teacher, "student": student.train(), "tokenizer": tokenizer, "layer_ids": layer_ids,
            "new_head": new_head}


def _read(spec: str, split: str | None, limit: int | None, options: ContrastiveOptions, config: Any, task: str):
    from modelshrink.training import classify

    return classify.read_labeled(spec, split=split, text_column=options.text_column,
                                 text_pair_column=options.text_pair_column, label_column=options.label_column,
                                 limit=limit, num_labels=config.num_labels if task == "classification" else None,
                                 label2id=config.label2id if task == "classification" else None, task=task)


def make_loss(teacher: Any | None, pairs: list[tuple[int, int]], pooling: str = "cls"):
    """The shared loop's loss function: the frozen teacher's logits and features (no gradient path;
    [CLS] or the token mean, as the student's), then the objective's forward (`ACKDObjective`),
    which returns (loss, parts). A batch that carries them already (`with_cached_teacher`) skips
    the teacher."""
    teacher_layers = [t for _, t in pairs]

    def loss_fn(model: Any, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
        extra: dict[str, Any] = {}
        if "teacher_logits" in batch:
            extra["teacher_logits"] = batch["teacher_logits"]
            if pairs:
                extra["teacher_features"] = list(batch["teacher_features"].unbind(1))
        elif teacher is not None:
            with torch.no_grad():
                t = teacher(**inputs, output_hidden_states=bool(pairs))
            extra["teacher_logits"] = t.logits
            if pairs:
                extra["teacher_features"] = layer_features(t.hidden_states, teacher_layers, pooling,
                                                           inputs["attention_mask"])
        return model(**inputs, labels=batch["labels"], contrast_labels=batch.get("contrast_labels"), **extra)

    return loss_fn


def _check_features(teacher: Any, examples: list[dict[str, Any]], collate: Callable[[list[dict[str, Any]]], dict],
                    pairs: list[tuple[int, int]], pooling: str, device: Any, log: Callable[[str], None]
                    ) -> dict[str, dict[int, float]]:
    """The teacher's feature spread on up to 64 training sentences (spread evenly over the data); a warning
    when the compared feature is the same for every sentence at some mapped layer."""
    from modelshrink.training.ackd import DEGENERATE_COSINE, feature_spread

    step = max(1, len(examples) // 64)
    batch = collate(examples[::step][:64])
    inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
    layers = [t for _, t in pairs]
    with torch.no_grad():
        spread = feature_spread(teacher(**inputs, output_hidden_states=True).hidden_states, layers,
                                inputs["attention_mask"])
    flat = [layer for layer in layers if spread[pooling][layer] > DEGENERATE_COSINE]
    if flat:
        other = "mean" if pooling == "cls" else "cls"
        log(f"warning: the teacher's {pooling} features at layer{'s' if len(flat) > 1 else ''} "
            f"{', '.join(map(str, flat))} are nearly the same for every sentence (mean cosine between sentences "
            f"{', '.join(f'{spread[pooling][layer]:.4f}' for layer in flat)}; {other}-pooled: "
            f"{', '.join(f'{spread[other][layer]:.4f}' for layer in flat)}): the patient and contrastive terms "
            f"cannot tell sentences apart there; try --feature-pooling {other}")
    return {kind: {str(k): v for k, v in values.items()} for kind, values in spread.items()}


# ---------------------------------------------------------------- the step

def contrastive(options: ContrastiveOptions, output: str | Path, *, overwrite: bool = False, resume: bool = False,
                progress: Callable[[dict[str, Any]], None] | None = None,
                log: Callable[[str], None] = lambda m: None) -> Path:
    """Train the student (ACKD, or fine-tuning without a teacher) and write a classifier artifact; returns its
    path. The function behind `modelshrink contrastive`.

    ```python
    import modelshrink
    from modelshrink import ContrastiveOptions

    # a 3-layer student copied from the fine-tuned teacher, trained by full ACKD
    options = ContrastiveOptions(data="sentences.jsonl", teacher="classifier",
                                 layers=3, epochs=3)
    student = modelshrink.contrastive(options, "student-3l")
    ```
    """
    from modelshrink.training import classify
    from modelshrink.models.loading import resolve_device, save_model, source_length

    options = resolve_batching(options, resolve_device(options.device))
    run = TrainingRun("contrastive", options, output, overwrite=overwrite, resume=resume, log=log)
    if run.finished():
        return run.output
    accelerator = run.start(resolve_device(options.device))
    main = run.main

    built, task, rows, validation = _models_and_data(options, log)
    teacher, student, tokenizer = built["teacher"], built["student"], built["tokenizer"]
    resolved: dict[str, Any] = {"task": task, "layer_map": built["layer_ids"],
                                "layers_from": None if built["layer_ids"] is None else
                                ("student" if options.student else "teacher"),
                                **{key: built[key] for key in ("vocabulary",) if key in built}}
    if task != "classification" and options.metric in CLASSIFICATION_METRICS:
        options.metric = "pearson"
    distilling = not options.finetune
    contrast = _contrast_labels(options, rows, task, distilling, resolved)

    objective, pairs = _objective(options, built, distilling, resolved)
    if options.gradient_checkpointing:
        enable_gradient_checkpointing(student)
    if teacher is not None:
        teacher = place_teacher(teacher, accelerator.device, options.precision, options.compile)

    max_length = source_length(options.max_length, tokenizer, student.config, "--max-length", preferred=128)
    resolved["max_length"] = max_length
    staging = run.open(parent_refs(("data", options.data), ("teacher", options.teacher),
                                   ("student", options.student), ("validation", options.validation)))

    examples = classify.tokenize_labeled(rows, tokenizer, max_length)
    for example, c in zip(examples, contrast):
        example["contrast"] = c
    check = (classify.make_validate(validation, tokenizer, 64, accelerator.device, max_length)
             if validation else None)
    teacher_validation = (_teacher_validation(validation, built, teacher, accelerator.device, max_length)
                          if check is not None and teacher is not None and main else None)
    if not objective.needs_teacher:
        teacher = None  # e.g. the cross-entropy-only baseline: no teacher forward passes

    collate = classify.make_collate(tokenizer.pad_token_id)
    if teacher is not None and pairs:
        resolved["feature_cosine"] = _check_features(teacher, examples, collate, pairs, options.feature_pooling,
                                                     accelerator.device, log)
    if teacher is not None and options.teacher_cache:
        collate = cache_teacher(teacher, examples, collate, pairs, options.feature_pooling, accelerator.device,
                                log, resolved)
        teacher = None

    def save(objective: Any, folder: Path) -> None:
        save_model(objective.student, tokenizer, folder)

    loss_fn = make_loss(teacher, pairs, options.feature_pooling)
    result = train(objective, examples, collate, loss_fn,
                   options.train_options(), staging, accelerator=accelerator,
                   validate=(lambda model: check(model.student)) if check else None, save_best=save_best_with(save),
                   resume=resume, progress=progress, log=log, hparams=options.recorded())
    objective = accelerator.unwrap_model(objective)
    if not main:
        return run.output
    run.keep_best(result, lambda folder: save(objective, folder))
    return _commit(run, objective, built, result, teacher_validation, resolved)


def _models_and_data(options: ContrastiveOptions, log: Callable[[str], None]
                     ) -> tuple[dict[str, Any], str, list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The models (`build_models`, trimmed to the training sentences with --trim-vocab), the task, the training
    rows and the validation rows (None without --validation)."""
    from modelshrink.models.loading import task_of

    built = build_models(options, log)
    config = built["student"].config
    task = task_of(config)
    rows = _read(options.data, options.split, options.limit, options, config, task)
    if options.trim_vocab:
        built = trim_classifier(built, rows, log, options.trust_remote_code)
    validation = (_read(options.validation, options.validation_split, options.eval_limit, options, config, task)
                  if options.validation else None)
    return built, task, rows, validation


def trim_classifier(built: dict[str, Any], rows: list[dict[str, Any]], log: Callable[[str], None],
                 trust_remote_code: bool = False) -> dict[str, Any]:
    """`built` with its student and tokenizer trimmed to the tokens of the training sentences (`--trim-vocab`,
    `models/vocabulary.py`); the teacher, if any, reads the student's batches in its own ids."""
    from modelshrink.models.vocabulary import TeacherInOwnIds, teacher_ids, trim_reported

    texts = (text for r in rows for text in (r["text"], r["text_pair"]) if text is not None)
    tokenizer, kept = trim_reported(built["student"], built["tokenizer"], texts,
                                    f"the {len(rows):,} training sentences", log, trust_remote_code)
    teacher = built["teacher"]
    index = teacher_ids(built["tokenizer"], tokenizer) if teacher is not None else None
    if index is not None:
        teacher = TeacherInOwnIds(teacher, index)
    return {**built, "teacher": teacher, "tokenizer": tokenizer, "teacher_tokenizer": built["tokenizer"],
            "vocabulary": kept}


def _teacher_validation(rows: list[dict[str, Any]], built: dict[str, Any], teacher: Any, device: Any,
                        max_length: int) -> dict[str, float]:
    """The teacher's validation scores, its own tokenizer reading the sentences (a trimmed student's would split the
    words its vocabulary lacks, and change what the teacher reads)."""
    from modelshrink.models.vocabulary import TeacherInOwnIds
    from modelshrink.training import classify

    own = built.get("teacher_tokenizer", built["tokenizer"])
    model = teacher.teacher if isinstance(teacher, TeacherInOwnIds) else teacher
    return classify.make_validate(rows, own, 64, device, max_length)(model)


def _objective(options: ContrastiveOptions, built: dict[str, Any], distilling: bool,
               resolved: dict[str, Any]) -> tuple[ACKDObjective, list[tuple[int, int]]]:
    """The student wrapped with its ACKD terms (the SAR predictors seeded), and the (teacher, student) layer pairs
    whose features the PT and ACDL terms compare (recorded in `resolved`)."""
    teacher, student = built["teacher"], built["student"]
    pairs = (_feature_pairs(options, teacher, student, built["layer_ids"])
             if distilling and (options.pt or options.acdl) else [])
    if pairs:
        resolved["feature_pairs"] = [list(p) for p in pairs]
    torch.manual_seed(options.seed)  # the SAR predictors' initialisation
    objective = ACKDObjective(student, pairs, alpha=options.alpha if distilling else 1.0, beta=options.beta,
                              gamma=options.gamma, temperature=options.temperature, kd=distilling and options.kd,
                              pt=distilling and options.pt, acdl=distilling and options.acdl, sar=options.sar,
                              storage_size=options.storage_size if options.storage else None,
                              predictor_layers=options.predictor_layers, pooling=options.feature_pooling,
                              negatives=options.negatives, contrast_temperature=options.contrast_temperature)
    return objective, pairs


def _commit(run: TrainingRun, objective: Any, built: dict[str, Any], result: Any,
            teacher_validation: dict[str, Any] | None, resolved: dict[str, Any]) -> Path:
    """The trained student's metrics and model card; the artifact committed."""
    from modelshrink.models.efficiency import parameter_count

    options = run.options

    metrics: dict[str, Any] = {"parameters": parameter_count(objective.student), **training_metrics(result),
                               "loss_terms": options.terms()}
    if built["teacher"] is not None:
        metrics["teacher_parameters"] = parameter_count(built["teacher"])
        metrics["parameter_ratio"] = round(metrics["teacher_parameters"] / metrics["parameters"], 4)
    if teacher_validation is not None:
        metrics["teacher_validation"] = teacher_validation
    card = model_card(options, run.output, built, metrics, resolved)
    return run.commit(result, metrics=metrics, card=card, resolved=resolved, metric=options.metric,
                      always=("teacher", "student"))


def _contrast_labels(options: ContrastiveOptions, rows: list[dict[str, Any]], task: str, distilling: bool,
                     resolved: dict[str, Any]) -> list[Any]:
    """The classes the contrastive term contrasts: the labels, or regression labels in --label-bins bins (their
    edges recorded); one class, or bins asked of classes, refused in one line."""
    if task == "classification" and len({r["label"] for r in rows}) < 2:
        raise UserError(f"{options.data}: the label column has one class only ({rows[0]['label']}); "
                        "classification needs at least two")
    contrast = [r["label"] for r in rows]
    if task == "regression" and distilling and options.acdl:
        if options.label_bins is None:
            raise UserError("regression labels have no classes for the contrastive term; give --label-bins N to "
                            "bin them into N classes, or --no-acdl")
        resolved["label_bin_edges"] = bin_edges(contrast, options.label_bins)
        contrast = to_bins(contrast, resolved["label_bin_edges"])
    elif options.label_bins is not None and task == "classification":
        raise UserError("--label-bins is for regression labels; these are classes already")
    return contrast


def _feature_pairs(options: ContrastiveOptions, teacher: Any, student: Any,
                   layer_ids: list[int] | None) -> list[tuple[int, int]]:
    """(teacher layer, student layer) pairs whose features the patient and contrastive losses compare."""
    if teacher.config.hidden_size != student.config.hidden_size:
        raise UserError(f"the patient and contrastive losses compare hidden states, but the student's size "
                        f"{student.config.hidden_size} differs from the teacher's {teacher.config.hidden_size}; "
                        "pass --no-pt --no-acdl, or pick a student of the same width")
    pairs = feature_layer_pairs(encoder_layer_count(teacher.config), encoder_layer_count(student.config),
                                options.feature_map, layer_ids)
    if not pairs:
        raise UserError(f"--feature-map {options.feature_map} leaves the student's last layer to KD, and this "
                        "student has one layer: use --feature-map copied, or --no-pt --no-acdl")
    return pairs


def model_card(options: ContrastiveOptions, output: Path, built: dict[str, Any], metrics: dict[str, Any],
               resolved: dict[str, Any]) -> str:
    if built["layer_ids"] is not None and options.student is not None:
        origin = (f"Student built from the pretrained `{options.student}`'s layers {built['layer_ids']} under a "
                  + ("new" if built.get("new_head") else "its") + " classification head, then "
                  + ("fine-tuned with cross-entropy (no teacher)." if options.finetune
                     else f"trained by ACKD from teacher `{options.teacher}`."))
    elif options.finetune:
        origin = f"Fine-tuned from `{options.student}` with cross-entropy (no teacher)."
    elif built["layer_ids"] is not None:
        origin = (f"Student built from teacher `{options.teacher}` by copying its layers {built['layer_ids']} "
                  "(embeddings, pooler and classification head copied too), then trained by ACKD.")
    else:
        origin = f"Student `{options.student}` trained by ACKD from teacher `{options.teacher}`."
    weights = {"ce": f"{options.alpha if not options.finetune else 1.0} × cross-entropy",
               "kd": f"{1 - options.alpha:g} × KD (KL, T = {options.temperature}, × T²)",
               "pt": f"{options.beta} × patient loss", "acdl": f"{options.gamma} × A-CDL"
               + (" without SAR" if not options.sar else "") + (" without storage" if not options.storage else
                                                                 f" (storage {options.storage_size})")}
    lines = [f"# {output.name}", "", f"Made by modelshrink {__version__} (`contrastive`). A `save_pretrained` "
             "folder: plain `transformers` loads it.", "", origin, "",
             f"Parameters: {metrics['parameters']:,}" + (
                 f" (teacher {metrics['teacher_parameters']:,}, {metrics['parameter_ratio']}× fewer)"
                 if "teacher_parameters" in metrics else ""), "",
             *([f"Vocabulary trimmed to {v['kept']:,} of {v['of']:,} tokens (`--trim-vocab`): those the training "
                "sentences use, the special tokens and every single character.", ""]
               if (v := resolved.get("vocabulary")) else []),
             f"Loss: {' + '.join(weights[t] for t in options.terms())}"
             + (f"; {'[CLS]' if options.feature_pooling == 'cls' else 'token-mean'} features at (student, teacher) "
                f"layers {resolved['feature_pairs']}" if resolved.get("feature_pairs") else "")
             + (f"; A-CDL with NEG as a {options.negatives}, τ = {options.contrast_temperature:g}"
                if "acdl" in options.terms() else "") + ".",
             f"Training: {metrics['steps']} steps ({metrics['epochs']} epochs) on `{options.data}`, AdamW lr "
             f"{options.lr}, batch "
             + (f"≤ {options.max_tokens} tokens" if options.max_tokens else str(options.batch_size))
             + f" × {options.grad_accum}, seed {options.seed}."]
    if "validation" in metrics:
        v = metrics["validation"]
        lines += ["", "## Validation", "", f"On `{options.validation}`, best step {v['step']} by {options.metric}: "
                  + ", ".join(f"{k} {v[k]:.2f}" for k in v if k != "step")]
        if "teacher_validation" in metrics:
            t = metrics["teacher_validation"]
            lines.append("Teacher: " + ", ".join(f"{k} {t[k]:.2f}" for k in t))
    return "\n".join(lines) + "\n"
