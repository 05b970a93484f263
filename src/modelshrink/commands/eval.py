"""`modelshrink eval`: the measurements compressed models are compared by."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from modelshrink.commands._common import (GEN_PANEL as GEN, SPLITS, DocsProgress, LengthPenalty, MaxLength,
                                         MaxSourceLength, MinLength, NoRepeatNgramSize, NumBeams, emit,
                                         handle_errors, fail, log, stderr_console)

EPILOG = """\
**Examples**

A summarizer on a validation set (generates, then scores; latency and size too):

    modelshrink eval runs/student valid.jsonl -o runs/eval-student --reference-size runs/teacher

Score predictions already on disk (a pseudolabel artifact: `summary` against `reference`):

    modelshrink eval runs/pl-lambda2 -o runs/eval-pl2 --json

Is the student significantly better than the baseline on the same documents?

    modelshrink eval runs/student valid.jsonl -o runs/eval-s2 --against runs/eval-baseline

Side by side, with significance against the first and a PNG of quality against size:

    modelshrink eval --compare runs/eval-teacher runs/eval-student runs/eval-int8 -o runs/compare
"""

SCORE = "Scoring"
COLS = "Columns"


def _print_table(metrics: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"eval: {metrics['task']}, {metrics['documents']} documents")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("95% CI / note")
    against = metrics.get("against", {})
    for key in ("rouge1", "rouge2", "rougeL", "rougeLsum", "accuracy", "f1", "mcc", "pearson", "spearman"):
        if key in metrics:
            note = ""
            if key in metrics.get("ci95", {}):
                low, high = metrics["ci95"][key]
                note = f"[{low:.2f}, {high:.2f}]"
            if key in against.get("p", {}):
                note += f"  Δ {against['delta'][key]:+.2f} vs other, p = {against['p'][key]:.4f}"
            table.add_row(key, f"{metrics[key]:.2f}", note)
    if "correct" in against.get("p", {}):
        table.add_row("accuracy vs other", f"{against['delta']['correct'] * 100:+.2f}",
                      f"p = {against['p']['correct']:.4f}")
    for key, value in metrics.get("limited_length_recall", {}).items():
        table.add_row(f"{key} recall (limited length)", f"{value:.2f}", "")
    if "length_words" in metrics:
        ref = metrics.get("reference_style", {})
        table.add_row("length (words)", f"{metrics['length_words']:.2f}",
                      f"references: {ref['length_words']:.2f}" if ref else "")
    if "length_tokens" in metrics:
        table.add_row("length (tokens)", f"{metrics['length_tokens']:.2f}", "")
    for n, value in metrics.get("novel_ngrams", {}).items():
        table.add_row(f"novel {n}-grams %", f"{value:.2f}",
                      f"references: {metrics['reference_style']['novel_ngrams'][n]:.2f}")
    for key in ("copy_bias", "leading_bias"):
        if key in metrics:
            table.add_row(f"{key.replace('_', ' ')} %", f"{metrics[key]:.2f}",
                          f"references: {metrics['reference_style'][key]:.2f}")
    if "attention" in metrics:
        shares = ", ".join(f"{x:.1f}" for x in metrics["attention"]["evident_share_by_bin"])
        table.add_row("evident cross attention by position (%)", "", shares)
    eff = metrics.get("efficiency", {})
    for key, fmt in (("parameters", "{:,}"), ("bytes_on_disk", "{:,}"), ("compression_ratio", "{:.2f}x"),
                     ("latency_ms_p50", "{:.1f} ms"), ("latency_ms_p90", "{:.1f} ms"),
                     ("throughput_docs_per_s", "{:.2f}/s"), ("peak_memory_bytes", "{:,}")):
        if eff.get(key) is not None:
            table.add_row(key.replace("_", " "), fmt.format(eff[key]), "")
    stderr_console().print(table)


def _print_comparison(result: dict[str, Any]) -> None:
    from rich.table import Table

    from modelshrink.compare import QUALITY

    keys = QUALITY[result["task"]]
    table = Table(title=f"compare ({result['significance']['method']} test against {result['significance']['against']};"
                        " * p < 0.05)")
    for column in ("system", *keys, "words", "params", "MB on disk", "p50 ms"):
        table.add_column(column, justify="right")
    for row in result["systems"]:
        cells = []
        name = row["name"].removeprefix("eval-")
        for key in keys:
            p = row["p_vs_first"].get(key, row["p_vs_first"].get("correct"))
            cells.append("-" if row[key] is None else f"{row[key]:.2f}{'*' if p is not None and p < 0.05 else ''}")
        table.add_row(name, *cells, "-" if row["length_words"] is None else f"{row['length_words']:.1f}",
                      "-" if row["parameters"] is None else f"{row['parameters']:,}",
                      "-" if row["bytes_on_disk"] is None else f"{row['bytes_on_disk'] / 1e6:.1f}",
                      "-" if row["latency_ms_p50"] is None else f"{row['latency_ms_p50']:.1f}")
    stderr_console().print(table)


def eval_command(
    inputs: Annotated[list[str], typer.Argument(
        metavar="MODEL DATA | PREDICTIONS | SYSTEMS...",
        help="MODEL DATA: generate or predict, then score. PREDICTIONS: score a file or artifact that already holds "
             "predictions. With --compare: two or more eval artifacts (or models, with --data).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder to write the eval artifact to.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the metrics as one JSON object on stdout "
                                                          "instead of the output path.")] = False,
    against: Annotated[Optional[str], typer.Option(
        help="Paired significance test against OTHER on the same documents: an eval artifact or a predictions "
             "file.", rich_help_panel=SCORE)] = None,
    significance: Annotated[str, typer.Option(help="permutation (approximate randomization) or bootstrap (paired).",
                                              rich_help_panel=SCORE)] = "permutation",
    compare: Annotated[bool, typer.Option("--compare", help="Compare the given systems side by side.",
                                          rich_help_panel=SCORE)] = False,
    data: Annotated[Optional[str], typer.Option(help="With --compare: data to evaluate models on.",
                                                rich_help_panel=SCORE)] = None,
    limited_length_recall: Annotated[bool, typer.Option(
        help="Also ROUGE recall with predictions cut to the reference's length (NYT protocol, PLATE Table 2).",
        rich_help_panel=SCORE)] = False,
    attention_stats: Annotated[bool, typer.Option(
        help="Evident cross-attention weights (> 0.15) by document position, 5 bins (PLATE Fig. 2).",
        rich_help_panel=SCORE)] = False,
    attention_plot: Annotated[Optional[str], typer.Option(metavar="DOC_ID", help="Write a PNG heatmap of the cross "
                                                          "attention for this document (PLATE Fig. 1).",
                                                          rich_help_panel=SCORE)] = None,
    resamples: Annotated[int, typer.Option(help="Bootstrap resamples for the 95% intervals.",
                                           rich_help_panel=SCORE)] = 1000,
    significance_resamples: Annotated[int, typer.Option(help="Resamples of the significance test.",
                                                        rich_help_panel=SCORE)] = 10000,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap and the significance test.",
                                      rich_help_panel=SCORE)] = 0,
    reference_size: Annotated[Optional[str], typer.Option(
        metavar="TEACHER", help="Model folder whose bytes on disk the compression ratio is taken against.",
        rich_help_panel=SCORE)] = None,
    latency_docs: Annotated[int, typer.Option(help="Documents timed one at a time (batch 1) after 2 warm-up; 0 "
                                                   "skips.", rich_help_panel=SCORE)] = 16,
    tokenizer: Annotated[Optional[str], typer.Option(help="Tokenizer for token lengths of a predictions file.",
                                                     rich_help_panel=SCORE)] = None,
    num_beams: NumBeams = None,
    length_penalty: LengthPenalty = None,
    min_length: MinLength = None,
    max_length: MaxLength = None,
    no_repeat_ngram_size: NoRepeatNgramSize = None,
    max_source_length: MaxSourceLength = None,
    batch_size: Annotated[int, typer.Option(help="Batch size (throughput is measured at it).",
                                            rich_help_panel=GEN)] = 16,
    split: Annotated[Optional[str], typer.Option(
        help=f"Split of {SPLITS}.", rich_help_panel=COLS)] = None,
    text_column: Annotated[Optional[str], typer.Option(help="Document / sentence column. [default: auto]",
                                                       rich_help_panel=COLS)] = None,
    summary_column: Annotated[Optional[str], typer.Option(help="MODEL DATA: the gold summary column. [default: auto]",
                                                          rich_help_panel=COLS)] = None,
    prediction_column: Annotated[Optional[str], typer.Option(
        help="PREDICTIONS: the system output. [default: prediction, or summary when a reference column exists]",
        rich_help_panel=COLS)] = None,
    reference_column: Annotated[Optional[str], typer.Option(
        help="PREDICTIONS: the gold summary. [default: reference, summary, highlights or target]",
        rich_help_panel=COLS)] = None,
    references: Annotated[Optional[str], typer.Option(help="PREDICTIONS: take gold summaries from this dataset, "
                                                           "matched by id.", rich_help_panel=COLS)] = None,
    label_column: Annotated[Optional[str], typer.Option(help="Classifiers: the label column. [default: label]",
                                                        rich_help_panel=COLS)] = None,
    text_pair_column: Annotated[Optional[str], typer.Option(help="Classifiers: second sentence of a pair.",
                                                            rich_help_panel=COLS)] = None,
    id_column: Annotated[Optional[str], typer.Option(help="Row id column. [default: id, else the row number]",
                                                     rich_help_panel=COLS)] = None,
    limit: Annotated[Optional[int], typer.Option(help="Use only the first N rows.", rich_help_panel=COLS)] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N, or auto.")] = "auto",
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output.")] = False,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow the model's own code from the hub.")] = False,
) -> None:
    """Score summaries (ROUGE with 95% intervals, style, bias) or classifiers (GLUE metrics), with
    size and speed for models, significance against another system, and side-by-side comparisons.

    Writes an eval artifact: metrics.json, predictions.jsonl (with per-document scores) and
    modelshrink.json. stdout carries the output path, or the metrics with --json.
    """
    from modelshrink.evaluate import EvalOptions, evaluate

    with handle_errors():
        if compare:
            from modelshrink.compare import compare as run_compare

            def evaluate_model(model: str, folder: Path) -> Path:
                return evaluate(EvalOptions(data=data, model=model, device=device, batch_size=batch_size,
                                            limit=limit, latency_docs=latency_docs, seed=seed), folder,
                                log=log)[0]

            path, result = run_compare(inputs, output, evaluate_model=evaluate_model if data is not None else None,
                                       overwrite=overwrite,
                                       significance=significance, resamples=significance_resamples, seed=seed,
                                       log=log)
            _print_comparison(result)
            typer.echo(json.dumps(result)) if json_out else emit(path)
            return
        if len(inputs) not in (1, 2):
            raise fail(f"expected MODEL DATA or PREDICTIONS, got {len(inputs)} inputs (use --compare for several)")
        if data is not None:
            raise fail("--data goes with --compare; otherwise give MODEL DATA")
        model, data_spec = (inputs[0], inputs[1]) if len(inputs) == 2 else (None, inputs[0])
        if model is None and Path(data_spec, "config.json").is_file():
            raise fail(f"{data_spec} is a model; give the data to evaluate it on: modelshrink eval {data_spec} DATA")
        options = EvalOptions(
            data=data_spec, model=model, references=references, split=split, text_column=text_column,
            summary_column=summary_column, reference_column=reference_column, prediction_column=prediction_column,
            id_column=id_column, label_column=label_column, text_pair_column=text_pair_column, limit=limit,
            num_beams=num_beams, length_penalty=length_penalty, min_length=min_length, max_length=max_length,
            no_repeat_ngram_size=no_repeat_ngram_size, max_source_length=max_source_length, batch_size=batch_size,
            limited_length_recall=limited_length_recall, attention_stats=attention_stats,
            attention_plot=attention_plot, against=against, significance=significance, resamples=resamples,
            significance_resamples=significance_resamples, seed=seed, reference_size=reference_size,
            latency_docs=latency_docs, tokenizer=tokenizer, device=device, trust_remote_code=trust_remote_code)
        with DocsProgress() as bars:
            path, metrics = evaluate(options, output, overwrite=overwrite, progress=bars.task("eval"), log=log)
    _print_table(metrics)
    if json_out:
        typer.echo(json.dumps(metrics))
    else:
        emit(path)
