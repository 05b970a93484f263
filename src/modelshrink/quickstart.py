"""The end-to-end chain on the bundled sample, offline: what README's first command runs.

1. teacher: a bert2bert warm-started from the packaged MiniLM-L6 and fine-tuned on the bundled
   Debian sample (`distill --init-encoder-decoder`);
2. pseudo labels: the teacher labels training documents at λ = 1 and at λ = 2 (`pseudolabel`);
3. students: the teacher shrunk to a 6-2 student (decoder layers 0 and 5), trained on each set of
   pseudo labels (`distill --teacher --decoder-layers 2`);
4. quantization: the λ = 2 student quantized by distillation-aware training at 8-8-8 and 2-2-8
   (`quantize --method distill`), stored as integers;
5. evaluation: teacher, both students and both quantized students on the bundled validation sample,
   the λ = 2 student tested against the λ = 1 student, side by side with their sizes on disk
   (`eval`, `eval --compare`);
6. export: the quantized student with the best ROUGE-1 to ONNX, checked against PyTorch, its summaries
   from the torch-free runtime (`export`, `modelshrink.runtime`).

Every step writes an ordinary artifact into the output folder; the same chain can be run command by
command (README.md shows it). The budget is small so that the whole chain fits in about 15 minutes
on 2 CPU cores: expect a weak teacher, and students that are weaker still.
"""

from __future__ import annotations

import json
import shutil
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from modelshrink.artifacts import ArtifactWriter, check_output, parent_ref
from modelshrink.cards import commit_model
from modelshrink.errors import UserError
from modelshrink.models.loading import save_model
from modelshrink.options.quickstart import QuickstartOptions
from modelshrink.models.warmstart import WARMSTART_GENERATION, init_encoder_decoder, packaged_minilm


def sample_path(split: str = "train") -> Path:
    """A bundled sample of Debian package descriptions (document -> one-line summary)."""
    return Path(str(resources.files("modelshrink") / "samples" / "debian" / f"{split}.jsonl"))


def warmstart_artifact(encoder: str, output: Path, overwrite: bool = False, seed: int = 0) -> Path:
    """A warm-started (untrained) encoder-decoder as a model artifact."""
    model, tokenizer = init_encoder_decoder(encoder, seed=seed)
    with ArtifactWriter(output, overwrite=overwrite) as writer:
        save_model(model, tokenizer, writer.staging)
        options = {"init_encoder_decoder": encoder, "seed": seed, "generation": WARMSTART_GENERATION}
        metrics = {"parameters": sum(p.numel() for p in model.parameters())}
        return commit_model(writer, step="warmstart", options=options,
                            parents=[parent_ref("encoder", encoder)], metrics=metrics)


QUANTIZE_BITS = ("8-8-8", "2-2-8")  # the λ = 2 student, quantized both ways
# The table's names of the systems (README's table is this table, from a recorded run: recipes/quickstart_table.py)
TABLE_LABELS = {"eval-teacher": "teacher (bert2bert 6-6)",
                "eval-student-lambda1": "student 6-2, λ = 1 pseudo labels",
                "eval-student-lambda2": "student 6-2, λ = 2 pseudo labels",
                "eval-student-lambda2-8-8-8": "λ = 2 student, 8-8-8",
                "eval-student-lambda2-2-2-8": "λ = 2 student, 2-2-8"}
TABLE_QUALITY = (("rouge1", "ROUGE-1"), ("rouge2", "ROUGE-2"), ("rougeL", "ROUGE-L"))
LAMBDAS = (1.0, 2.0)  # the pseudo-label sets: regular and PLATE's λ = 2


def _check_lengths(budget: QuickstartOptions) -> None:
    """The source and summary lengths fit the packaged MiniLM's positions (the teacher's, and so every model's)."""
    positions = json.loads((Path(packaged_minilm()) / "config.json").read_text())["max_position_embeddings"]
    for flag, value in (("--max-source-length", budget.max_source_length),
                        ("--max-target-length", budget.max_target_length)):
        if value > positions:
            raise UserError(f"{flag} {value} is more than the packaged MiniLM's {positions} positions; give at most "
                            "that")


