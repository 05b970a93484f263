"""Running the system under `eval`: a PyTorch model or an export folder generates summaries or
predicts labels for the data, and is measured for footprint and speed on the way.

An export folder (`modelshrink export`) runs in the torch-free runtime, so ROUGE, accuracy and
latency are those of the deployed form, measured by the same scoring and latency code as a
PyTorch model. Each entry point returns (rows, efficiency, resolved extras[, tokenizer]).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from modelshrink.data import DataSource, examples, pick_columns
from modelshrink.errors import UserError
from modelshrink.options.eval import EvalOptions

ProgressFn = Callable[[int, int], None]
LogFn = Callable[[str], None]


def _latency(run_one: Callable[[Any], Any], items: list[Any]) -> dict[str, Any]:
    from modelshrink.efficiency import latency

    return {k: round(v, 3) if isinstance(v, float) else v for k, v in latency(run_one, items).items()}


def _export_efficiency(options: EvalOptions, runtime: Any, count: int, seconds: float) -> dict[str, Any]:
    from modelshrink.efficiency import weight_bytes

    return {"parameters": runtime.parameter_count(), "bytes_on_disk": weight_bytes(options.model),
            "throughput_docs_per_s": round(count / seconds, 4), "throughput_batch_size": options.batch_size,
            "device": "cpu (onnxruntime)"}


# ---------------------------------------------------------------- summaries

def generate_summaries(options: EvalOptions, source: DataSource, output: Path, progress: ProgressFn | None,
                       log: LogFn) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any], Any]:
    """Summarize every document with the model (or export folder); an attention plot lands in `output`."""
    from modelshrink.runtime import is_export

    text_column, summary_column = pick_columns(source.columns, options.text_column, options.summary_column,
                                               need_summary=True, source=str(options.data))
    docs = list(examples(source, text_column, summary_column, options.id_column, options.limit))
    if not docs:
        raise UserError(f"data {options.data} has no rows")
    if is_export(options.model):
        return _summarize_with_export(options, docs, progress, log)
    return _summarize_with_model(options, docs, output, progress, log)


def _summarize_with_model(options: EvalOptions, docs: list[Any], output: Path, progress: ProgressFn | None,
                          log: LogFn) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any], Any]:
    from modelshrink.attention_stats import cross_attention, evident_bins, summarize_bins
    from modelshrink.efficiency import parameter_count, peak_memory, reset_peak_memory, weight_bytes
    from modelshrink.generation import decode, generate_ids, plan_batches, resolve_generation
    from modelshrink.models import default_source_length, load_seq2seq, resolve_device

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
        efficiency.update(_latency(one, docs[:options.latency_docs]))
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


def _summarize_with_export(options: EvalOptions, docs: list[Any], progress: ProgressFn | None,
                           log: LogFn) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any], Any]:
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
        efficiency.update(_latency(lambda d: runtime.summarize([d.document], 1, max_source_length, **overrides),
                                   docs[:options.latency_docs]))
    generation = {k: getattr(settings, k) for k in ("num_beams", "length_penalty", "min_length", "max_length",
                                                     "no_repeat_ngram_size", "early_stopping")}
    extra = {"generation": generation, "max_source_length": max_source_length, "family": "onnx export"}
    return rows, efficiency, extra, load_tokenizer(options.model, "export")


# ---------------------------------------------------------------- labels

def predict_labels(options: EvalOptions, task: str, progress: ProgressFn | None
                   ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Predict a class id or a regression value for every row with the model (or export folder)."""
    from modelshrink.runtime import is_export

    if is_export(options.model):
        return _classify_with_export(options, task, progress)
    return _classify_with_model(options, task, progress)


def _read_items(options: EvalOptions, task: str, num_labels: int | None,
                label2id: dict[str, int] | None) -> list[dict[str, Any]]:
    from modelshrink.classify import read_labeled

    return read_labeled(options.data, split=options.split, text_column=options.text_column,
                        text_pair_column=options.text_pair_column, label_column=options.label_column,
                        id_column=options.id_column, limit=options.limit, num_labels=num_labels,
                        label2id=label2id, task=task)


def _predict_all(items: list[dict[str, Any]], predict: Callable[[list[dict[str, Any]]], list[Any]],
                 batch_size: int, progress: ProgressFn | None) -> None:
    for start in range(0, len(items), batch_size):
        batch = items[start:start + batch_size]
        for item, prediction in zip(batch, predict(batch)):
            item["prediction"] = prediction
        if progress:
            progress(min(start + batch_size, len(items)), len(items))


def _label_rows(items: list[dict[str, Any]], options: EvalOptions
                ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows = [{"id": i["id"], "text": i["text"], **({"text_pair": i["text_pair"]} if i["text_pair"] is not None else {}),
             "prediction": i["prediction"], "label": i["label"]} for i in items]
    return rows, {"text_column": options.text_column or "auto", "label_column": options.label_column or "label"}


def _classify_with_model(options: EvalOptions, task: str, progress: ProgressFn | None
                         ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    from modelshrink.classify import predict
    from modelshrink.efficiency import parameter_count, peak_memory, reset_peak_memory, weight_bytes
    from modelshrink.models import load_classifier, resolve_device

    device = resolve_device(options.device)
    model, tokenizer = load_classifier(options.model, "model", options.trust_remote_code, device)
    items = _read_items(options, task, model.config.num_labels, model.config.label2id)
    reset_peak_memory(device)
    started = time.perf_counter()
    _predict_all(items, lambda batch: predict(model, tokenizer, batch, len(batch), device), options.batch_size,
                 progress)
    seconds = time.perf_counter() - started
    efficiency: dict[str, Any] = {"parameters": parameter_count(model), "bytes_on_disk": weight_bytes(options.model),
                                  "throughput_docs_per_s": round(len(items) / seconds, 4),
                                  "throughput_batch_size": options.batch_size, "device": device,
                                  **peak_memory(device)}
    if options.latency_docs:
        efficiency.update(_latency(lambda item: predict(model, tokenizer, [item], 1, device),
                                   items[:options.latency_docs]))
    rows, extra = _label_rows(items, options)
    return rows, efficiency, extra


def _classify_with_export(options: EvalOptions, task: str, progress: ProgressFn | None
                          ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    from modelshrink.runtime import load

    runtime = load(options.model)
    config = runtime.config
    items = _read_items(options, task, len(config.get("id2label") or {}) or None, config.get("label2id"))

    def predict(batch: list[dict[str, Any]]) -> list[Any]:
        pairs = [i["text_pair"] for i in batch] if batch[0]["text_pair"] is not None else None
        return runtime.classify([i["text"] for i in batch], pairs, len(batch))

    started = time.perf_counter()
    _predict_all(items, predict, options.batch_size, progress)
    efficiency = _export_efficiency(options, runtime, len(items), time.perf_counter() - started)
    if options.latency_docs:
        efficiency.update(_latency(lambda item: predict([item]), items[:options.latency_docs]))
    rows, extra = _label_rows(items, options)
    return rows, efficiency, extra
