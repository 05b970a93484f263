"""What the whole chain buys: every deployable form of one teacher, side by side (issue 29).

    python benchmarks/frontier.py --teacher runs/repro/teacher --reuse runs/repro/dq-bart   # hours on 2 cores
    python benchmarks/frontier.py --tiny --no-write --work /tmp/frontier                     # a smoke run (minutes)

From a teacher and the Debian data (--data: train.jsonl.gz and validation.jsonl.gz) it makes, or reuses, every
deployable form the chain gives; each artifact is resumable (a rerun continues an interrupted one and keeps a
finished one):
  teacher                   PyTorch eager, and `export` float32
  student                   `distill --teacher --decoder-layers D` on the gold pairs (--student to reuse one),
                            exported float32, --int8 and --int4
  8-8-8, 2-2-8 (all layers) distillation-aware `quantize` of the teacher, exported (kernels measured by export);
  2-2-8, fewer layers       the same with D decoder layers; --reuse DIR takes them from recipes/dq-bart-debian.sh's
                            folder (888-6-6, 228-6-6, 228-6-3) instead of training them
  --uniform (3-3-8, 4-4-8)  more uniform bits, all layers, the same steps (issue 55)
  --budgets (10x, 13x)      `quantize --budget-mb`: each layer group's bits chosen from measured sensitivity under a
                            budget (MB, or Nx: the teacher's float32 weights over N), the same steps; each is also
                            compared with the uniform form nearest its size (paired permutation test, `eval --compare`)
Then each form, on the first --docs validation documents (beam 4, no repeated trigram, sources <= 128 tokens,
summaries <= 32): ROUGE-1/2/L with 95% intervals and a paired permutation test against the teacher (`eval`,
resumable), and ROUGE-L against the PyTorch model each export was made from (is it in that model's interval?),
MB on disk (weight files), peak RSS of a fresh process that loads the form and summarizes 16 documents at batch 16, batch-1 p50/p90 over --latency-docs documents (the forms taking turns, so a change of
load hits all alike) and batch-16 docs/s (median of --rounds passes over --throughput-docs documents).
It writes frontier.json into --work, the figure (--figure: ROUGE-L against batch-1 latency, marker area = MB)
and the table into BENCHMARKS.md (section frontier) unless --no-write.
Targets: one compressed form >= 4x smaller and >= 3x faster (batch 1) than the teacher in PyTorch, ROUGE-L within
1.0 point of the teacher's (issue 29); one >= 10x smaller and >= 5x faster within 1.0 (issue 55).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _report import publish

ROOT = Path(__file__).resolve().parents[1]
GENERATION = dict(num_beams=4, max_length=32, no_repeat_ngram_size=3)
MAX_SOURCE = 128
TEACHER = "teacher, PyTorch"


def weight_mb(kind: str, path: Path) -> float:
    pattern = "*.onnx" if kind == "onnx" else "*.safetensors"
    return sum(p.stat().st_size for p in path.glob(pattern)) / 1e6


def summarizer(kind: str, path: Path):
    """documents, batch size -> summaries, for a PyTorch model folder or an export folder."""
    if kind == "onnx":
        from modelshrink.runtime import load

        runtime = load(path, threads=len(os.sched_getaffinity(0)))
        return lambda docs, batch: runtime.summarize(docs, batch, MAX_SOURCE, **GENERATION)
    import torch

    from modelshrink.generation.settings import decode, generate_ids, resolve_generation
    from modelshrink.models.loading import load_seq2seq

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    model, tokenizer, _ = load_seq2seq(str(path))
    settings = resolve_generation(model.generation_config, **GENERATION)

    def run(docs: list[str], batch: int) -> list[str]:
        out = []
        for start in range(0, len(docs), batch):
            enc = tokenizer(docs[start:start + batch], truncation=True, max_length=MAX_SOURCE, padding=True,
                            return_tensors="pt")
            out += decode(tokenizer, generate_ids(model, enc["input_ids"], enc["attention_mask"], settings))
        return out

    return run


def peak_rss_mb(kind: str, path: Path, docs: list[str]) -> float:
    """Peak resident memory of a fresh process that loads the form and summarizes `docs` at batch 16."""
    result = subprocess.run([sys.executable, __file__, "--rss-of", kind, str(path)], input=json.dumps(docs),
                            capture_output=True, text=True, timeout=3600)
    if result.returncode:
        raise RuntimeError(f"peak RSS of {path}: {result.stderr[-2000:]}")
    return float(result.stdout.strip().splitlines()[-1])


def read_rows(path: Path, limit: int) -> list[dict]:
    from modelshrink.data import open_data

    rows = []
    for row in open_data(str(path)).rows():
        rows.append(row)
        if len(rows) == limit:
            break
    return rows


def make_forms(args: argparse.Namespace, train: Path, log) -> dict[str, tuple[str, Path]]:
    """Every deployable form: name -> (kind, folder), made or reused."""
    from modelshrink.steps.distill import DistillOptions, distill
    from modelshrink.steps.export import ExportCheckFailed, ExportOptions, export_model
    from modelshrink.families import decoder_layer_count
    from modelshrink.models.loading import load_config
    from modelshrink.steps.quantize import QuantizeOptions, quantize

    work, teacher = args.work, Path(args.teacher)
    fewer = args.decoder_layers or max(1, decoder_layer_count(load_config(str(teacher), "teacher")) // 2)
    budget = dict(max_source_length=MAX_SOURCE, max_target_length=32, max_tokens=args.max_tokens, seed=0)

    def exported(model: Path, name: str, **flags) -> Path:
        out = work / f"onnx-{name}"
        if not (out / "modelshrink.json").is_file():
            log(f"export {name}")
            try:
                export_model(ExportOptions(model=str(model), max_source_length=MAX_SOURCE,
                                           validate=not args.no_export_check, **flags), out,
                             overwrite=True, log=log)
            except ExportCheckFailed as e:  # the folder is written; the frontier still measures it, and says so
                log(f"{name}: {e}")
        return out

    student = Path(args.student) if args.student else work / f"student-{fewer}"
    if not args.student:
        log(f"student with {fewer} decoder layers ({args.student_steps} steps)")
        distill(DistillOptions(data=str(train), teacher=str(teacher), decoder_layers=fewer, max_steps=args.student_steps,
                               lr=3e-4, warmup_ratio=0.05, save_every=100, **budget), student, resume=True, log=log)
    quantized = {}
    uniform = [(bits.replace("-", "") + "-all", bits, None) for bits in args.uniform]
    for name, bits, layers in (("888-6-6", "8-8-8", None), ("228-6-6", "2-2-8", None), ("228-6-3", "2-2-8", fewer),
                               *uniform):
        reused = Path(args.reuse) / name if args.reuse else None
        if reused is not None and (reused / "modelshrink.json").is_file():
            quantized[name] = reused
            continue
        log(f"distillation-aware {bits}{f' with {layers} decoder layers' if layers else ''} ({args.quantize_steps} steps)")
        quantized[name] = quantize(QuantizeOptions(model=str(teacher), bits=bits, data=str(train), decoder_layers=layers,
                                                   max_steps=args.quantize_steps, lr=1e-4, warmup_ratio=0.05,
                                                   save_every=100, **budget), work / name, resume=True, log=log)
    teacher_mb = weight_mb("torch", teacher)
    for text in args.budgets:
        mb = teacher_mb / float(text[:-1]) if text.endswith("x") else float(text)
        log(f"distillation-aware under a {mb:.2f} MB budget ({text}; {args.quantize_steps} steps)")
        quantized[f"budget-{text}"] = quantize(QuantizeOptions(model=str(teacher), bits="8-8-8", budget_mb=mb,
                                                               data=str(train), max_steps=args.quantize_steps,
                                                               lr=1e-4, warmup_ratio=0.05, save_every=100, **budget),
                                               work / f"budget-{text}", resume=True, log=log)
    return {
        TEACHER: ("torch", teacher),
        "teacher, ONNX float32": ("onnx", exported(teacher, "teacher-fp32")),
        f"student (D {fewer}), ONNX float32": ("onnx", exported(student, "student-fp32")),
        f"student (D {fewer}), ONNX --int8": ("onnx", exported(student, "student-int8", int8=True)),
        f"student (D {fewer}), ONNX --int4": ("onnx", exported(student, "student-int4", int4=True)),
        "8-8-8 distillation-aware, ONNX": ("onnx", exported(quantized["888-6-6"], "888")),
        "2-2-8 distillation-aware, ONNX": ("onnx", exported(quantized["228-6-6"], "228")),
        f"2-2-8 (D {fewer}) distillation-aware, ONNX": ("onnx", exported(quantized["228-6-3"], "228-fewer")),
        **{f"{bits} distillation-aware, ONNX": ("onnx", exported(quantized[name], name)) for name, bits, _ in uniform},
        **{f"budget {text} distillation-aware, ONNX": ("onnx", exported(quantized[f"budget-{text}"], f"budget-{text}"))
           for text in args.budgets},
    }


def quality(forms: dict[str, tuple[str, Path]], validation: Path, args: argparse.Namespace, log) -> dict[str, dict]:
    """ROUGE with intervals of every form, each tested against the teacher (eval artifacts in --work)."""
    from modelshrink.steps.evaluate import evaluate
    from modelshrink.options.eval import EvalOptions

    results, reference = {}, args.work / "eval-teacher"
    for index, (name, (_, path)) in enumerate(forms.items()):
        out = reference if name == TEACHER else args.work / f"eval-{index}"
        log(f"evaluating {name} on {args.docs} documents")
        # allow_empty: a form that writes nothing (a collapsed 2-bit one, a --tiny teacher) scores 0, as it should
        _, metrics = evaluate(EvalOptions(model=str(path), data=str(validation), limit=args.docs, latency_docs=0,
                                          max_source_length=MAX_SOURCE, against=None if name == TEACHER else
                                          str(reference), allow_empty=True, **GENERATION), out, resume=True, log=log)
        if not metrics:  # a finished artifact kept as it was
            metrics = json.loads((out / "metrics.json").read_text())
        results[name] = {"rouge": {k: metrics[k] for k in ("rouge1", "rouge2", "rougeL")}, "ci95": metrics["ci95"],
                         "against_teacher": metrics.get("against", {}).get("p"), "eval": str(out)}
    return results


def pytorch_forms(forms: dict[str, tuple[str, Path]]) -> dict[str, Path]:
    """Each exported form's PyTorch model: the `model` its export was made from (its manifest's parent)."""
    from modelshrink.artifacts import read_manifest

    found = {}
    for name, (kind, path) in forms.items():
        if kind == "onnx":
            parent = next(p for p in read_manifest(path)["parents"] if p["role"] == "model")
            found[name] = Path(parent["path"])
    return found


def against_pytorch(forms: dict[str, tuple[str, Path]], results: dict[str, dict], validation: Path,
                    args: argparse.Namespace, log) -> dict[str, dict]:
    """Each exported form's ROUGE-L against its PyTorch form's, on the same documents: {name: {"rougeL", "ci95",
    "within"}}, `within` whether the export's ROUGE-L lies in the PyTorch form's 95% interval (each PyTorch model
    evaluated once, in eval-pytorch-N; the teacher's is the frontier's first row)."""
    from modelshrink.steps.evaluate import evaluate
    from modelshrink.options.eval import EvalOptions

    teacher = Path(forms[TEACHER][1]).resolve()
    scored: dict[Path, dict] = {teacher: {"rougeL": results[TEACHER]["rouge"]["rougeL"],
                                          "ci95": results[TEACHER]["ci95"]["rougeL"]}}
    found = {}
    for name, model in pytorch_forms(forms).items():
        model = model.resolve()
        if model not in scored:
            out = args.work / f"eval-pytorch-{len(scored)}"
            log(f"evaluating the PyTorch form of {name} ({model}) on {args.docs} documents")
            _, metrics = evaluate(EvalOptions(model=str(model), data=str(validation), limit=args.docs, latency_docs=0,
                                              max_source_length=MAX_SOURCE, allow_empty=True, **GENERATION), out,
                                  resume=True, log=log)
            metrics = metrics or json.loads((out / "metrics.json").read_text())
            scored[model] = {"rougeL": metrics["rougeL"], "ci95": metrics["ci95"]["rougeL"], "path": str(model)}
        low, high = scored[model]["ci95"]
        found[name] = {**scored[model], "within": low <= results[name]["rouge"]["rougeL"] <= high}
    return found


def artifact_mb(form: Path) -> float:
    """MB of the quantize artifact an export was made from (the size a budget bounds)."""
    from modelshrink.quant.model import WEIGHTS_NAME

    return Path(pytorch_forms({"form": ("onnx", form)})["form"], WEIGHTS_NAME).stat().st_size / 1e6


def budget_against_uniform(forms: dict[str, tuple[str, Path]], results: dict[str, dict], args: argparse.Namespace,
                           log) -> list[dict]:
    """Each budget form against the uniform-bits form (all layers) nearest its size, on the same documents: ROUGE
    and a paired permutation test (`eval --compare` on the two eval artifacts, nothing generated again)."""
    from modelshrink.evaluation.compare import compare

    uniform = {name: artifact_mb(path) for name, (_, path) in forms.items()
               if name.split(" ")[0] in [*args.uniform, "2-2-8", "8-8-8"] and "(D " not in name}
    found = []
    for name, (_, path) in forms.items():
        if not name.startswith("budget "):
            continue
        size = artifact_mb(path)
        nearest = min(uniform, key=lambda u: abs(uniform[u] - size))
        out = args.work / f"compare-{name.split(' ')[1]}"
        log(f"{name} ({size:.2f} MB) against {nearest} ({uniform[nearest]:.2f} MB)")
        _, report = compare([results[nearest]["eval"], results[name]["eval"]], out, overwrite=True)
        p = report["systems"][1]["p_vs_first"]
        found.append({"budget": name, "budget_mb": size, "uniform": nearest, "uniform_mb": uniform[nearest],
                      **{k: results[name]["rouge"][k] - results[nearest]["rouge"][k] for k in ("rouge1", "rouge2",
                                                                                                "rougeL")},
                      "p": {k: p.get(k) for k in ("rouge1", "rouge2", "rougeL")}})
    return found


def budget_table(rows: list[dict]) -> list[str]:
    lines = ["| budget form | artifact MB | uniform form nearest in size | artifact MB | Δ ROUGE-1 | Δ ROUGE-2 | "
             "Δ ROUGE-L | p (R-L) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['budget']} | {r['budget_mb']:.2f} | {r['uniform']} | {r['uniform_mb']:.2f} | "
                     f"{r['rouge1']:+.2f} | {r['rouge2']:+.2f} | {r['rougeL']:+.2f} | {r['p']['rougeL']:.3f} |")
    return lines


def speed(forms: dict[str, tuple[str, Path]], docs: list[str], args: argparse.Namespace) -> dict[str, dict]:
    """Batch-1 p50/p90 seconds (forms taking turns) and batch-16 docs/s (median of --rounds passes)."""
    runs = {name: summarizer(kind, path) for name, (kind, path) in forms.items()}
    for run in runs.values():
        run(docs[:2], 1)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in runs}
    for doc in docs[:args.latency_docs]:
        for name, run in runs.items():
            start = time.perf_counter()
            run([doc], 1)
            times[name].append(time.perf_counter() - start)
    passes: dict[str, list[float]] = {name: [] for name in runs}
    batch_docs = docs[:args.throughput_docs]
    for turn in range(args.rounds):
        order = list(runs.items())
        for name, run in order[turn % len(order):] + order[:turn % len(order)]:
            start = time.perf_counter()
            run(batch_docs, 16)
            passes[name].append(len(batch_docs) / (time.perf_counter() - start))
    return {name: {"p50_ms": statistics.median(times[name]) * 1e3,
                   "p90_ms": statistics.quantiles(times[name], n=10)[-1] * 1e3 if len(times[name]) > 1 else
                   times[name][0] * 1e3, "docs_s": statistics.median(passes[name]), "passes": passes[name]}
            for name in runs}


def figure(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for index, (name, r) in enumerate(results.items(), 1):  # numbered points, named in the legend: names overlap
        ax.scatter(r["p50_ms"], r["rouge"]["rougeL"], s=max(r["mb"], 1) * 2, alpha=0.5,
                   label=f"{index}. {name}, {r['mb']:.0f} MB")
        ax.annotate(str(index), (r["p50_ms"], r["rouge"]["rougeL"]), fontsize=8, ha="center", va="center")
    ax.legend(fontsize=7, loc="lower right", markerscale=0.3)
    ax.set_xscale("log")
    ax.set_xlabel("batch-1 latency, p50 (ms, log scale)")
    ax.set_ylabel("ROUGE-L")
    ax.set_title("What the chain buys (marker area: MB on disk)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def table(results: dict[str, dict]) -> list[str]:
    base = results[TEACHER]
    lines = ["| form | ROUGE-1 | ROUGE-2 | ROUGE-L [95% CI] | p vs teacher (R-L) | MB | × smaller | peak RSS MB | "
             "p50 ms | p90 ms | × faster (p50) | docs/s batch 16 |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        ci = r["ci95"]["rougeL"]
        p = r["against_teacher"]["rougeL"] if r["against_teacher"] else None
        lines.append(f"| {name} | {r['rouge']['rouge1']:.2f} | {r['rouge']['rouge2']:.2f} | {r['rouge']['rougeL']:.2f} "
                     f"[{ci[0]:.2f}, {ci[1]:.2f}] | {'' if p is None else f'{p:.3f}'} | {r['mb']:.1f} | "
                     f"{base['mb'] / r['mb']:.1f} | {r['rss_mb']:.0f} | {r['p50_ms']:.0f} | {r['p90_ms']:.0f} | "
                     f"{base['p50_ms'] / r['p50_ms']:.2f} | {r['docs_s']:.2f} |")
    return lines


def pytorch_table(results: dict[str, dict]) -> list[str]:
    lines = ["| exported form | ROUGE-L | its PyTorch form's ROUGE-L [95% CI] | within the interval |", "|---|---|---|---|"]
    for name, r in results.items():
        if "pytorch" in r:
            t = r["pytorch"]
            lines.append(f"| {name} | {r['rouge']['rougeL']:.2f} | {t['rougeL']:.2f} [{t['ci95'][0]:.2f}, "
                         f"{t['ci95'][1]:.2f}] | {'yes' if t['within'] else 'no'} |")
    return lines


def verdict(results: dict[str, dict]) -> str:
    base = results[TEACHER]
    met = [name for name, r in results.items() if name != TEACHER and base["mb"] / r["mb"] >= 4
           and base["p50_ms"] / r["p50_ms"] >= 3 and base["rouge"]["rougeL"] - r["rouge"]["rougeL"] <= 1.0]
    if met:
        return "Target met (≥ 4× smaller, ≥ 3× faster at batch 1, ROUGE-L within 1.0 of the teacher): " + ", ".join(met)

    def shortfall(name: str) -> float:  # how far from each of the three bars, each as a share of its bar
        r = results[name]
        return (max(0.0, 4 - base["mb"] / r["mb"]) / 4 + max(0.0, 3 - base["p50_ms"] / r["p50_ms"]) / 3
                + max(0.0, base["rouge"]["rougeL"] - r["rouge"]["rougeL"] - 1.0))

    nearest = min((n for n in results if n != TEACHER), key=shortfall)
    r = results[nearest]
    return (f"Target not met: no form is ≥ 4× smaller and ≥ 3× faster with ROUGE-L within 1.0 of the teacher; "
            f"nearest: {nearest} ({base['mb'] / r['mb']:.1f}× smaller, {base['p50_ms'] / r['p50_ms']:.2f}× faster, "
            f"ROUGE-L {r['rouge']['rougeL'] - base['rouge']['rougeL']:+.2f})")


def verdict_budget(results: dict[str, dict]) -> str:
    """Issue 55's target: a form >= 10x smaller than the teacher's float32, >= 5x faster at batch 1 than the teacher
    in PyTorch, ROUGE-L within 1.0."""
    base = results[TEACHER]
    met = [name for name, r in results.items() if name != TEACHER and base["mb"] / r["mb"] >= 10
           and base["p50_ms"] / r["p50_ms"] >= 5 and base["rouge"]["rougeL"] - r["rouge"]["rougeL"] <= 1.0]
    if met:
        return "Issue 55's target met (≥ 10× smaller, ≥ 5× faster, ROUGE-L within 1.0): " + ", ".join(met)
    small = [n for n, r in results.items() if n != TEACHER and base["mb"] / r["mb"] >= 10]
    best = max(small, key=lambda n: results[n]["rouge"]["rougeL"]) if small else None
    return ("Issue 55's target not met (≥ 10× smaller, ≥ 5× faster, ROUGE-L within 1.0)" + (
        f"; the best form ≥ 10× smaller: {best} (ROUGE-L {results[best]['rouge']['rougeL'] - base['rouge']['rougeL']:+.2f}, "
        f"{base['p50_ms'] / results[best]['p50_ms']:.2f}× faster)" if best else ""))


def tiny_setup(work: Path) -> tuple[Path, Path]:
    """A random BART of the smoke-run shape and the bundled sample, gzipped as --data expects."""
    import gzip
    import shutil

    from peers import SMALL, build_model

    teacher, data = work / "teacher", work / "data"
    if not (teacher / "config.json").is_file():
        build_model(teacher, SMALL, seed=0)
    data.mkdir(parents=True, exist_ok=True)
    for split in ("train", "validation"):
        source = ROOT / "src" / "modelshrink" / "samples" / "debian" / f"{split}.jsonl"
        with open(source, "rb") as f, gzip.open(data / f"{split}.jsonl.gz", "wb") as g:
            shutil.copyfileobj(f, g)
    return teacher, data


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", help="the float seq2seq teacher [default: runs/repro/teacher]")
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "debian-descriptions"))
    parser.add_argument("--work", type=Path, default=Path("runs/frontier"), help="artifacts and frontier.json")
    parser.add_argument("--reuse", help="recipes/dq-bart-debian.sh's folder: its 888-6-6, 228-6-6, 228-6-3")
    parser.add_argument("--student", help="a student to reuse instead of distilling one")
    parser.add_argument("--uniform", type=lambda t: [b for b in t.split(",") if b], default=["3-3-8", "4-4-8"],
                        help="more uniform W-E-A forms, all layers, comma-separated ('' for none) [default: 3-3-8,4-4-8]")
    parser.add_argument("--budgets", type=lambda t: [b for b in t.split(",") if b], default=["10x", "13x"],
                        help="budget forms, comma-separated: MB, or Nx (the teacher's float32 weights over N) "
                        "[default: 10x,13x]")
    parser.add_argument("--decoder-layers", type=int, help="the student's and the fewer-layer 2-2-8's [default: half]")
    parser.add_argument("--student-steps", type=int, default=1500)
    parser.add_argument("--quantize-steps", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=3072, help="padded tokens a training batch")
    parser.add_argument("--docs", type=int, default=1000, help="validation documents scored")
    parser.add_argument("--latency-docs", type=int, default=20)
    parser.add_argument("--throughput-docs", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--figure", type=Path, default=ROOT / "benchmarks" / "frontier.png")
    parser.add_argument("--tiny", action="store_true", help="a random tiny BART on the bundled sample (a smoke run)")
    parser.add_argument("--no-export-check", action="store_true", help="export without checking against PyTorch "
                        "(a smoke run; the frontier still scores every export against its PyTorch form)")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--rss-of", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    return parser


def main() -> None:
    args = arguments().parse_args()
    if args.rss_of:  # the child process of peak_rss_mb
        summarizer(args.rss_of[0], Path(args.rss_of[1]))(json.loads(sys.stdin.read()), 16)
        # VmHWM, not getrusage's ru_maxrss: Linux keeps that across exec, so a child forked from this (large)
        # process would start at the parent's peak
        status = Path("/proc/self/status").read_text().splitlines()
        print(next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024)  # kB
        return
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    args.work.mkdir(parents=True, exist_ok=True)
    if args.tiny:
        teacher, data = tiny_setup(args.work)
        args.teacher, args.data = str(teacher), str(data)
    args.teacher = args.teacher or "runs/repro/teacher"
    train, validation = Path(args.data) / "train.jsonl.gz", Path(args.data) / "validation.jsonl.gz"
    if not train.is_file() or not Path(args.teacher, "config.json").is_file():
        sys.exit(f"frontier: needs a teacher ({args.teacher}) and {train}; make the teacher with "
                 "recipes/teacher-debian.sh")
    forms = make_forms(args, train, log)
    results = quality(forms, validation, args, log)
    for name, found in against_pytorch(forms, results, validation, args, log).items():
        results[name]["pytorch"] = found
    docs = [row["document"] for row in read_rows(validation, max(args.latency_docs, args.throughput_docs, 16))]
    for name, (kind, path) in forms.items():
        results[name]["mb"] = weight_mb(kind, path)
        results[name]["rss_mb"] = peak_rss_mb(kind, path, docs[:16])
    for name, measured in speed(forms, docs, args).items():
        results[name].update(measured)
    budgets = budget_against_uniform(forms, results, args, log)
    (args.work / "frontier.json").write_text(json.dumps({"forms": {n: [k, str(p)] for n, (k, p) in forms.items()},
                                                         "results": results, "budgets": budgets}, indent=2) + "\n")
    if not args.no_write:
        figure(results, args.figure)
    import onnxruntime
    import torch

    command = "python benchmarks/frontier.py " + " ".join(sys.argv[1:])
    text = "\n".join([
        f"Teacher `{args.teacher}`; the first {args.docs} documents of {os.path.relpath(validation)} (beam 4, no repeated trigram, "
        f"sources ≤ {MAX_SOURCE} tokens); ROUGE 95% intervals by bootstrap, p: paired permutation test against the "
        f"teacher; latency over {args.latency_docs} documents taken in turn by every form, batch 16 over "
        f"{args.throughput_docs} documents ({args.rounds} passes); {len(os.sched_getaffinity(0))} threads. Machine: "
        f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, onnxruntime "
        f"{onnxruntime.__version__}. Command: `{command}` ({time.strftime('%Y-%m-%d')}).", "",
        *table(results), "", verdict(results), "", verdict_budget(results), "",
        "Each exported form against the PyTorch model it was exported from, on the same documents:", "",
        *pytorch_table(results),
        *(["", "Each budget form against the uniform-bits form nearest its size (sizes: the quantize artifacts, "
           "which the budget bounds; same steps and data), paired permutation test on the same documents:", "",
           *budget_table(budgets)] if budgets else [])])
    publish("frontier", "frontier: what the whole chain buys", text, write=not args.no_write and not args.tiny)


if __name__ == "__main__":
    main()