def table_rows(comparison: dict[str, Any]) -> list[dict[str, Any]]:
    """What the quickstart's table shows of each system of its comparison (`eval --compare`'s result)."""
    rows = []
    for row in comparison["systems"]:
        p = row.get("p_vs_first") or {}
        rows.append({"name": row["name"], **{k: row[k] for k, _ in TABLE_QUALITY},
                     "significant": [k for k, _ in TABLE_QUALITY if p.get(k) is not None and p[k] < 0.05],
                     "length_words": row["length_words"], "parameters": row["parameters"],
                     "bytes_on_disk": row["bytes_on_disk"], "latency_ms_p50": row["latency_ms_p50"]})
    return rows


def render_table(rows: list[dict[str, Any]]) -> str:
    """The quickstart's table in markdown, as the command prints it and README shows it (* = significantly
    different from the first system, the teacher: p < 0.05)."""
    def number(value: float | None, fmt: str, unit: str = "") -> str:
        return "–" if value is None else f"{value:{fmt}}{unit}"

    lines = ["| system | " + " | ".join(name for _, name in TABLE_QUALITY)
             + " | words | parameters | MB on disk | p50 latency |", "|---|---|---|---|---|---|---|---|"]
    for s in rows:
        quality = [number(s[k], ".2f") + ("*" if k in s["significant"] else "") for k, _ in TABLE_QUALITY]
        parameters = None if s["parameters"] is None else s["parameters"] / 1e6
        size = None if s["bytes_on_disk"] is None else s["bytes_on_disk"] / 1e6
        lines.append(f"| {TABLE_LABELS.get(s['name'], s['name'])} | {' | '.join(quality)} | "
                     f"{number(s['length_words'], '.1f')} | {number(parameters, '.1f', ' M')} | {number(size, '.1f')} | "
                     f"{number(s['latency_ms_p50'], '.0f', ' ms')} |")
    return "\n".join(lines)


