"""Latency, throughput, size and ROUGE of one student as PyTorch eager, ONNX Runtime float32 and ONNX Runtime int8.

    python benchmarks/export_latency.py --model runs/student --docs 100

Exports MODEL twice (`export`, `export --int8`), then runs every form on the same first --docs documents
(of --data; default: the bundled Debian validation sample) with the model's generation settings:
- latency at batch 1: every document goes through each form in turn (so a load change on the machine
  hits all forms alike), after 2 warm-up documents; p50 and p90;
- throughput at batch 16: --rounds interleaved passes over all documents, the median pass;
- the summaries of the batch-16 pass: ROUGE against the references, how many equal PyTorch's, and a
  paired permutation test of ROUGE-L against PyTorch's.
A last row runs int8 with the beam search's log-softmax and top-k in numpy instead of search_ops.onnx,
to show what that file is for. Targets (issue 7): float32 ONNX no slower than PyTorch; int8 at least 2x
faster than PyTorch float32.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _report import cpu, write_section

TORCH = "PyTorch eager (float32)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", default=None, help="JSON lines with document and summary [default: bundled sample]")
    parser.add_argument("--docs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3, help="Batch-16 passes per form (the median is reported).")
    parser.add_argument("--max-source-length", type=int, default=64)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    from modelshrink.data import open_data
    from modelshrink.steps.export import export_model
    from modelshrink.generation.settings import decode, generate_ids, resolve_generation
    from modelshrink.metrics import rouge
    from modelshrink.metrics.stats import paired_test
    from modelshrink.models.loading import load_seq2seq
    from modelshrink.options.export import ExportOptions
    from modelshrink.quickstart import sample_path
    from modelshrink.runtime import load

    load_before = os.getloadavg()[0]  # other processes on the same 2 cores skew every number: the table says so
    data = args.data or str(sample_path("validation"))
    rows = []
    for row in open_data(data).rows():
        rows.append(row)
        if len(rows) == args.docs:
            break
    docs, refs = [r["document"] for r in rows], [r["summary"] for r in rows]
    work = Path(tempfile.mkdtemp(prefix="bench-export-"))
    exports, checks = {}, {}
    for name, int8 in (("fp32", False), ("int8", True)):
        try:
            exports[name], report = export_model(ExportOptions(model=args.model, int8=int8, data=data, samples=4,
                                                               generation_docs=4,
                                                               max_source_length=args.max_source_length),
                                                 work / name)
            checks[name] = report["validation"]
        except Exception as e:  # a failed check still leaves the folder; the numbers are what we want here
            print(f"{name}: {e}", file=sys.stderr)
            exports[name] = work / name
            checks[name] = json.loads((work / name / "export_report.json").read_text())["validation"]
    model, tok, _ = load_seq2seq(args.model)
    settings = resolve_generation(model.generation_config)

    def torch_run(batch: list[str]) -> list[str]:
        enc = tok(batch, truncation=True, max_length=args.max_source_length, padding=True, return_tensors="pt")
        return decode(tok, generate_ids(model, enc["input_ids"], enc["attention_mask"], settings))

    def onnx_run(runtime):
        return lambda batch: runtime.summarize(batch, len(batch), args.max_source_length)

    systems = {TORCH: torch_run}
    for name, folder in exports.items():
        systems[f"ONNX Runtime {name}"] = onnx_run(load(folder))
    numpy_search = load(exports["int8"])
    numpy_search.search_ops = None
    systems["ONNX Runtime int8, search in numpy"] = onnx_run(numpy_search)

    for run in systems.values():  # warm-up
        for d in docs[:2]:
            run([d])
    times: dict[str, list[float]] = {name: [] for name in systems}
    for d in docs:
        for name, run in systems.items():
            start = time.perf_counter()
            run([d])
            times[name].append((time.perf_counter() - start) * 1000)
    passes: dict[str, list[float]] = {name: [] for name in systems}
    outputs: dict[str, list[str]] = {}
    for _ in range(args.rounds):
        for name, run in systems.items():
            start = time.perf_counter()
            got = []
            for i in range(0, len(docs), 16):
                got += run(docs[i:i + 16])
            passes[name].append(time.perf_counter() - start)
            outputs[name] = got
    scores = {name: rouge.rouge_per_document(out, refs) for name, out in outputs.items()}
    results = {}
    for name in systems:
        same = sum(a == b for a, b in zip(outputs[name], outputs[TORCH]))
        p = paired_test(scores[name]["rougeL"], scores[TORCH]["rougeL"]) if name != TORCH else None
        results[name] = dict(p50=float(np.percentile(times[name], 50)), p90=float(np.percentile(times[name], 90)),
                             docs_s=len(docs) / float(np.median(passes[name])),
                             every=[len(docs) / s for s in passes[name]], same=same, p=p,
                             **{k: float(np.mean(scores[name][k])) for k in ("rouge1", "rouge2", "rougeL")})
        print(name, results[name], file=sys.stderr)
    base, base_tp = results[TORCH]["p50"], results[TORCH]["docs_s"]
    sizes = {name: sum(p.stat().st_size for p in folder.glob("*.onnx")) for name, folder in exports.items()}
    torch_size = sum(p.stat().st_size for p in Path(args.model).glob("*.safetensors"))
    files = ", ".join(sorted(p.name for p in exports["fp32"].glob("*.onnx")))
    check = "; ".join(f"{name}: worst {c['worst_output']} " + (f"RMS ratio {c['rms_ratio']:.3f}" if "rms_ratio" in c
                                                               else f"difference {c['max_abs_diff']:.2g}")
                      + f", tokens equal {c['generation']['agreement']}" for name, c in checks.items())
    lines = [f"Model: `{args.model}` ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters); the "
             f"first {len(docs)} documents of `{data if args.data else 'the bundled Debian validation sample'}`, "
             f"sources truncated to {args.max_source_length} tokens, generation: beam {settings.num_beams}, max "
             f"length {settings.max_length}, no-repeat n-gram {settings.no_repeat_ngram_size}. Latency at batch 1, "
             f"documents interleaved across the forms, after 2 warm-up documents; throughput at batch 16, median of "
             f"{args.rounds} interleaved passes; 'same': summaries identical to PyTorch's; p: paired permutation "
             f"test of ROUGE-L against PyTorch. Sizes on disk: PyTorch safetensors {torch_size / 1e6:.0f} MB, "
             f"ONNX float32 {sizes['fp32'] / 1e6:.0f} MB, int8 {sizes['int8'] / 1e6:.0f} MB ({files}). "
             f"Export checks: {check}. Machine: {cpu()}, {len(os.sched_getaffinity(0))} cores, torch "
             f"{torch.__version__} ({torch.get_num_threads()} threads), load average {load_before:.1f} at the "
             f"start. Command: `python benchmarks/export_latency.py --model {args.model}"
             f"{' --data ' + args.data if args.data else ''} --docs {args.docs}` ({time.strftime('%Y-%m-%d')}).", "",
             "| form | latency p50 ms | p90 ms | speed-up (p50) | docs/s (batch 16) | speed-up | every pass | same "
             "| ROUGE-1 | ROUGE-2 | ROUGE-L | p |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        p_value = "" if r["p"] is None else f"{r['p']:.2f}"
        lines.append(f"| {name} | {r['p50']:.1f} | {r['p90']:.1f} | {base / r['p50']:.2f}× | {r['docs_s']:.2f} | "
                     f"{r['docs_s'] / base_tp:.2f}× | {', '.join(f'{x:.2f}' for x in r['every'])} | "
                     f"{r['same']}/{len(docs)} | {r['rouge1']:.2f} | {r['rouge2']:.2f} | {r['rougeL']:.2f} | "
                     f"{p_value} |")
    print("\n".join(lines))
    if not args.no_write:
        write_section("export_latency", "export: PyTorch against ONNX Runtime", "\n".join(lines),
                      "Target (issue 7): float32 ONNX no slower than PyTorch eager; int8 at least 2× faster than "
                      "PyTorch float32, on 2 CPU cores.")
    shutil.rmtree(work, ignore_errors=True)  # the two exports are only the benchmark's scratch


if __name__ == "__main__":
    main()
