"""`modelshrink eval`: the measurements compressed models are compared by."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from modelshrink.commands._common import DocsProgress, emit, fail, handle_errors, log, print_comparison, stderr_console
from modelshrink.commands._from_options import OUTPUT, OVERWRITE, QUIET, RESUME, build_options, from_options, param
from modelshrink.metrics.names import ALL_METRICS
from modelshrink.options.eval import SCORE, EvalOptions

EPILOG = """\
**Examples**

A summarizer on a validation set (generates, then scores; latency and size too):

    modelshrink eval runs/student valid.jsonl -o runs/eval-student --reference-size runs/teacher

Score predictions already on disk (a pseudolabel artifact: `summary` against `reference`):

    modelshrink eval runs/pl-lambda2 -o runs/eval-pl2 --json

A translator on source/target pairs (BLEU and chrF by sacreBLEU; nested {"translation": {"en": ..., "de": ...}}
rows with --source-lang en --target-lang de):

    modelshrink eval runs/marian-student en-de.validation.jsonl.gz -o runs/eval-ende

Is the student significantly better than the baseline on the same documents?

    modelshrink eval runs/student valid.jsonl -o runs/eval-s2 --against runs/eval-baseline

Side by side, with significance against the first and a PNG of quality against size:

    modelshrink eval --compare runs/eval-teacher runs/eval-student runs/eval-int8 -o runs/compare
"""



def _print_table(metrics: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"eval: {metrics['task']}, {metrics['documents']} documents")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("95% CI / note")
    against = metrics.get("against", {})
    for key in ALL_METRICS:
        if key in metrics:
            note = ""
            if key in metrics.get("ci95", {}):
                low, high = metrics["ci95"][key]
                note = f"[{low:.2f}, {high:.2f}]"
            if key in against.get("p", {}):
                note += f"  Δ {against['delta'][key]:+.2f} vs other, p = {against['p'][key]:.4f}"
            table.add_row(key, f"{metrics[key]:.2f}", note)
    if "same_predictions" in against:
        same, count = against["same_predictions"], metrics["documents"]
        table.add_row("same output as other", f"{same} of {count}", f"{100 * same / max(count, 1):.1f}%")
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
    if metrics.get("length_ratio") is not None:
        table.add_row("length ratio (BLEU's)", f"{metrics['length_ratio']:.3f}", "output / reference tokens")
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


INPUTS = param("inputs", Annotated[list[str], typer.Argument(
    metavar="MODEL DATA | PREDICTIONS | SYSTEMS...",
    help="MODEL DATA: generate or predict, then score. PREDICTIONS: score a file or artifact that already holds "
         "predictions. With --compare: two or more eval artifacts (or models, with --data).")])
JSON_OUT = param("json_out", Annotated[bool, typer.Option("--json", help="Print the metrics as one JSON object on "
                                                                         "stdout instead of the output path.")], False)
COMPARE = param("compare", Annotated[bool, typer.Option("--compare", help="Compare the given systems side by side.",
                                                        rich_help_panel=SCORE)], False)
COMPARE_DATA = param("compare_data", Annotated[Optional[str], typer.Option(
    "--data", help="With --compare: data to evaluate models on.", rich_help_panel=SCORE)], None)


@from_options(EvalOptions, arguments=[INPUTS],
              extra=[OUTPUT, JSON_OUT, COMPARE, COMPARE_DATA, RESUME, OVERWRITE, QUIET],
              construct=False)
def eval_command(values: dict[str, Any], inputs: list[str], output: Path, json_out: bool, compare: bool,
                 compare_data: Optional[str], resume: bool, overwrite: bool, quiet: bool) -> None:
    """Score summaries (ROUGE with 95% intervals, style, bias), translations (sacreBLEU's BLEU and chrF with
    95% intervals) or classifiers (GLUE metrics), with
    size and speed for models, significance against another system, and side-by-side comparisons.

    Writes an eval artifact: metrics.json, predictions.jsonl (with per-document scores) and
    modelshrink.json. stdout carries the output path, or the metrics with --json.
    """
    from modelshrink.steps.evaluate import evaluate

    with handle_errors(output):
        if compare:
            if resume:
                raise fail("--resume continues one evaluation; --compare starts its own")
            from modelshrink.evaluation.compare import compare as run_compare

            def evaluate_model(model: str, folder: Path) -> Path:
                options = EvalOptions(data=compare_data, model=model, device=values["device"],
                                      batch_size=values["batch_size"], limit=values["limit"],
                                      latency_docs=values["latency_docs"], seed=values["seed"],
                                      trust_remote_code=values["trust_remote_code"],
                                      allow_pickle=values["allow_pickle"])
                return evaluate(options, folder, log=log)[0]

            path, result = run_compare(inputs, output, evaluate_model=evaluate_model if compare_data else None,
                                       overwrite=overwrite, significance=values["significance"],
                                       resamples=values["significance_resamples"], seed=values["seed"], log=log)
            print_comparison(result)
            typer.echo(json.dumps(result)) if json_out else emit(path)
            return
        if len(inputs) not in (1, 2):
            raise fail(f"expected MODEL DATA or PREDICTIONS, got {len(inputs)} inputs (use --compare for several)")
        if compare_data is not None:
            raise fail("--data goes with --compare; otherwise give MODEL DATA")
        model, data = (inputs[0], inputs[1]) if len(inputs) == 2 else (None, inputs[0])
        if model is None and Path(data, "config.json").is_file():
            raise fail(f"{data} is a model; give the data to evaluate it on: modelshrink eval {data} DATA")
        options = build_options(EvalOptions, {**values, "model": model, "data": data})
        with DocsProgress(quiet) as bars:
            path, metrics = evaluate(options, output, overwrite=overwrite, resume=resume, progress=bars.task("eval"),
                                     log=log)
    if not metrics:  # another process of a launch: the main one reports
        return
    _print_table(metrics)
    if json_out:
        typer.echo(json.dumps(metrics))
    else:
        emit(path)
