"""Running the system under `eval`: a PyTorch model or an export folder generates summaries or
predicts labels for the data, and is measured for footprint and speed on the way.

An export folder (`modelshrink export`) runs in the torch-free runtime, so ROUGE, accuracy and
latency are those of the deployed form, measured by the same scoring and latency code as a
PyTorch model. Each entry point returns (rows, efficiency, resolved extras[, tokenizer]).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from modelshrink.data import DataSource, examples, pick_columns
from modelshrink.errors import UserError
from modelshrink.options.eval import EvalOptions

ProgressFn = Callable[[int, int], None]
LogFn = Callable[[str], None]


def _latency(run_one: Callable[[Any], Any], items: list[Any]) -> dict[str, Any]:
    from modelshrink.models.efficiency import latency

    return {k: round(v, 3) if isinstance(v, float) else v for k, v in latency(run_one, items).items()}


def _export_efficiency(options: EvalOptions, runtime: Any, timing: dict[str, Any], launch: Any) -> dict[str, Any]:
    from modelshrink.models.efficiency import weight_bytes

    return {"parameters": runtime.parameter_count(), "bytes_on_disk": weight_bytes(options.model),
            **_throughput(timing, options, launch), "device": "cpu (onnxruntime)",
            "threads": (runtime.encoder if runtime.task == "summarization" else runtime.classifier
                        ).get_session_options().intra_op_num_threads}


def _in_order(items: list[Any], batch_size: int) -> Iterator[Any]:
    """Batches of `batch_size` items in input order (items carry `.index`)."""
    from modelshrink.generation.settings import Batch

    for number, start in enumerate(range(0, len(items), batch_size)):
        yield Batch(number, items[start:start + batch_size])


# ---------------------------------------------------------------- summaries

def generate_summaries(options: EvalOptions, source: DataSource, staging: Path, launch: Any,
                       progress: ProgressFn | None, log: LogFn, model: Any = None
                       ) -> tuple[list[dict[str, Any]] | None, dict[str, Any], dict[str, Any], Any]:
    """Summarize every document with the model (or export folder); an attention plot lands in
    `staging`. Under a launcher every process takes its share; the rows come back on the main
    process only (None elsewhere). `model`: `options.model` resolved already (`ModelSource`), if it was."""
    from modelshrink.runtime import is_export

    text_column, summary_column = pick_columns(source.columns, options.text_column, options.summary_column,
                                               need_summary=True, source=str(options.data))
    docs = list(examples(source, text_column, summary_column, options.id_column, options.limit))
    if not docs:
        raise UserError(f"data {options.data} has no rows")
    if is_export(options.model):
        return _summarize_with_export(options, docs, staging, launch, progress, log)
    return _summarize_with_model(options, docs, staging, launch, progress, log, model, text_column == "source")


def _sharded(batches: Any, staging: Path, launch: Any, run: Callable[[Any], list[dict[str, Any]]], total: int,
             progress: ProgressFn | None) -> tuple[list[dict[str, Any]] | None, dict[str, Any]]:
    """Run `run(batch)` (one row dict per document of the batch, in its order) over this process's
    share of `batches`; the main process gets every row back in input order, with the run's
    documents and seconds (the others get None)."""
    from modelshrink.generation import shards

    def rows_of(batch: Any, done: set[int]) -> list[dict[str, Any]]:
        rows = [{"_index": item.index, **row} for item, row in zip(batch.rows, run(batch))]
        return [r for r in rows if r["_index"] not in done]

    started = time.perf_counter()
    counts = shards.run_part(batches, launch, staging, rows_of, total, progress)
    timing = {"documents": counts["generated"], "seconds": time.perf_counter() - started}
    if not launch.main:
        return None, timing
    rows = list(shards.merged_rows(staging, launch.world, total))
    shutil.rmtree(staging / shards.PARTS)
    return rows, timing


def _throughput(timing: dict[str, Any], options: EvalOptions, launch: Any) -> dict[str, Any]:
    """Documents per second over every process, at the batch size (or token budget) asked for."""
    seconds = timing["seconds"]
    result = {"throughput_docs_per_s": round(timing["documents"] / seconds, 4) if timing["documents"] else None,
              "throughput_batch_size": options.batch_size, "processes": launch.world}
    if options.max_tokens is not None:
        result["throughput_max_tokens"] = options.max_tokens
    return result


def _latency_note(launch: Any) -> dict[str, Any]:
    return {} if launch.world == 1 else {
        "latency_note": f"measured on the main process alone, after the {launch.world} processes finished"}


def _summarize_with_model(options: EvalOptions, docs: list[Any], staging: Path, launch: Any,
                          progress: ProgressFn | None, log: LogFn, source: Any = None, translation: bool = False
                          ) -> tuple[list[dict[str, Any]] | None, dict[str, Any], dict[str, Any], Any]:
    from modelshrink.models.efficiency import parameter_count, peak_memory, reset_peak_memory, weight_bytes
    from modelshrink.generation.summarizer import Summarizer

    if options.attention_plot is not None and options.attention_plot not in {d.id for d in docs}:
        raise UserError(f"--attention-plot: no document with id '{options.attention_plot}' in {options.data}")
    device = launch.device
    system = Summarizer(options, source or options.model, "model", device, staging,
                        nested_rows=getattr(options, "source_lang", None) is not None, log=log,
                        translation=translation)
    model, tokenizer = system.model, system.tokenizer

    def row_of(example: Any, text: str, lam: float) -> dict[str, Any]:
        row = {"id": example.id, "document": example.document, "prediction": text, "reference": example.reference}
        if options.lambda_range is not None:
            row["lambda"] = lam
        return row

    reset_peak_memory(device)
    batches = system.batches(iter(docs), log)
    # Everything that generates, the latency runs included, runs at the temperature asked for.
    with system.temperature():
        rows, timing = _sharded(batches, staging, launch, lambda batch: system.summarize(batch, row_of), len(docs),
                                progress)
        if rows is None:
            return None, {}, {}, tokenizer
        efficiency: dict[str, Any] = {"parameters": parameter_count(model),
                                      "bytes_on_disk": weight_bytes(options.model),
                                      **_throughput(timing, options, launch), "device": device,
                                      "dtype": options.dtype, **peak_memory(device)}
        if options.latency_docs:
            log(f"measuring latency at batch 1 on {min(options.latency_docs, len(docs))} documents")
            efficiency.update(_latency(system.generate_one, docs[:options.latency_docs]), **_latency_note(launch))
    extra: dict[str, Any] = {"generation": system.settings.as_dict(), "max_source_length": system.max_source_length,
                             "family": system.family.name, "dtype": options.dtype, "processes": launch.world,
                             "lambda_by_kind": system.lambdas}
    extra["generator"] = system.generator  # the search that wrote the predictions (issue 79)
    if system.check is not None:
        extra["static_search_check"] = system.check
    if system.static_memory is not None:
        extra["static_search_memory"] = system.static_memory
    if system.truncated:
        extra["truncated_to_max_tokens"] = len(system.truncated)
    attention = system.recorder.summary(rows)
    if attention is not None:
        extra["attention"] = attention
    if system.recorder.plot_name is not None:
        extra["attention_plot"] = system.recorder.plot_name
    return rows, efficiency, extra, tokenizer


def _export_languages(options: EvalOptions, runtime: Any, tokenizer: Any) -> int | None:
    """The token an export folder is made to start with for --target-lang (None: its own), by the rule a PyTorch
    model follows (`languages.target_code`); --source-lang must be the code its tokenizer was exported marking
    sources with (an export folder's tokenizer file fixes it)."""
    from modelshrink.languages import chosen_code, code_of, language_codes, target_code

    what, nested = f"export {options.model}", options.source_lang is not None
    codes = language_codes(tokenizer)
    _, forced = target_code(codes, runtime.search.forced_bos_token_id, runtime.search.decoder_start_token_id,
                            options.target_lang, what, nested)
    if options.source_lang is not None:
        code = chosen_code(codes, "--source-lang", options.source_lang, what, "reads one language", nested)
        marked = code_of(tokenizer, getattr(tokenizer, "src_lang", None))
        if code is not None and code != marked:
            raise UserError(f"--source-lang {options.source_lang}: {what} marks its sources as {marked}, as it was "
                            "exported (its tokenizer file fixes it); export the model again from a tokenizer saved "
                            f"with src_lang {code}, or leave --source-lang out")
    return forced


def _summarize_with_export(options: EvalOptions, docs: list[Any], staging: Path, launch: Any,
                           progress: ProgressFn | None, log: LogFn
                           ) -> tuple[list[dict[str, Any]] | None, dict[str, Any], dict[str, Any], Any]:
    from modelshrink.models.loading import load_tokenizer
    from modelshrink.runtime import load

    if options.attention_stats or options.attention_plot:
        raise UserError("--attention-stats and --attention-plot need the PyTorch model, not an export folder")
    if given := options.temperature_options():
        raise UserError(f"{given[0]} needs the PyTorch model: an export folder runs at the attention temperature it "
                        "was exported with")
    for name in ("max_tokens", "dtype", "generator", "prefix"):
        if getattr(options, name) != EvalOptions.__dataclass_fields__[name].default:
            raise UserError(f"--{name.replace('_', '-')} applies to a PyTorch model; an export folder runs as exported")
    runtime = load(options.model, threads=options.threads)
    tokenizer = load_tokenizer(options.model, "export")
    overrides = dict(num_beams=options.num_beams, length_penalty=options.length_penalty,
                     min_length=options.min_length, max_length=options.max_length,
                     no_repeat_ngram_size=options.no_repeat_ngram_size,
                     forced_bos_token_id=_export_languages(options, runtime, tokenizer))
    settings = runtime.settings(**overrides)
    max_source_length = options.max_source_length or runtime.max_source_length

    def run(batch: Any) -> list[dict[str, Any]]:
        texts = runtime.summarize([d.document for d in batch.rows], len(batch.rows), max_source_length, **overrides)
        return [{"id": d.id, "document": d.document, "prediction": t, "reference": d.reference}
                for d, t in zip(batch.rows, texts)]

    rows, timing = _sharded(_in_order(docs, options.batch_size), staging, launch, run, len(docs), progress)
    if rows is None:
        return None, {}, {}, tokenizer
    efficiency = _export_efficiency(options, runtime, timing, launch)
    if options.latency_docs:
        log(f"measuring latency at batch 1 on {min(options.latency_docs, len(docs))} documents")
        efficiency.update(_latency(lambda d: runtime.summarize([d.document], 1, max_source_length, **overrides),
                                   docs[:options.latency_docs]), **_latency_note(launch))
    generation = {k: getattr(settings, k) for k in ("num_beams", "length_penalty", "min_length", "max_length",
                                                     "no_repeat_ngram_size", "early_stopping")}
    extra = {"generation": generation, "max_source_length": max_source_length, "family": "onnx export",
             "processes": launch.world}
    return rows, efficiency, extra, tokenizer


# ---------------------------------------------------------------- labels

def predict_labels(options: EvalOptions, task: str, staging: Path, launch: Any, progress: ProgressFn | None,
                   model: Any = None) -> tuple[list[dict[str, Any]] | None, dict[str, Any], dict[str, Any]]:
    """Predict a class id or a regression value for every row with the model (or export folder);
    under a launcher every process takes its share and the main process gets the rows (None elsewhere).
    `model`: `options.model` resolved already (`ModelSource`), if it was."""
    from modelshrink.runtime import is_export

    if is_export(options.model):
        return _classify_with_export(options, task, staging, launch, progress)
    return _classify_with_model(options, task, staging, launch, progress, model)


@dataclass
class _Item:
    index: int
    fields: dict[str, Any]


def _read_items(options: EvalOptions, task: str, num_labels: int | None,
                label2id: dict[str, int] | None) -> list[_Item]:
    from modelshrink.training.classify import read_labeled

    items = read_labeled(options.data, split=options.split, text_column=options.text_column,
                         text_pair_column=options.text_pair_column, label_column=options.label_column,
                         id_column=options.id_column, limit=options.limit, num_labels=num_labels,
                         label2id=label2id, task=task)
    return [_Item(i, item) for i, item in enumerate(items)]


def _predict_all(items: list[_Item], predict: Callable[[list[dict[str, Any]]], list[Any]], options: EvalOptions,
                 staging: Path, launch: Any, progress: ProgressFn | None
                 ) -> tuple[list[dict[str, Any]] | None, dict[str, Any]]:
    def run(batch: Any) -> list[dict[str, Any]]:
        fields = [item.fields for item in batch.rows]
        return [{"id": f["id"], "text": f["text"], **({"text_pair": f["text_pair"]} if f["text_pair"] is not None
                                                       else {}),
                 "prediction": prediction, "label": f["label"]} for f, prediction in zip(fields, predict(fields))]

    return _sharded(_in_order(items, options.batch_size), staging, launch, run, len(items), progress)


def _label_extra(options: EvalOptions, launch: Any) -> dict[str, Any]:
    return {"text_column": options.text_column or "auto", "label_column": options.label_column or "label",
            "processes": launch.world}


def _classify_with_model(options: EvalOptions, task: str, staging: Path, launch: Any, progress: ProgressFn | None,
                         source: Any = None) -> tuple[list[dict[str, Any]] | None, dict[str, Any], dict[str, Any]]:
    from modelshrink.training.classify import predict
    from modelshrink.models.efficiency import parameter_count, peak_memory, reset_peak_memory, weight_bytes
    from modelshrink.models.loading import default_source_length, load_classifier
    from modelshrink.precision import torch_dtype

    device = launch.device
    model, tokenizer = load_classifier(source or options.model, "model", options.trust_remote_code, device,
                                       allow_pickle=options.allow_pickle)
    model.to(torch_dtype(options.dtype))
    # not the tokenizer's own limit alone: a model with fewer positions would index past its position table
    max_length = default_source_length(tokenizer, model.config)
    items = _read_items(options, task, model.config.num_labels, model.config.label2id)
    reset_peak_memory(device)
    rows, timing = _predict_all(items, lambda batch: predict(model, tokenizer, batch, len(batch), device, max_length),
                                options, staging, launch, progress)
    if rows is None:
        return None, {}, {}
    efficiency: dict[str, Any] = {"parameters": parameter_count(model), "bytes_on_disk": weight_bytes(options.model),
                                  **_throughput(timing, options, launch), "device": device, "dtype": options.dtype,
                                  **peak_memory(device)}
    if options.latency_docs:
        efficiency.update(_latency(lambda item: predict(model, tokenizer, [item.fields], 1, device, max_length),
                                   items[:options.latency_docs]), **_latency_note(launch))
    return rows, efficiency, {**_label_extra(options, launch), "dtype": options.dtype, "max_length": max_length}


def _classify_with_export(options: EvalOptions, task: str, staging: Path, launch: Any, progress: ProgressFn | None
                          ) -> tuple[list[dict[str, Any]] | None, dict[str, Any], dict[str, Any]]:
    from modelshrink.runtime import load

    if options.dtype != "fp32":
        raise UserError("--dtype applies to a PyTorch model; an export folder runs as exported")
    runtime = load(options.model, threads=options.threads)
    config = runtime.config
    items = _read_items(options, task, len(config.get("id2label") or {}) or None, config.get("label2id"))

    def predict(batch: list[dict[str, Any]]) -> list[Any]:
        pairs = [i["text_pair"] for i in batch] if batch[0]["text_pair"] is not None else None
        return runtime.classify([i["text"] for i in batch], pairs, len(batch))

    rows, timing = _predict_all(items, predict, options, staging, launch, progress)
    if rows is None:
        return None, {}, {}
    efficiency = _export_efficiency(options, runtime, timing, launch)
    if options.latency_docs:
        efficiency.update(_latency(lambda item: predict([item.fields]), items[:options.latency_docs]),
                          **_latency_note(launch))
    return rows, efficiency, _label_extra(options, launch)
