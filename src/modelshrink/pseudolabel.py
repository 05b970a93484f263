"""Teacher pseudo-labeling with attention temperature (PLATE, sections 3.2-3.3).

The teacher writes one summary per document by beam search (or sampling, for the baselines). The
run streams its input: documents are read in windows, each window sorted by length into batches,
and every finished batch is appended to a work file at once, so `resume` continues an interrupted
run from its last complete batch. The final `data.jsonl` is assembled in input order.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from modelshrink.artifacts import RUN_FILE, ArtifactWriter, parent_ref, pin_run
from modelshrink.data import examples, open_data, pick_columns
from modelshrink.errors import UserError
from modelshrink.generation import generate, plan_batches, resolve_generation
from modelshrink.runs import finished
from modelshrink.models import default_source_length, load_seq2seq, resolve_device
from modelshrink.plate import attention_temperature, lambdas_by_kind
from modelshrink.options.pseudolabel import PseudolabelOptions

WORK_FILE = "rows.partial.jsonl"


def row_lambda(seed: int, index: int, low: float, high: float) -> float:
    """λ ~ U[low, high] for document `index`: a function of (seed, index) alone, so the draw does
    not depend on batching, window order or where a resumed run restarts."""
    return float(np.random.default_rng([seed, index]).uniform(low, high))


def _read_done(work_file: Path) -> dict[int, int]:
    """Rows already written by an interrupted run: index -> byte offset of its line in the work
    file. A torn last line (the process died mid-write) is cut off."""
    done: dict[int, int] = {}
    if not work_file.exists():
        return done
    good_bytes = 0
    with open(work_file, "rb") as f:
        for raw in f:
            try:
                row = json.loads(raw)
            except json.JSONDecodeError:
                break
            done[row["_index"]] = good_bytes
            good_bytes += len(raw)
    with open(work_file, "r+b") as f:
        f.truncate(good_bytes)
    return done


ProgressFn = Callable[[int, int], None]  # (documents done, documents in total)


def pseudolabel(options: PseudolabelOptions, output: str | Path, *, overwrite: bool = False, resume: bool = False,
                progress: ProgressFn | None = None, log: Callable[[str], None] | None = None) -> Path:
    """Run the teacher over the data and write a dataset artifact; returns its path."""
    log = log or (lambda message: None)
    output = Path(output)
    if (output / "data.jsonl").is_file() and finished(output, overwrite=overwrite, resume=resume, log=log):
        return output

    # Everything that can be wrong with the input is checked before anything is written.
    writer = ArtifactWriter(output, overwrite=overwrite, resume=resume, keep_on_failure=True)
    writer.check()
    source = open_data(options.data, options.split)
    if not source.columns:
        raise UserError(f"data {options.data} has no rows")
    text_column, summary_column = pick_columns(source.columns, options.text_column, options.summary_column,
                                               source=str(options.data))
    if options.id_column is not None and options.id_column not in source.columns:
        raise UserError(f"{options.data} has no column '{options.id_column}'; columns found: "
                        f"{', '.join(source.columns)}")
    # One pass over the data counts it and checks every line and text before the teacher loads.
    total = sum(1 for _ in examples(source, text_column, summary_column, options.id_column, options.limit))
    if total == 0:
        raise UserError(f"data {options.data} has no rows")

    device = resolve_device(options.device)
    model, tokenizer, family = load_seq2seq(options.teacher, "teacher", options.trust_remote_code, device)
    settings = resolve_generation(
        model.generation_config, num_beams=options.num_beams, length_penalty=options.length_penalty,
        min_length=options.min_length, max_length=options.max_length,
        no_repeat_ngram_size=options.no_repeat_ngram_size, do_sample=options.do_sample, top_p=options.top_p,
        top_k=options.top_k, output_temperature=options.output_temperature)
    max_source_length = options.max_source_length or default_source_length(tokenizer, model.config)
    per_row = options.lambda_range is not None
    lambdas = lambdas_by_kind(options.lam, options.lambda_enc, options.lambda_dec, options.lambda_cross, per_row)
    mixed_kinds = len(set(lambdas.values())) > 1
    recorded = options.recorded()
    resolved = {"generation": settings.as_dict(), "max_source_length": max_source_length,
                "lambda_by_kind": lambdas, "text_column": text_column, "summary_column": summary_column,
                "family": family.name, "device": device}
    parents = [parent_ref("teacher", options.teacher), parent_ref("data", options.data)]

    staging = writer.open()
    work_file = staging / WORK_FILE
    pin_run(staging, recorded, parents, may_change=("device",))
    done = _read_done(work_file)
    if progress:
        progress(len(done), total)

    stream = examples(source, text_column, summary_column, options.id_column, options.limit)
    started, generated = time.perf_counter(), 0
    modules = family.attention_modules(model)
    with attention_temperature(modules, lambdas) as rows, open(work_file, "ab") as out:
        for batch in plan_batches(stream, tokenizer, options.batch_size, max_source_length):
            todo = [e for e in batch.rows if e.index not in done]
            if not todo:
                continue
            row_lambdas = [row_lambda(options.seed, e.index, *options.lambda_range) if per_row else
                           (1.0 if options.lam is None else options.lam) for e in batch.rows]
            if rows is not None:
                rows.set(row_lambdas)
            padded = tokenizer.pad({"input_ids": batch.token_ids}, return_tensors="pt")
            torch.manual_seed(options.seed * 1_000_003 + batch.number)  # sampling: same draw after resume
            summaries = generate(model, tokenizer, padded["input_ids"].to(device),
                                 padded["attention_mask"].to(device), settings)
            for example, summary, lam in zip(batch.rows, summaries, row_lambdas):
                if example.index in done:
                    continue
                row: dict[str, Any] = {"_index": example.index, "id": example.id, "document": example.document,
                                       "summary": summary}
                if example.reference is not None:
                    row["reference"] = example.reference
                row["lambda"] = lam
                if mixed_kinds:
                    row["lambda_by_kind"] = {k: (lam if v is None else v) for k, v in lambdas.items()}
                done[example.index] = out.tell()
                out.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
            out.flush()
            generated += len(todo)
            if progress:
                progress(len(done), total)

    seconds = time.perf_counter() - started
    words, empty = 0, 0
    with open(staging / "data.jsonl", "w", encoding="utf-8") as out, open(work_file, "rb") as work:
        for index in range(total):
            work.seek(done[index])
            row = json.loads(work.readline())
            del row["_index"]
            words += len(row["summary"].split())
            empty += not row["summary"]
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    work_file.unlink()
    (staging / RUN_FILE).unlink()
    if empty:
        log(f"warning: the teacher wrote {empty} empty summaries (of {total})")
    metrics = {
        "documents": total,
        "generated_this_run": generated,
        "seconds_this_run": round(seconds, 3),
        "docs_per_second": round(generated / seconds, 3) if generated and seconds > 0 else None,
        "summary_words_mean": round(words / total, 3),
        "empty_summaries": empty,
    }
    return writer.commit(step="pseudolabel", kind="dataset", options=recorded, parents=parents, metrics=metrics,
                         resolved=resolved)
