"""Teacher pseudo-labeling with attention temperature (PLATE, sections 3.2-3.3).

The teacher writes one summary per document by beam search (or sampling, for the baselines). The
run streams its input: documents are read in windows, each window sorted by length into batches,
and every finished batch is appended to a part file at once, so `resume` continues an interrupted
run from its last complete batch. Under `accelerate launch` or `torchrun` each process runs its
share of the batches into its own part (`generation/shards.py`); the final `data.jsonl` is assembled in input
order by the main process, and does not depend on the number of processes.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from modelshrink.generation import shards
from modelshrink.artifacts import RUN_FILE, ArtifactWriter, parent_ref
from modelshrink.data import examples, open_data, pick_columns
from modelshrink.errors import UserError
from modelshrink.options.batching import resolve_batching
from modelshrink.options.pseudolabel import PseudolabelOptions
from modelshrink.precision import check_precision
from modelshrink.training.runs import finished, open_run
from modelshrink.generation.summarizer import Summarizer


ProgressFn = Callable[[int, int], None]  # (documents done, documents in total)


def pseudolabel(options: PseudolabelOptions, output: str | Path, *, overwrite: bool = False, resume: bool = False,
                progress: ProgressFn | None = None, log: Callable[[str], None] | None = None) -> Path:
    """Run the teacher over the data and write a dataset artifact; returns its path (on every process;
    only the main one writes it). The function behind `modelshrink pseudolabel`.

    ```python
    import modelshrink
    from modelshrink import PseudolabelOptions

    # PLATE labels: the teacher's attention at temperature λ = 2, beam 4
    options = PseudolabelOptions(teacher="teacher", data="docs.jsonl",
                                 lam=2.0, num_beams=4)
    labels = modelshrink.pseudolabel(options, "labels")
    ```
    """
    from modelshrink.models.loading import resolve_device

    log = log or (lambda message: None)
    output = Path(output)
    options = resolve_batching(options, resolve_device(options.device))
    if (output / "data.jsonl").is_file() and finished(output, overwrite=overwrite, resume=resume, log=log,
                                                        recorded=options.recorded()):
        return output

    # Everything that can be wrong with the input is checked before anything is written.
    launch = shards.launch(options.device)
    check_precision(options.dtype, launch.device, "--dtype")
    if not launch.main:
        log = lambda message: None  # noqa: E731  (one process speaks)
    writer = ArtifactWriter(output, overwrite=overwrite, resume=resume, keep_on_failure=True)
    writer.check()
    if resume and writer.staging.is_dir():
        shards.check_parts(writer.staging, launch.world)
    source = open_data(options.data, options.split)
    if not source.columns:
        raise UserError(f"data {options.data} has no rows")
    text_column, summary_column, total = _columns_and_count(options, source)

    device = launch.device
    teacher = Summarizer(options, options.teacher, "teacher", device, log=log, translation=text_column == "source")
    lambdas = teacher.lambdas
    mixed_kinds = len(set(lambdas.values())) > 1
    resolved = {"generation": teacher.settings.as_dict(), "max_source_length": teacher.max_source_length,
                "prefix": teacher.prefix, "lambda_by_kind": lambdas, "text_column": text_column, "summary_column": summary_column,
                "family": teacher.family.name, "device": device, "dtype": options.dtype, "processes": launch.world}
    recorded = options.recorded()
    parents = [parent_ref("teacher", options.teacher), parent_ref("data", options.data)]
    staging = open_run(launch, writer, recorded, parents)
    teacher.recorder.folder = staging

    def row_of(example: Any, summary: str, lam: float) -> dict[str, Any]:
        row: dict[str, Any] = {"_index": example.index, "id": example.id, "document": example.document,
                               "summary": summary}
        if example.reference is not None:
            row["reference"] = example.reference
        row["lambda"] = lam
        if mixed_kinds:
            row["lambda_by_kind"] = {k: (lam if v is None else v) for k, v in lambdas.items()}
        return row

    def label(batch: Any, done: set[int]) -> list[dict[str, Any]]:
        return [r for r in teacher.summarize(batch, row_of) if r["_index"] not in done]

    stream = examples(source, text_column, summary_column, options.id_column, options.limit)
    batches = teacher.batches(stream, log)
    started = time.perf_counter()
    with teacher.temperature():
        counts = shards.run_part(batches, launch, staging, label, total, progress)
    seconds = time.perf_counter() - started  # the slowest process's, as every one waited for the others
    if not launch.main:
        return output

    metrics = _merged_metrics(staging, launch, total, counts["generated"], seconds, teacher, log)
    if teacher.recorder.plot_name is not None:
        resolved["attention_plot"] = teacher.recorder.plot_name
    return writer.commit(step="pseudolabel", kind="dataset", options=recorded, parents=parents, metrics=metrics,
                         resolved=resolved)


def _merged_metrics(staging: Path, launch: Any, total: int, generated: int, seconds: float, teacher: Any,
                    log: Callable[[str], None]) -> dict[str, Any]:
    """The processes' parts merged into data.jsonl; what the manifest records of the run."""
    words, empty, attention_rows = _merge_parts(staging, launch, total)
    if empty:
        log(f"warning: the teacher wrote {empty} empty summaries (of {total})")
    metrics = {
        "documents": total,
        "generated_this_run": generated,
        "seconds_this_run": round(seconds, 3),
        "docs_per_second": round(generated / seconds, 3) if generated and seconds > 0 else None,
        "summary_words_mean": round(words / total, 3),
        "empty_summaries": empty,
        "truncated_to_max_tokens": len(teacher.truncated),
        "generator": teacher.generator,  # the search that wrote the labels (a fallback says why: issue 79)
    }
    if teacher.check is not None:  # auto on a GPU: the first batch searched both ways
        metrics["static_search_check"] = teacher.check
    if teacher.static_memory is not None:  # the shapes' bytes, computed before each was built
        metrics["static_search_memory"] = teacher.static_memory
    attention = teacher.recorder.summary(attention_rows)
    if attention is not None:
        metrics["attention"] = attention
    return metrics


