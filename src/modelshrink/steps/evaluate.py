"""`eval`: generate (summarizers) or predict (classifiers) and score, or score predictions on disk.

Summaries are scored with ROUGE-1/2/L/Lsum F1 (×100) and 95% bootstrap intervals, style and bias
(length, novel n-grams, copy bias, leading bias: PLATE Table 6 and section 1), optionally the
limited-length recall of PLATE Table 2 and where cross attention looks (Fig. 1, 2). Classifiers get
GLUE's metrics. A model also gets its footprint and speed. `against` adds a paired significance test
against another system on the same documents. Everything is written to an eval artifact:
metrics.json, predictions.jsonl (with per-document scores) and modelshrink.json.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any, Callable

from modelshrink.artifacts import CARD_NAME, MANIFEST_NAME, RUN_FILE, ArtifactWriter, parent_ref, read_manifest
from modelshrink.data import language_pairs, open_data
from modelshrink.errors import UserError
from modelshrink.evaluation.inference import generate_summaries, predict_labels
from modelshrink.metrics import rouge
from modelshrink.metrics.names import ALL_METRICS
from modelshrink.options.eval import EvalOptions
from modelshrink.evaluation.predictions import file_task, labels_from_file, summaries_from_file, text_task
from modelshrink.evaluation.scoring import STYLE_SETTINGS, against, score_labels, score_summaries, score_translations

__all__ = ["EvalOptions", "evaluate", "score_labels", "score_summaries", "score_translations"]

ProgressFn = Callable[[int, int], None]
LogFn = Callable[[str], None]

# Options that only mean something for one kind of task, with their defaults.
SUMMARIZATION_OPTIONS = {"limited_length_recall": False, "attention_stats": False, "attention_plot": None,
                         "num_beams": None, "length_penalty": None, "min_length": None, "max_length": None,
                         "no_repeat_ngram_size": None, "max_source_length": None, "max_tokens": None, "summary_column": None,
                         "reference_column": None, "references": None, "lam": None, "lambda_enc": None,
                         "lambda_dec": None, "lambda_cross": None, "lambda_range": None}
CLASSIFICATION_OPTIONS = {"label_column": None, "text_pair_column": None}
TRANSLATION_OPTIONS = {"source_lang": None, "target_lang": None}  # generated text's languages
TEXT_TASKS = ("summarization", "translation")  # generated text, scored against references
SUMMARY_ONLY = {"limited_length_recall": False}


def _check_task_options(task: str, options: EvalOptions, what: str) -> None:
    """A classifier given summarization options, or the reverse, is a mistake worth one line."""
    if task not in TEXT_TASKS and options.task != "auto":
        raise UserError(f"--task {options.task} scores generated text, but {what} is a {task} task")
    wrong = {**SUMMARIZATION_OPTIONS, **TRANSLATION_OPTIONS} if task not in TEXT_TASKS else CLASSIFICATION_OPTIONS
    if task == "translation":
        wrong = {**wrong, **SUMMARY_ONLY}
    for name, default in wrong.items():
        if getattr(options, name) != default:
            kind = ("translation" if name in TRANSLATION_OPTIONS else
                    "summarization" if task != "summarization" else "classification")
            flag = "--lambda" if name == "lam" else f"--{name.replace('_', '-')}"
            raise UserError(f"{flag} applies to {kind}, but {what} is a {task} task")


def _as_run(options: EvalOptions) -> EvalOptions:
    """The options as this evaluation runs them: an eval artifact's predictions, and the batches of the device it
    runs on (options/batching.py). An export folder runs on the CPU runtime in batches of a count; a predictions
    file is read, not batched."""
    from modelshrink.models.loading import resolve_device
    from modelshrink.options.batching import resolve_batching
    from modelshrink.runtime.files import is_export

    options = _predictions_of_eval_artifact(options)
    pytorch = options.model is not None and not is_export(options.model)
    if options.threads is not None and not (options.model is not None and is_export(options.model)):
        raise UserError("--threads sets an export folder's onnxruntime threads; a PyTorch model (or a predictions "
                        "file) has none to set")
    return resolve_batching(options, resolve_device(options.device) if pytorch else "cpu")


def _predictions_of_eval_artifact(options: EvalOptions) -> EvalOptions:
    """Scoring an eval artifact (no model) scores its predictions.jsonl: re-test a finished evaluation
    against another one without generating again."""
    folder = Path(options.data)
    manifest = read_manifest(folder) if options.model is None and folder.is_dir() else None
    if (manifest or {}).get("kind") != "eval":
        return options
    # its rows hold documents whatever the task: the task is the evaluation's own (translations stay translations)
    task = manifest.get("resolved", {}).get("task")
    task = task if options.task == "auto" and task in ("summarization", "translation") else options.task
    return dataclasses.replace(options, data=str(folder / "predictions.jsonl"), task=task)


def evaluate(options: EvalOptions, output: str | Path, *, overwrite: bool = False, resume: bool = False,
             progress: ProgressFn | None = None, log: LogFn = lambda m: None) -> tuple[Path, dict[str, Any]]:
    """Score a model on data, or predictions on disk; write an eval artifact. Returns (path, metrics).

    With a model, under `accelerate launch` or `torchrun`, every process generates (or predicts)
    its share; the main process scores and writes the artifact, the others return (path, {}).
    With a model an interrupted run keeps what it generated, and `resume` continues it. The function behind
    `modelshrink eval`.

    ```python
    import modelshrink
    from modelshrink import EvalOptions

    # ROUGE with 95% intervals, size, latency, a paired test against the teacher
    options = EvalOptions(model="student", data="valid.jsonl",
                          against="eval-teacher")
    path, metrics = modelshrink.evaluate(options, "eval-student")
    print(metrics["rougeL"], metrics["ci95"]["rougeL"], metrics["against"])
    ```
    """
    from modelshrink.generation import shards
    from modelshrink.models.efficiency import weight_bytes
    from modelshrink.precision import check_precision
    from modelshrink.training.runs import finished, open_run

    output = Path(output)
    options = _as_run(options)
    if (output / "metrics.json").is_file() and finished(output, overwrite=overwrite, resume=resume, log=log,
                                                          recorded=options.recorded()):
        return output, json.loads((output / "metrics.json").read_text())
    launch = shards.launch(options.device)
    check_precision(options.dtype, launch.device, "--dtype")
    if not launch.main:
        log = lambda m: None  # noqa: E731  (one process speaks)
    writer = ArtifactWriter(output, overwrite=overwrite, resume=resume, resumable=options.model is not None)
    writer.check()
    if resume and options.model is None:
        raise UserError("--resume continues generating with a model; scoring a predictions file starts over")
    if resume and writer.staging.is_dir():
        shards.check_parts(writer.staging, launch.world)
    source = language_pairs(open_data(options.data, options.split), options.source_lang, options.target_lang,
                            with_model=options.model is not None)
    if not source.columns:
        raise UserError(f"data {options.data} has no rows")
    task, parents, model = _task_and_parents(options, source)
    if options.model is None:  # scoring a file on disk is one process's work
        if not launch.main:
            return output, {}
        launch = shards.Launch(0, 1, launch.device)
    staging = open_run(launch, writer, options.recorded(), parents)
    try:
        resolved: dict[str, Any] = {"task": task}
        scored = _generate_and_score(options, task, source, staging, launch, progress, log, model)
        if scored is None:  # not the main process: its share is written, the main process scores
            return output, {}
        rows, metrics, efficiency, extra = scored
        resolved.update(extra)
        task = resolved["task"]
        if efficiency:
            if options.reference_size is not None:
                reference = weight_bytes(options.reference_size)
                efficiency["reference_bytes_on_disk"] = reference
                efficiency["compression_ratio"] = round(reference / efficiency["bytes_on_disk"], 4) \
                    if efficiency["bytes_on_disk"] else None
            metrics["efficiency"] = efficiency
        if options.against is not None:
            metrics["against"] = against(rows, task, options)
        with open(staging / "predictions.jsonl", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        (staging / "metrics.json").write_text(json.dumps(metrics, indent=2, ensure_ascii=False) + "\n")
        (staging / RUN_FILE).unlink(missing_ok=True)
        path = writer.commit(step="eval", kind="eval", options=options.recorded(), parents=parents,
                             metrics=_headline(metrics), resolved=resolved)
        _add_to_card(options, task, metrics, log)
    except BaseException:
        if launch.main and not shards.has_rows(staging):  # keep only what --resume can continue
            shutil.rmtree(staging, ignore_errors=True)
        raise
    return path, metrics


def _task_and_parents(options: EvalOptions, source: Any) -> tuple[str, list[dict[str, Any]], Any]:
    """The task (the model's, or what the predictions file's columns hold) with options of the other task and
    missing inputs refused in one line; the artifact's parents; the model resolved once (`ModelSource`, None for
    a predictions file)."""
    from modelshrink.models.loading import resolve

    model = None
    if options.model is not None:
        model = resolve(options.model, "model", options.trust_remote_code, options.allow_pickle)
        task = model.task
        task = text_task(source.columns, options) if task == "summarization" else task
        what = f"model {options.model}"
    else:
        task = file_task(source.columns, options)
        what = f"predictions file {options.data}"
    _check_task_options(task, options, what)
    if options.against is not None and not Path(options.against).exists():
        raise UserError(f"--against {options.against} does not exist")
    if options.against is not None:
        _check_against_task(options.against, task)
    if options.reference_size is not None and not Path(options.reference_size).is_dir():
        raise UserError(f"--reference-size {options.reference_size} is not a model folder")
    parents = [parent_ref(role, spec) for role, spec in (("model", options.model), ("data", options.data),
                                                         ("references", options.references),
                                                         ("against", options.against),
                                                         ("reference_size", options.reference_size)) if spec]
    return task, parents, model


def _check_against_task(other: str, task: str) -> None:
    """An eval artifact given to --against scores the same task as this run (before anything is generated)."""
    manifest = read_manifest(Path(other)) if Path(other).is_dir() and (Path(other) / MANIFEST_NAME).is_file() else None
    other_task = ((manifest or {}).get("metrics") or {}).get("task") if (manifest or {}).get("kind") == "eval" else None
    if other_task is not None and other_task != task:
        raise UserError(f"--against {other} is an evaluation of {other_task}, this run's task is {task}: compare "
                        f"{task} with {task}")


def _generate_and_score(options: EvalOptions, task: str, source: Any, staging: Path, launch: Any,
                        progress: ProgressFn | None, log: LogFn, model: Any = None
                        ) -> tuple[list, dict, dict, dict] | None:
    """(rows, metrics, efficiency, resolved entries) of a model's outputs or a file's predictions on `source`;
    None on a process other than the main one (it wrote its share for the main one to score)."""
    from modelshrink.models.loading import load_tokenizer

    efficiency: dict[str, Any] = {}
    resolved: dict[str, Any] = {"task": task}
    if task not in TEXT_TASKS:
        if options.model is not None:
            rows, efficiency, extra = predict_labels(options, task, staging, launch, progress, model)
            if rows is None:
                return None
            resolved.update(extra)
        else:
            rows, resolved["task"] = labels_from_file(source, options)
        return rows, score_labels(rows, resolved["task"]), efficiency, resolved
    tokenizer = load_tokenizer(options.tokenizer, "tokenizer") if options.tokenizer else None
    if options.model is not None:
        rows, efficiency, extra, tokenizer = generate_summaries(options, source, staging, launch, progress, log,
                                                                model)
        if rows is None:
            return None
        resolved.update({k: v for k, v in extra.items() if k != "attention"})
    else:
        rows, extra = summaries_from_file(source, options, log), {}
    if not rows:
        raise UserError(f"data {options.data} has no rows")
    if not options.allow_empty and not any(str(r.get("prediction") or "").strip() for r in rows):
        source = f"model {options.model}" if options.model is not None else f"predictions file {options.data}"
        raise UserError(f"every one of the {len(rows)} outputs of {source} is empty: nothing to score (a "
                        "multilingual translator without --target-lang? a broken model?); pass --allow-empty to "
                        "score them anyway")
    bootstrap = {"resamples": options.resamples, "seed": options.seed, "confidence": 0.95}
    if task == "translation":
        metrics = score_translations(rows, options, log)
        metrics["settings"] = {"sacrebleu": metrics.pop("signatures"), "bootstrap": bootstrap}
        if "attention" in extra:
            metrics["attention"] = extra["attention"]
        if "generation" in extra:
            metrics["settings"]["generation"] = extra["generation"]
        return rows, metrics, efficiency, resolved
    metrics = score_summaries(rows, options, tokenizer, log)
    if "attention" in extra:
        metrics["attention"] = extra["attention"]
    metrics["settings"] = {"rouge": rouge.ROUGE_SETTINGS, "style": STYLE_SETTINGS, "bootstrap": bootstrap}
    if "generation" in extra:
        metrics["settings"]["generation"] = extra["generation"]
    return rows, metrics, efficiency, resolved


def _add_to_card(options: EvalOptions, task: str, metrics: dict[str, Any], log: LogFn) -> None:
    """The scored model's card (a modelshrink model artifact's or export's) gets these scores in its model-index."""
    from modelshrink.cards import add_results

    manifest = read_manifest(options.model) if options.model is not None else None
    if manifest is None or manifest.get("kind") != "model":
        return
    if CARD_NAME in manifest.get("files", {}):  # made before cards took results: its manifest pins the card
        log(f"note: {options.model}'s manifest pins its model card (an earlier modelshrink made it), so the card "
            "is left as it is")
        return
    try:
        if add_results(Path(options.model), task=task, data=options.data, split=options.split, metrics=metrics,
                       limit=options.limit):
            log(f"{Path(options.model) / CARD_NAME}: its model-index has these scores on {options.data}")
    except OSError as e:  # a read-only model folder: the evaluation itself is written
        log(f"warning: could not add the scores to {options.model}'s model card ({e.strerror or e})")


def _headline(metrics: dict[str, Any]) -> dict[str, Any]:
    keys = ("task", "documents", *ALL_METRICS, "length_words")
    head = {k: metrics[k] for k in keys if k in metrics}
    for k in ("parameters", "bytes_on_disk", "compression_ratio", "latency_ms_p50"):
        if k in metrics.get("efficiency", {}):
            head[k] = metrics["efficiency"][k]
    return head
