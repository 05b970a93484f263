"""`eval`: generate (summarizers) or predict (classifiers) and score, or score predictions on disk.

Summaries are scored with ROUGE-1/2/L/Lsum F1 (×100) and 95% bootstrap intervals, style and bias
(length, novel n-grams, copy bias, leading bias: PLATE Table 6 and section 1), optionally the
limited-length recall of PLATE Table 2 and where cross attention looks (Fig. 1, 2). Classifiers get
GLUE's metrics. A model also gets its footprint and speed. `against` adds a paired significance test
against another system on the same documents. Everything is written to an eval artifact:
metrics.json, predictions.jsonl (with per-document scores) and modelshrink.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from modelshrink.artifacts import ArtifactWriter, check_output, parent_ref, read_manifest
from modelshrink.data import DataSource, examples, open_data, pick_columns, unique_keys
from modelshrink.errors import UserError
from modelshrink.metrics import glue, rouge, stats, style
from modelshrink.options.eval import EvalOptions

ProgressFn = Callable[[int, int], None]
LogFn = Callable[[str], None]

# Options that only mean something for one kind of task, with their defaults.
SUMMARIZATION_OPTIONS = {"limited_length_recall": False, "attention_stats": False, "attention_plot": None,
                         "num_beams": None, "length_penalty": None, "min_length": None, "max_length": None,
                         "no_repeat_ngram_size": None, "max_source_length": None, "summary_column": None,
                         "reference_column": None, "references": None}
CLASSIFICATION_OPTIONS = {"label_column": None, "text_pair_column": None}
STYLE_SETTINGS = ("words: lowercase [a-z0-9]+ tokens; novel n-grams and copy bias pooled over the corpus, relative "
                  "to each summary's own document; leading bias: each summary sentence matched to the document "
                  "sentence of highest ROUGE-1 + ROUGE-2 F1, leading when that sentence lies in the first 40% of "
                  "the document's sentences")


def _check_task_options(task: str, options: EvalOptions, what: str) -> None:
    """A classifier given summarization options, or the reverse, is a mistake worth one line."""
    wrong = SUMMARIZATION_OPTIONS if task != "summarization" else CLASSIFICATION_OPTIONS
    for name, default in wrong.items():
        if getattr(options, name) != default:
            kind = "summarization" if task != "summarization" else "classification"
            raise UserError(f"--{name.replace('_', '-')} applies to {kind}, but {what} is a {task} task")


# ---------------------------------------------------------------- reading what is to be scored

def _prediction_column(columns: list[str], options: EvalOptions, source: str) -> str:
    if options.prediction_column is not None:
        if options.prediction_column not in columns:
            raise UserError(f"{source} has no column '{options.prediction_column}'; columns found: "
                            f"{', '.join(columns)}")
        return options.prediction_column
    if "prediction" in columns:
        return "prediction"
    if "summary" in columns and "reference" in columns:  # a pseudolabel artifact: summary is the system output
        return "summary"
    raise UserError(f"{source} has no prediction column; columns found: {', '.join(columns)}; "
                    "name it with --prediction-column")


def _reference_column(columns: list[str], prediction: str, options: EvalOptions, source: str) -> str:
    wanted = options.reference_column
    if wanted is not None:
        if wanted not in columns:
            raise UserError(f"{source} has no column '{wanted}'; columns found: {', '.join(columns)}")
        return wanted
    for candidate in ("reference", "summary", "highlights", "target"):
        if candidate in columns and candidate != prediction:
            return candidate
    raise UserError(f"{source} has no reference column; columns found: {', '.join(columns)}; "
                    "name it with --reference-column or give --references DATA")


def _row_id(row: dict[str, Any], index: int, id_column: str | None) -> str:
    value = row.get(id_column) if id_column else row.get("id")
    return str(index) if value is None else str(value)


def _summaries_from_file(source: DataSource, options: EvalOptions, log: LogFn) -> list[dict[str, Any]]:
    columns = source.columns
    prediction = _prediction_column(columns, options, source.spec)
    reference = None if options.references else _reference_column(columns, prediction, options, source.spec)
    document = options.text_column or next((c for c in ("document", "article", "dialogue", "text", "source")
                                            if c in columns), None)
    if document is not None and document not in columns:
        raise UserError(f"{source.spec} has no column '{document}'; columns found: {', '.join(columns)}")
    rows = []
    for index, row in enumerate(source.rows()):
        if options.limit is not None and index >= options.limit:
            break
        pred = row.get(prediction)
        rows.append({"id": _row_id(row, index, options.id_column),
                     "document": row.get(document) if document else None,
                     "prediction": "" if pred is None else str(pred),
                     "reference": row.get(reference) if reference else None})
        if reference and not isinstance(rows[-1]["reference"], str):
            raise UserError(f"{source.spec}: row {index + 1} has no reference in column '{reference}'")
    if options.references:
        _attach_references(rows, options, log)
    if any(not isinstance(r["document"], str) for r in rows):
        log("note: no document column, so novel n-grams, copy bias and leading bias are not computed")
    return rows


def _attach_references(rows: list[dict[str, Any]], options: EvalOptions, log: LogFn) -> None:
    source = open_data(options.references, options.split)
    text, summary = pick_columns(source.columns, options.text_column, options.reference_column,
                                 need_summary=True, source=options.references)
    gold_rows = list(examples(source, text, summary, options.id_column))
    gold = dict(zip(unique_keys([e.id for e in gold_rows]), gold_rows))
    ids = unique_keys([r["id"] for r in rows])
    if len(gold) != len(rows) or set(gold) != set(ids):
        missing = [i for i in ids if i not in gold][:3]
        extra = [i for i in gold if i not in set(ids)][:3]
        raise UserError(f"predictions ({len(rows)}) and references ({len(gold)}) do not match by id"
                        + (f"; no reference for {', '.join(missing)}" if missing else "")
                        + (f"; no prediction for {', '.join(extra)}" if extra else ""))
    for key, row in zip(ids, rows):
        row["reference"] = gold[key].reference
        row["document"] = row["document"] or gold[key].document


# ---------------------------------------------------------------- scoring

def _mean(values: np.ndarray) -> float:
    return round(float(np.mean(values)), 4) if len(values) else 0.0


def _ci(values: np.ndarray, options: EvalOptions) -> list[float]:
    low, high = stats.bootstrap_ci(values, options.resamples, options.seed)
    return [round(low, 4), round(high, 4)]


def score_summaries(rows: list[dict[str, Any]], options: EvalOptions, tokenizer: Any = None,
                    log: LogFn = lambda m: None) -> dict[str, Any]:
    """ROUGE with intervals, style and bias; adds per-document ROUGE to each row."""
    predictions = [r["prediction"] for r in rows]
    references = [r["reference"] for r in rows]
    per_doc = rouge.rouge_per_document(predictions, references)
    metrics: dict[str, Any] = {"task": "summarization", "documents": len(rows)}
    for key in rouge.ROUGE_KEYS:
        metrics[key] = _mean(per_doc[key])
    metrics["ci95"] = {key: _ci(per_doc[key], options) for key in rouge.ROUGE_KEYS}
    for i, row in enumerate(rows):
        row["scores"] = {key: round(float(per_doc[key][i]), 4) for key in rouge.ROUGE_KEYS}
    empty = sum(1 for p in predictions if not p.strip())
    metrics["empty_predictions"] = empty
    if empty:
        log(f"warning: {empty} empty predictions (scored 0)")
    if options.limited_length_recall:
        recall = rouge.limited_length_recall_per_document(predictions, references)
        metrics["limited_length_recall"] = {key: _mean(v) for key, v in recall.items()}
        metrics["limited_length_recall_ci95"] = {key: _ci(v, options) for key, v in recall.items()}
    metrics["length_words"] = round(style.length_words(predictions), 3)
    if tokenizer is not None:
        lengths = [len(ids) for ids in tokenizer(predictions, add_special_tokens=False)["input_ids"]]
        metrics["length_tokens"] = round(float(np.mean(lengths)), 3) if lengths else 0.0
    documents = [r["document"] for r in rows]
    if all(isinstance(d, str) for d in documents):
        metrics["novel_ngrams"] = {k: round(v, 3) for k, v in style.novel_ngrams(predictions, documents).items()}
        metrics["copy_bias"] = round(style.copy_bias(predictions, documents), 3)
        metrics["leading_bias"] = round(style.leading_bias(predictions, documents), 3)
        metrics["reference_style"] = {
            "length_words": round(style.length_words(references), 3),
            "novel_ngrams": {k: round(v, 3) for k, v in style.novel_ngrams(references, documents).items()},
            "copy_bias": round(style.copy_bias(references, documents), 3),
            "leading_bias": round(style.leading_bias(references, documents), 3),
        }
    return metrics


def score_labels(rows: list[dict[str, Any]], task: str) -> dict[str, Any]:
    predictions = [r["prediction"] for r in rows]
    labels = [r["label"] for r in rows]
    metrics: dict[str, Any] = {"task": task, "documents": len(rows)}
    if task == "classification":
        metrics.update({k: round(v, 4) for k, v in glue.classification_metrics(predictions, labels).items()})
        for row in rows:
            row["scores"] = {"correct": float(row["prediction"] == row["label"])}
    else:
        metrics.update({k: round(v, 4) for k, v in glue.regression_metrics(predictions, labels).items()})
        for row in rows:
            row["scores"] = {"squared_error": float((row["prediction"] - row["label"]) ** 2)}
    metrics["conventions"] = glue.GLUE_CONVENTIONS
    return metrics


def _against(rows: list[dict[str, Any]], task: str, options: EvalOptions) -> dict[str, Any]:
    """Paired significance test against OTHER (an eval artifact, or predictions of the same documents)."""
    other_path = Path(options.against)
    manifest = read_manifest(other_path) if other_path.is_dir() else None
    ids = unique_keys([r["id"] for r in rows])
    if manifest is not None and manifest.get("kind") == "eval":
        other_rows = [json.loads(line) for line in (other_path / "predictions.jsonl").read_text().splitlines()]
        other = dict(zip(unique_keys([r["id"] for r in other_rows]), other_rows))
    else:
        source = open_data(options.against)
        prediction = _prediction_column(source.columns, options, options.against)
        other = {}
        by_id = dict(zip(ids, rows))
        raw = list(source.rows())
        for rid, row in zip(unique_keys([_row_id(r, i, options.id_column) for i, r in enumerate(raw)]), raw):
            if rid in by_id:
                other[rid] = {"id": rid, "prediction": row.get(prediction), "reference": by_id[rid].get("reference"),
                              "label": by_id[rid].get("label"), "document": by_id[rid].get("document")}
            else:
                other[rid] = {"id": rid}
        scored = [other[i] for i in ids if i in other]
        if len(scored) == len(ids):
            if task == "summarization":
                per_doc = rouge.rouge_per_document([str(r["prediction"] or "") for r in scored],
                                                   [r["reference"] for r in scored])
                for i, r in enumerate(scored):
                    r["scores"] = {k: float(per_doc[k][i]) for k in rouge.ROUGE_KEYS}
            else:
                score_labels(scored, task)
    if len(other) != len(rows) or set(other) != set(ids):
        missing = [i for i in ids if i not in other][:3]
        raise UserError(f"--against {options.against} has {len(other)} documents, this run {len(rows)}; the ids "
                        f"must be the same" + (f" (missing there: {', '.join(missing)})" if missing else ""))
    keys = list(rouge.ROUGE_KEYS) if task == "summarization" else list(rows[0]["scores"])
    result: dict[str, Any] = {"other": str(other_path), "method": options.significance,
                              "resamples": options.significance_resamples, "seed": options.seed,
                              "p": {}, "delta": {}, "other_scores": {}}
    for key in keys:
        a = np.array([r["scores"][key] for r in rows])  # rows are in the order of ids
        b = np.array([other[i]["scores"][key] for i in ids])
        result["p"][key] = round(stats.paired_test(a, b, options.significance, options.significance_resamples,
                                                   options.seed), 6)
        result["delta"][key] = round(float(a.mean() - b.mean()), 4)
        result["other_scores"][key] = round(float(b.mean()), 4)
    result["significant_at_0.05"] = {k: p < 0.05 for k, p in result["p"].items()}
    return result


# ---------------------------------------------------------------- running a model

def _summarize_with_model(options: EvalOptions, source: DataSource, output: Path, progress: ProgressFn | None,
                          log: LogFn) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any], Any]:
    from modelshrink.attention_stats import cross_attention, evident_bins, summarize_bins
    from modelshrink.efficiency import latency, parameter_count, peak_memory, reset_peak_memory, weight_bytes
    from modelshrink.generation import decode, generate_ids, plan_batches, resolve_generation
    from modelshrink.models import default_source_length, load_seq2seq, resolve_device
    from modelshrink.runtime import is_export

    text_column, summary_column = pick_columns(source.columns, options.text_column, options.summary_column,
                                               need_summary=True, source=str(options.data))
    docs = list(examples(source, text_column, summary_column, options.id_column, options.limit))
    if not docs:
        raise UserError(f"data {options.data} has no rows")
    if is_export(options.model):
        return _summarize_with_export(options, docs, progress, log)
    if options.attention_plot is not None and options.attention_plot not in {d.id for d in docs}:
        raise UserError(f"--attention-plot: no document with id '{options.attention_plot}' in {options.data}")
    device = resolve_device(options.device)
    model, tokenizer, family = load_seq2seq(options.model, "model", options.trust_remote_code, device)
    settings = resolve_generation(model.generation_config, num_beams=options.num_beams,
                                  length_penalty=options.length_penalty, min_length=options.min_length,
                                  max_length=options.max_length, no_repeat_ngram_size=options.no_repeat_ngram_size)
    max_source_length = options.max_source_length or default_source_length(tokenizer, model.config)
    rows: list[dict[str, Any] | None] = [None] * len(docs)
    attention: list[Any] = []
    figure = None
    reset_peak_memory(device)
    started = time.perf_counter()
    if progress:
        progress(0, len(docs))
    for batch in plan_batches(iter(docs), tokenizer, options.batch_size, max_source_length):
        padded = tokenizer.pad({"input_ids": batch.token_ids}, return_tensors="pt")
        input_ids, mask = padded["input_ids"].to(device), padded["attention_mask"].to(device)
        ids = generate_ids(model, input_ids, mask, settings)
        for example, text in zip(batch.rows, decode(tokenizer, ids)):
            rows[example.index] = {"id": example.id, "document": example.document, "prediction": text,
                                   "reference": example.reference}
        wanted_plot = options.attention_plot in {e.id for e in batch.rows}
        if options.attention_stats or wanted_plot:
            weights = cross_attention(model, input_ids, mask, ids)
            if options.attention_stats:
                attention.extend(evident_bins(w) for w in weights)
            if wanted_plot:
                b = next(i for i, e in enumerate(batch.rows) if e.id == options.attention_plot)
                figure = (weights[b].mean(axis=(0, 1)),
                          tokenizer.convert_ids_to_tokens(input_ids[b][mask[b].bool()].tolist()),
                          tokenizer.convert_ids_to_tokens(ids[b][1:1 + weights[b].shape[2]].tolist()))
        if progress:
            progress(sum(r is not None for r in rows), len(docs))
    seconds = time.perf_counter() - started
    efficiency: dict[str, Any] = {"parameters": parameter_count(model), "bytes_on_disk": weight_bytes(options.model),
                                  "throughput_docs_per_s": round(len(docs) / seconds, 4),
                                  "throughput_batch_size": options.batch_size, "device": device,
                                  **peak_memory(device)}
    if options.latency_docs:
        def one(example):
            enc = tokenizer(example.document, truncation=True, max_length=max_source_length, return_tensors="pt")
            generate_ids(model, enc["input_ids"].to(device), enc["attention_mask"].to(device), settings)

        log(f"measuring latency at batch 1 on {min(options.latency_docs, len(docs))} documents")
        efficiency.update({k: round(v, 3) if isinstance(v, float) else v
                           for k, v in latency(one, docs[:options.latency_docs]).items()})
    extra: dict[str, Any] = {"generation": settings.as_dict(), "max_source_length": max_source_length,
                             "family": family.name}
    if options.attention_stats:
        extra["attention"] = summarize_bins(attention)
    if figure is not None:
        from modelshrink.figures import attention_heatmap

        name = "attention-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in options.attention_plot) + ".png"
        attention_heatmap(figure[0], figure[1], figure[2], output / name,
                          f"cross attention (mean over layers and heads), document {options.attention_plot}")
        extra["attention_plot"] = name
    return rows, efficiency, extra, tokenizer


def _classify_with_model(options: EvalOptions, task: str, progress: ProgressFn | None,
                         log: LogFn) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    from modelshrink.efficiency import latency, parameter_count, peak_memory, reset_peak_memory, weight_bytes
    from modelshrink.models import load_classifier, resolve_device

    from modelshrink.classify import predict, read_labeled

    from modelshrink.runtime import is_export

    if is_export(options.model):
        return _classify_with_export(options, task, progress)
    device = resolve_device(options.device)
    model, tokenizer = load_classifier(options.model, "model", options.trust_remote_code, device)
    items = read_labeled(options.data, split=options.split, text_column=options.text_column,
                         text_pair_column=options.text_pair_column, label_column=options.label_column,
                         id_column=options.id_column, limit=options.limit, num_labels=model.config.num_labels,
                         label2id=model.config.label2id, task=task)
    text_column = options.text_column or "auto"
    label_column = options.label_column or "label"
    reset_peak_memory(device)
    started = time.perf_counter()
    for start in range(0, len(items), options.batch_size):
        batch = items[start:start + options.batch_size]
        for item, prediction in zip(batch, predict(model, tokenizer, batch, len(batch), device)):
            item["prediction"] = prediction
        if progress:
            progress(min(start + options.batch_size, len(items)), len(items))
    seconds = time.perf_counter() - started
    efficiency: dict[str, Any] = {"parameters": parameter_count(model), "bytes_on_disk": weight_bytes(options.model),
                                  "throughput_docs_per_s": round(len(items) / seconds, 4),
                                  "throughput_batch_size": options.batch_size, "device": device,
                                  **peak_memory(device)}
    if options.latency_docs:
        efficiency.update({k: round(v, 3) if isinstance(v, float) else v
                           for k, v in latency(lambda item: predict(model, tokenizer, [item], 1, device),
                                               items[:options.latency_docs]).items()})
    rows = [{"id": i["id"], "text": i["text"], **({"text_pair": i["text_pair"]} if i["text_pair"] is not None else {}),
             "prediction": i["prediction"], "label": i["label"]} for i in items]
    return rows, efficiency, {"text_column": text_column, "label_column": label_column}


# An export folder (`modelshrink export`) runs in the torch-free runtime, so ROUGE, accuracy and latency are
# those of the deployed form, measured by the same scoring and latency code as a PyTorch model.

def _export_efficiency(options: EvalOptions, runtime: Any, count: int, seconds: float) -> dict[str, Any]:
    from modelshrink.efficiency import weight_bytes

    return {"parameters": runtime.parameter_count(), "bytes_on_disk": weight_bytes(options.model),
            "throughput_docs_per_s": round(count / seconds, 4), "throughput_batch_size": options.batch_size,
            "device": "cpu (onnxruntime)"}


def _summarize_with_export(options: EvalOptions, docs: list[Any], progress: ProgressFn | None,
                           log: LogFn) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any], Any]:
    from modelshrink.efficiency import latency
    from modelshrink.models import load_tokenizer
    from modelshrink.runtime import load

    if options.attention_stats or options.attention_plot:
        raise UserError("--attention-stats and --attention-plot need the PyTorch model, not an export folder")
    runtime = load(options.model)
    overrides = dict(num_beams=options.num_beams, length_penalty=options.length_penalty,
                     min_length=options.min_length, max_length=options.max_length,
                     no_repeat_ngram_size=options.no_repeat_ngram_size)
    settings = runtime.settings(**overrides)
    max_source_length = options.max_source_length or runtime.max_source_length
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for start in range(0, len(docs), options.batch_size):
        batch = docs[start:start + options.batch_size]
        texts = runtime.summarize([d.document for d in batch], len(batch), max_source_length, **overrides)
        rows += [{"id": d.id, "document": d.document, "prediction": t, "reference": d.reference}
                 for d, t in zip(batch, texts)]
        if progress:
            progress(len(rows), len(docs))
    efficiency = _export_efficiency(options, runtime, len(docs), time.perf_counter() - started)
    if options.latency_docs:
        log(f"measuring latency at batch 1 on {min(options.latency_docs, len(docs))} documents")
        efficiency.update({k: round(v, 3) if isinstance(v, float) else v for k, v in latency(
            lambda d: runtime.summarize([d.document], 1, max_source_length, **overrides),
            docs[:options.latency_docs]).items()})
    generation = {k: getattr(settings, k) for k in ("num_beams", "length_penalty", "min_length", "max_length",
                                                     "no_repeat_ngram_size", "early_stopping")}
    extra = {"generation": generation, "max_source_length": max_source_length, "family": "onnx export"}
    return rows, efficiency, extra, load_tokenizer(options.model, "export")


def _classify_with_export(options: EvalOptions, task: str, progress: ProgressFn | None
                          ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    from modelshrink.classify import read_labeled
    from modelshrink.efficiency import latency
    from modelshrink.runtime import load

    runtime = load(options.model)
    config = runtime.config
    items = read_labeled(options.data, split=options.split, text_column=options.text_column,
                         text_pair_column=options.text_pair_column, label_column=options.label_column,
                         id_column=options.id_column, limit=options.limit, num_labels=len(config.get("id2label") or {}) or None,
                         label2id=config.get("label2id"), task=task)

    def predict(batch: list[dict[str, Any]]) -> list[Any]:
        pairs = [i["text_pair"] for i in batch] if batch[0]["text_pair"] is not None else None
        return runtime.classify([i["text"] for i in batch], pairs, len(batch))

    started = time.perf_counter()
    for start in range(0, len(items), options.batch_size):
        batch = items[start:start + options.batch_size]
        for item, prediction in zip(batch, predict(batch)):
            item["prediction"] = prediction
        if progress:
            progress(min(start + options.batch_size, len(items)), len(items))
    efficiency = _export_efficiency(options, runtime, len(items), time.perf_counter() - started)
    if options.latency_docs:
        efficiency.update({k: round(v, 3) if isinstance(v, float) else v
                           for k, v in latency(lambda item: predict([item]), items[:options.latency_docs]).items()})
    rows = [{"id": i["id"], "text": i["text"], **({"text_pair": i["text_pair"]} if i["text_pair"] is not None else {}),
             "prediction": i["prediction"], "label": i["label"]} for i in items]
    return rows, efficiency, {"text_column": options.text_column or "auto", "label_column": options.label_column or "label"}


def _labels_from_file(source: DataSource, options: EvalOptions) -> tuple[list[dict[str, Any]], str]:
    prediction = _prediction_column(source.columns, options, source.spec)
    label_column = options.label_column or "label"
    rows = []
    for index, row in enumerate(source.rows()):
        if options.limit is not None and index >= options.limit:
            break
        rows.append({"id": _row_id(row, index, options.id_column), "prediction": row.get(prediction),
                     "label": row.get(label_column)})
    values = [r["label"] for r in rows] + [r["prediction"] for r in rows]
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        raise UserError(f"{source.spec}: predictions and labels must be numbers (class ids or regression values)")
    task = "classification" if all(float(v).is_integer() for v in values) else "regression"
    if task == "classification":
        for r in rows:
            r["prediction"], r["label"] = int(r["prediction"]), int(r["label"])
    return rows, task


def _file_task(columns: list[str], options: EvalOptions) -> str:
    label = options.label_column or "label"
    return "labels" if label in columns and (options.label_column or "prediction" in columns) else "summarization"


# ---------------------------------------------------------------- the step

def evaluate(options: EvalOptions, output: str | Path, *, overwrite: bool = False, progress: ProgressFn | None = None,
             log: LogFn = lambda m: None) -> tuple[Path, dict[str, Any]]:
    """Score a model on data, or predictions on disk; write an eval artifact. Returns (path, metrics)."""
    from modelshrink.efficiency import weight_bytes
    from modelshrink.models import load_config, load_tokenizer, task_of

    output = check_output(output, overwrite)
    writer = ArtifactWriter(output, overwrite=overwrite)
    writer.check()
    source = open_data(options.data, options.split)
    if not source.columns:
        raise UserError(f"data {options.data} has no rows")
    if options.model is not None:
        task = task_of(load_config(options.model, "model", options.trust_remote_code))
        what = f"model {options.model}"
    else:
        task = _file_task(source.columns, options)
        what = f"predictions file {options.data}"
    _check_task_options("summarization" if task == "summarization" else "classification", options, what)
    if options.against is not None and not Path(options.against).exists():
        raise UserError(f"--against {options.against} does not exist")
    if options.reference_size is not None and not Path(options.reference_size).is_dir():
        raise UserError(f"--reference-size {options.reference_size} is not a model folder")

    with writer:
        resolved: dict[str, Any] = {"task": task}
        efficiency: dict[str, Any] = {}
        tokenizer = load_tokenizer(options.tokenizer, "tokenizer") if options.tokenizer else None
        if task == "summarization":
            if options.model is not None:
                rows, efficiency, extra, tokenizer = _summarize_with_model(options, source, writer.staging,
                                                                           progress, log)
                resolved.update({k: v for k, v in extra.items() if k != "attention"})
            else:
                rows, extra = _summaries_from_file(source, options, log), {}
            if not rows:
                raise UserError(f"data {options.data} has no rows")
            metrics = score_summaries(rows, options, tokenizer, log)
            if "attention" in extra:
                metrics["attention"] = extra["attention"]
            metrics["settings"] = {"rouge": rouge.ROUGE_SETTINGS, "style": STYLE_SETTINGS,
                                   "bootstrap": {"resamples": options.resamples, "seed": options.seed,
                                                 "confidence": 0.95}}
            if "generation" in extra:
                metrics["settings"]["generation"] = extra["generation"]
        else:
            if options.model is not None:
                rows, efficiency, extra = _classify_with_model(options, task, progress, log)
                resolved.update(extra)
            else:
                rows, task = _labels_from_file(source, options)
                resolved["task"] = task
            metrics = score_labels(rows, task)
        if efficiency:
            if options.reference_size is not None:
                reference = weight_bytes(options.reference_size)
                efficiency["reference_bytes_on_disk"] = reference
                efficiency["compression_ratio"] = round(reference / efficiency["bytes_on_disk"], 4) \
                    if efficiency["bytes_on_disk"] else None
            metrics["efficiency"] = efficiency
        if options.against is not None:
            metrics["against"] = _against(rows, "summarization" if task == "summarization" else task, options)
        with open(writer.staging / "predictions.jsonl", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        (writer.staging / "metrics.json").write_text(json.dumps(metrics, indent=2, ensure_ascii=False) + "\n")
        parents = [parent_ref(role, spec) for role, spec in (("model", options.model), ("data", options.data),
                                                             ("references", options.references),
                                                             ("against", options.against),
                                                             ("reference_size", options.reference_size)) if spec]
        path = writer.commit(step="eval", kind="eval", options=options.recorded(), parents=parents,
                             metrics=_headline(metrics), resolved=resolved)
    return path, metrics


def _headline(metrics: dict[str, Any]) -> dict[str, Any]:
    keys = ("task", "documents", *rouge.ROUGE_KEYS, "accuracy", "f1", "mcc", "pearson", "spearman", "length_words")
    head = {k: metrics[k] for k in keys if k in metrics}
    for k in ("parameters", "bytes_on_disk", "compression_ratio", "latency_ms_p50"):
        if k in metrics.get("efficiency", {}):
            head[k] = metrics["efficiency"][k]
    return head
