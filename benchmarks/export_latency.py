"""Latency, throughput and ROUGE of one student as PyTorch eager, ONNX Runtime float32 and ONNX Runtime int8.

    python benchmarks/export_latency.py --model modelshrink-quickstart/student-lambda2 --docs 50

Exports MODEL twice (`export`, `export --int8`), then runs the three forms on the same first --docs
documents of the bundled Debian validation sample with the model's generation settings: latency at
batch 1 (p50, p90, after 2 warm-up documents), throughput at batch 16, and ROUGE against the references.
Targets (issue 7): float32 ONNX no slower than PyTorch; int8 at least 2x faster than PyTorch float32.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from _report import write_section


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--docs", type=int, default=50)
    parser.add_argument("--max-source-length", type=int, default=64)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    from modelshrink.export import ExportOptions, export_model
    from modelshrink.generation import decode, generate_ids, resolve_generation
    from modelshrink.metrics import rouge
    from modelshrink.models import load_seq2seq
    from modelshrink.quickstart import sample_path
    from modelshrink.runtime import load
    import json

    load_before = os.getloadavg()[0]  # other processes on the same 2 cores skew every number: the table says so
    rows = [json.loads(line) for line in sample_path("validation").read_text().splitlines()][:args.docs]
    docs, refs = [r["document"] for r in rows], [r["summary"] for r in rows]
    work = Path(tempfile.mkdtemp(prefix="bench-export-"))
    exports = {}
    for name, int8 in (("onnx-fp32", False), ("onnx-int8", True)):
        try:
            exports[name], _ = export_model(ExportOptions(model=args.model, int8=int8, generation_docs=2,
                                                          max_source_length=args.max_source_length), work / name)
        except Exception as e:  # a failed check still leaves the folder; the numbers are what we want here
            print(f"{name}: {e}", file=sys.stderr)
            exports[name] = work / name
    model, tok, _ = load_seq2seq(args.model)
    settings = resolve_generation(model.generation_config)

    def torch_run(batch: list[str]) -> list[str]:
        enc = tok(batch, truncation=True, max_length=args.max_source_length, padding=True, return_tensors="pt")
        return decode(tok, generate_ids(model, enc["input_ids"], enc["attention_mask"], settings))

    systems = {"PyTorch eager (float32)": torch_run}
    for name, folder in exports.items():
        runtime = load(folder)
        systems[f"ONNX Runtime {name[5:]}"] = (lambda r: lambda batch: r.summarize(
            batch, len(batch), args.max_source_length))(runtime)
    results, summaries = {}, {}  # summaries["reference"]: PyTorch's, which the others are compared with
    for name, run in systems.items():
        for d in docs[:2]:
            run([d])
        times = []
        for d in docs:
            start = time.perf_counter()
            run([d])
            times.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        outputs = []
        for i in range(0, len(docs), 16):
            outputs += run(docs[i:i + 16])
        seconds = time.perf_counter() - start
        per_doc = rouge.rouge_per_document(outputs, refs)
        same = sum(a == b for a, b in zip(outputs, summaries.setdefault("reference", outputs)))
        results[name] = dict(p50=np.percentile(times, 50), p90=np.percentile(times, 90), docs_s=len(docs) / seconds,
                             same=same, **{k: float(np.mean(per_doc[k])) for k in ("rouge1", "rouge2", "rougeL")})
        print(name, results[name], file=sys.stderr)
    base = results["PyTorch eager (float32)"]["p50"]
    sizes = {name: sum(p.stat().st_size for p in folder.glob("*.onnx")) for name, folder in exports.items()}
    torch_size = sum(p.stat().st_size for p in Path(args.model).glob("*.safetensors"))
    lines = [f"Model: `{args.model}`; the first {len(docs)} documents of the bundled Debian validation sample, "
             f"sources truncated to {args.max_source_length} tokens, generation: beam {settings.num_beams}, max length "
             f"{settings.max_length}, no-repeat n-gram {settings.no_repeat_ngram_size}. Latency at batch 1 after 2 "
             f"warm-up documents; throughput at batch 16; 'same': summaries (batch 16) identical to PyTorch's. "
             f"Sizes: PyTorch safetensors {torch_size / 1e6:.0f} MB, "
             f"ONNX float32 {sizes.get('onnx-fp32', 0) / 1e6:.0f} MB, "
             f"int8 {sizes.get('onnx-int8', 0) / 1e6:.0f} MB (encoder + decoder + decoder with past). Machine: "
             f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores, torch {torch.__version__} "
             f"({torch.get_num_threads()} threads), load average {load_before:.1f} at the start. "
             f"Command: `python benchmarks/export_latency.py --model {args.model} "
             f"--docs {args.docs}` ({time.strftime('%Y-%m-%d')}).", "",
             "| form | latency p50 ms | p90 ms | speed-up (p50) | docs/s (batch 16) | same | ROUGE-1 | ROUGE-2 "
             "| ROUGE-L |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['p50']:.1f} | {r['p90']:.1f} | {base / r['p50']:.2f}× | {r['docs_s']:.2f} | "
                     f"{r['same']}/{len(docs)} | "
                     f"{r['rouge1']:.2f} | {r['rouge2']:.2f} | {r['rougeL']:.2f} |")
    print("\n".join(lines))
    if not args.no_write:
        write_section("export_latency", "export: PyTorch against ONNX Runtime", "\n".join(lines),
                      "Target (issue 7): float32 ONNX no slower than PyTorch eager; int8 at least 2× faster than "
                      "PyTorch float32, on 2 CPU cores.")
    shutil.rmtree(work, ignore_errors=True)  # the two exports are only the benchmark's scratch


if __name__ == "__main__":
    main()