def _columns_and_count(options: PseudolabelOptions, source: Any) -> tuple[str, str | None, int]:
    """(text column, summary column, rows): one pass over the data checks every line and text, the id
    column and the --attention-plot document, before the teacher loads."""
    text_column, summary_column = pick_columns(source.columns, options.text_column, options.summary_column,
                                               source=str(options.data))
    if options.id_column is not None and options.id_column not in source.columns:
        raise UserError(f"{options.data} has no column '{options.id_column}'; columns found: "
                        f"{', '.join(source.columns)}")
    total, plot_found = 0, False
    for example in examples(source, text_column, summary_column, options.id_column, options.limit):
        total += 1
        plot_found = plot_found or example.id == options.attention_plot
    if total == 0:
        raise UserError(f"data {options.data} has no rows")
    if options.attention_plot is not None and not plot_found:
        raise UserError(f"--attention-plot: no document with id '{options.attention_plot}' in {options.data}")
    return text_column, summary_column, total


def _merge_parts(staging: Path, launch: Any, total: int) -> tuple[int, int, list[dict[str, Any]]]:
    """The processes' part files merged into data.jsonl in input order (then deleted); returns (summary
    words, empty summaries, the rows' attention records)."""
    words, empty, attention_rows = 0, 0, []
    with open(staging / "data.jsonl", "w", encoding="utf-8") as out:
        for row in shards.merged_rows(staging, launch.world, total):
            if "_attention" in row:
                attention_rows.append({"_attention": row.pop("_attention")})
            words += len(row["summary"].split())
            empty += not row["summary"]
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    shutil.rmtree(staging / shards.PARTS)
    (staging / RUN_FILE).unlink()
    return words, empty, attention_rows
