"""Predictions files for `eval`: their prediction, reference, document and label columns, and
references attached by id from another dataset.

A predictions file is scored without a model: summaries against references, or class ids and
regression values against labels. The rows returned are the ones `scoring` reads and
predictions.jsonl holds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from modelshrink.data import DataSource, examples, open_data, pick_columns, unique_keys
from modelshrink.runtime.columns import detect_text_column
from modelshrink.errors import UserError
from modelshrink.options.eval import EvalOptions

LogFn = Callable[[str], None]


def prediction_column(columns: list[str], options: EvalOptions, source: str) -> str:
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


def _document_column(columns: list[str], options: EvalOptions, source: str) -> str | None:
    """The documents, found as every step finds its text column; a predictions file may have none."""
    try:
        return pick_columns(columns, options.text_column, source=source)[0]
    except UserError:
        if options.text_column is not None:  # named but absent: the user's mistake, not a missing column
            raise
        return None


def row_id(row: dict[str, Any], index: int, id_column: str | None) -> str:
    value = row.get(id_column) if id_column else row.get("id")
    return str(index) if value is None else str(value)


def text_task(columns: list[str], options: EvalOptions) -> str:
    """What generated text is scored as: --task, or for `auto` translation when the text read is a `source`
    column (source/target pairs, nested translation rows), else summarization."""
    if options.task != "auto":
        return options.task
    text = options.text_column or detect_text_column(columns, summary_given=options.summary_column is not None)
    return "translation" if text == "source" else "summarization"


def file_task(columns: list[str], options: EvalOptions) -> str:
    """`labels` for class ids or regression values against labels, else what `text_task` says."""
    label = options.label_column or "label"
    if label in columns and (options.label_column or "prediction" in columns):
        return "labels"
    return text_task(columns, options)


def summaries_from_file(source: DataSource, options: EvalOptions, log: LogFn) -> list[dict[str, Any]]:
    columns = source.columns
    prediction = prediction_column(columns, options, source.spec)
    reference = None if options.references else _reference_column(columns, prediction, options, source.spec)
    document = _document_column(columns, options, source.spec)
    rows = []
    for index, row in enumerate(source.rows()):
        if options.limit is not None and index >= options.limit:
            break
        pred = row.get(prediction)
        rows.append({"id": row_id(row, index, options.id_column),
                     "document": row.get(document) if document else None,
                     "prediction": "" if pred is None else str(pred),
                     "reference": row.get(reference) if reference else None})
        if reference and not isinstance(rows[-1]["reference"], str):
            raise UserError(f"{source.spec}: row {index + 1} has no reference in column '{reference}'")
    if options.references:
        _attach_references(rows, options)
    if any(not isinstance(r["document"], str) for r in rows):
        log("note: no document column, so novel n-grams, copy bias and leading bias are not computed")
    return rows


def _attach_references(rows: list[dict[str, Any]], options: EvalOptions) -> None:
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


def labels_from_file(source: DataSource, options: EvalOptions) -> tuple[list[dict[str, Any]], str]:
    """Rows of class ids (`classification`) or of regression values (`regression`), and which."""
    prediction = prediction_column(source.columns, options, source.spec)
    label_column = options.label_column or "label"
    rows = []
    for index, row in enumerate(source.rows()):
        if options.limit is not None and index >= options.limit:
            break
        rows.append({"id": row_id(row, index, options.id_column), "prediction": row.get(prediction),
                     "label": row.get(label_column)})
    values = [r["label"] for r in rows] + [r["prediction"] for r in rows]
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
        raise UserError(f"{source.spec}: predictions and labels must be numbers (class ids or regression values)")
    task = "classification" if all(float(v).is_integer() for v in values) else "regression"
    if task == "classification":
        for r in rows:
            r["prediction"], r["label"] = int(r["prediction"]), int(r["label"])
    return rows, task


def eval_rows(path: str | Path) -> dict[str, dict[str, Any]]:
    """An eval artifact's predictions.jsonl, keyed by (unique) id, with their per-document scores."""
    rows = [json.loads(line) for line in (Path(path) / "predictions.jsonl").read_text().splitlines()]
    return dict(zip(unique_keys([r["id"] for r in rows]), rows))


def paired_predictions(spec: str, rows: list[dict[str, Any]], options: EvalOptions) -> dict[str, dict[str, Any]]:
    """Another system's predictions file, keyed by id, each beside this run's reference, label and document.

    Not scored yet; an id this run lacks comes back with its id alone."""
    source = open_data(spec)
    prediction = prediction_column(source.columns, options, spec)
    by_id = dict(zip(unique_keys([r["id"] for r in rows]), rows))
    raw = list(source.rows())
    other: dict[str, dict[str, Any]] = {}
    for rid, row in zip(unique_keys([row_id(r, i, options.id_column) for i, r in enumerate(raw)]), raw):
        if rid in by_id:
            other[rid] = {"id": rid, "prediction": row.get(prediction), "reference": by_id[rid].get("reference"),
                          "label": by_id[rid].get("label"), "document": by_id[rid].get("document")}
        else:
            other[rid] = {"id": rid}
    return other