def run_quickstart(budget: QuickstartOptions | None, output: str | Path, *, overwrite: bool = False,
                   progress: Callable[[str], Any] | None = None, train_progress: Callable[[str], Any] | None = None,
                   log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Run the chain into `output` (a folder of artifacts); returns the comparison."""
    from modelshrink.evaluation.compare import compare
    from modelshrink.steps.distill import DistillOptions, distill
    from modelshrink.steps.evaluate import EvalOptions, evaluate
    from modelshrink.steps.pseudolabel import PseudolabelOptions, pseudolabel
    from modelshrink.options.quantize import QuantizeOptions
    from modelshrink.steps.quantize import quantize

    budget = budget or QuickstartOptions()
    output = check_output(output, overwrite)
    _check_lengths(budget)  # before the output folder is made: nothing is left behind by a refused run
    if output.exists():
        shutil.rmtree(output)
    output.mkdir()
    train, validation = str(sample_path("train")), str(sample_path("validation"))
    lengths = dict(max_source_length=budget.max_source_length, batch_size=budget.batch_size)

    log(f"1/6 teacher: bert2bert warm-started from MiniLM-L6, fine-tuned {budget.teacher_steps} steps")
    teacher = distill(DistillOptions(data=train, init_encoder_decoder=packaged_minilm(), max_steps=budget.teacher_steps,
                                     lr=3e-4, warmup_steps=max(1, budget.teacher_steps // 10),
                                     max_target_length=budget.max_target_length, device="cpu", **lengths),
                      output / "teacher", progress=train_progress("teacher") if train_progress else None, log=log)
    students = {}
    for lam in LAMBDAS:
        log(f"2/6 pseudo labels at λ = {lam:g} for {budget.pseudolabel_docs} training documents")
        labels = pseudolabel(PseudolabelOptions(teacher=str(teacher), data=train, limit=budget.pseudolabel_docs,
                                                lam=lam, max_length=budget.max_target_length, device="cpu", **lengths),
                             output / f"pseudolabel-lambda{lam:g}",
                             progress=progress(f"pseudolabel λ={lam:g}") if progress else None, log=log)
        log(f"3/6 student 6-2 on the λ = {lam:g} pseudo labels, {budget.student_steps} steps")
        labels_last = labels
        students[lam] = distill(DistillOptions(data=str(labels), teacher=str(teacher), decoder_layers=2,
                                               max_steps=budget.student_steps, lr=3e-4,
                                               max_target_length=budget.max_target_length, device="cpu", **lengths),
                                output / f"student-lambda{lam:g}",
                                progress=train_progress(f"student λ={lam:g}") if train_progress else None, log=log)
    last = LAMBDAS[-1]
    quantized = {}
    for bits in QUANTIZE_BITS:
        log(f"4/6 student λ = {last:g} quantized to {bits} by distillation-aware training, "
            f"{budget.quantize_steps} steps")
        quantized[bits] = quantize(QuantizeOptions(model=str(students[last]), bits=bits, data=str(labels_last),
                                                   device="cpu", max_steps=budget.quantize_steps, lr=1e-4,
                                                   max_target_length=budget.max_target_length, **lengths),
                                   output / f"student-lambda{last:g}-{bits}",
                                   progress=train_progress(f"quantize {bits}") if train_progress else None, log=log)
    log(f"5/6 evaluation on {budget.eval_docs} validation documents")
    evals = []
    systems = ([("teacher", teacher)] + [(f"student-lambda{lam:g}", path) for lam, path in students.items()]
               + [(f"student-lambda{last:g}-{bits}", path) for bits, path in quantized.items()])
    for name, model in systems:
        against = str(evals[1]) if name == f"student-lambda{last:g}" and len(evals) > 1 else None
        # allow_empty: a budget cut down to a few steps can leave a model that writes nothing yet; the chain
        # still shows it (the scores say so)
        path, _ = evaluate(EvalOptions(data=validation, model=str(model), limit=budget.eval_docs,
                                       latency_docs=budget.latency_docs, against=against, device="cpu",
                                       reference_size=str(teacher), allow_empty=True, **lengths),
                           output / f"eval-{name}", progress=progress(f"eval {name}") if progress else None, log=log)
        evals.append(path)
    _, comparison = compare([str(e) for e in evals], output / "comparison", log=log)
    deployed = deploy_best(systems, comparison, output, validation, budget, log,
                           {f"student-lambda{last:g}-{bits}" for bits in quantized})
    summary = {"teacher": str(teacher), "students": {f"{k:g}": str(v) for k, v in students.items()},
               "quantized": {k: str(v) for k, v in quantized.items()},
               "evals": [str(e) for e in evals], "comparison": comparison, "export": deployed}
    (output / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary


def deploy_best(systems: list[tuple[str, Path]], comparison: dict[str, Any], output: Path, validation: str,
                budget: QuickstartOptions, log: Callable[[str], None], among: set[str]) -> dict[str, Any]:
    """Export the system of `among` (the quantized students: the chain ends in integers, as README draws it) with
    the best ROUGE-1 to ONNX (validated against PyTorch), then summarize a few validation documents with the
    torch-free runtime in a separate process."""
    import subprocess
    import sys

    from modelshrink.errors import CheckFailed
    from modelshrink.steps.export import export_model
    from modelshrink.options.export import ExportOptions

    scored = [(row.get("rouge1") or 0.0, -(row.get("bytes_on_disk") or 0), name, path)
              for row, (name, path) in zip(comparison["systems"], systems) if name in among]
    _, _, name, model = max(scored)
    log(f"6/6 export {name} (best ROUGE-1 of the quantized students) to ONNX; summaries from the torch-free runtime")
    folder = output / "export"
    try:
        # checked on validation documents (not the tokenizer's random words), as a user exports with --data
        export_model(ExportOptions(model=str(model), data=validation, samples=2, generation_docs=budget.runtime_docs,
                                   max_source_length=budget.max_source_length), folder, log=log)
        check = "passed"
    except CheckFailed as e:  # the folder and its report are written; the chain goes on and says so
        check = f"failed: {e}"
        log(f"export check {check}")
    documents = output / "runtime-input.jsonl"
    with open(validation) as f, open(documents, "w") as out:
        for _, line in zip(range(budget.runtime_docs), f):
            out.write(line)
    # A fresh interpreter that imports only the runtime (numpy, onnxruntime, tokenizers): no torch.
    run = subprocess.run([sys.executable, "-m", "modelshrink.runtime", str(folder), "--input", str(documents)],
                         capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"the runtime failed on {folder}: {run.stderr.strip()[-2000:]}")
    (output / "runtime-summaries.jsonl").write_text(run.stdout)
    summaries = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    for row in summaries:
        log(f"  {row['id']}: {row['prediction']}")
    return {"model": str(model), "folder": str(folder), "check": check, "summaries": summaries}
