"""Footprint and quality of `quantize`, measured from the files on disk, for one model.

    python benchmarks/quantize_footprint.py --model modelshrink-quickstart/teacher \\
        --data modelshrink-quickstart/pseudolabel-lambda2

For the full-precision MODEL (6-6 layers): 8-8-8 and 2-2-8 at full depth, and 2-2-8 shrunk to 6-3
(decoder layers 0, 3, 5), each stored by `quantize`; the compression ratio is the float32 size of
MODEL over the bytes of the stored weights (DQ-BART Table 1 reports 3.9×, 13.6× and 16.5× for
BART-base). Then ROUGE on --eval-docs documents of the Debian validation set for the float model,
`--method direct` and `--method distill` (--steps of distillation-aware training on DATA) at 8-8-8
and 2-2-8. Results go into BENCHMARKS.md between this script's markers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from _report import cpu, publish

ROOT = Path(__file__).resolve().parents[1]
DEBIAN = ROOT.parent / "shared" / "data" / "debian-descriptions" / "validation.jsonl.gz"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a trained full-precision seq2seq model (6-6 layers)")
    parser.add_argument("--data", required=True, help="training pairs for distillation-aware quantization")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eval-docs", type=int, default=500)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if not DEBIAN.is_file():
        sys.exit(f"needs {DEBIAN}")

    from modelshrink.models.efficiency import parameter_count, weight_bytes
    from modelshrink.steps.evaluate import EvalOptions, evaluate
    from modelshrink.models.loading import load_seq2seq
    from modelshrink.steps.quantize import QuantizeOptions, quantize

    work = Path(tempfile.mkdtemp(prefix="bench-quant-"))
    float_params = parameter_count(load_seq2seq(args.model)[0])
    lengths = dict(max_source_length=64, max_target_length=24, batch_size=16)
    runs = {}
    for bits in ("8-8-8", "2-2-8"):
        runs[f"{bits} 6-6 direct"] = quantize(QuantizeOptions(model=args.model, bits=bits, method="direct",
                                                              device="cpu"), work / f"direct-{bits}")
        runs[f"{bits} 6-6 distill"] = quantize(QuantizeOptions(model=args.model, bits=bits, data=args.data,
                                                               device="cpu", max_steps=args.steps, lr=1e-4,
                                                               **lengths),
                                               work / f"distill-{bits}")
    runs["2-2-8 6-3 (size only, untrained)"] = quantize(
        QuantizeOptions(model=args.model, bits="2-2-8", data=args.data, device="cpu",
                        max_steps=0, decoder_layers=3, **lengths), work / "shrunk-2-2-8")
    size_rows = [("32-32-32 6-6 (float32 model)", 4 * float_params, 4 * float_params, float_params)]
    for name, path in runs.items():
        if "distill" in name:
            continue
        stored = weight_bytes(path)
        size_rows.append((name.replace(" direct", ""), stored, 4 * float_params, parameter_count(load_seq2seq(str(path))[0])))
    quality = {}
    for name, path in [("32-32-32 (float)", Path(args.model))] + [(n, p) for n, p in runs.items() if "size" not in n]:
        _, metrics = evaluate(EvalOptions(data=str(DEBIAN), model=str(path), limit=args.eval_docs, latency_docs=0,
                                          device="cpu", max_source_length=64, allow_empty=True),
                              work / f"eval-{len(quality)}")
        quality[name] = metrics
        print(f"{name}: ROUGE-1 {metrics['rouge1']:.2f}", file=sys.stderr)
    lines = [f"Model: `{args.model}` ({float_params:,} parameters, float32 {4 * float_params / 1e6:.1f} MB); "
             f"distillation-aware runs: {args.steps} steps on `{args.data}`; ROUGE on the first {args.eval_docs} "
             f"documents of debian-descriptions/validation. Machine: {cpu()}, "
             f"{torch.get_num_threads()} threads. Command: `python benchmarks/quantize_footprint.py --model "
             f"{args.model} --data {args.data}` ({time.strftime('%Y-%m-%d')}).", "",
             "| W-E-A, E-D layers | bytes on disk | compression (float32 / stored) | parameters |", "|---|---|---|---|"]
    for name, stored, reference, params in size_rows:
        lines.append(f"| {name} | {stored:,} | {reference / stored:.2f}× | {params:,} |")
    lines += ["", "| model | ROUGE-1 | ROUGE-2 | ROUGE-L | 95% CI ROUGE-L |", "|---|---|---|---|---|"]
    for name, m in quality.items():
        low, high = m["ci95"]["rougeL"]
        lines.append(f"| {name} | {m['rouge1']:.2f} | {m['rouge2']:.2f} | {m['rougeL']:.2f} | [{low:.2f}, {high:.2f}] |")
    text = "\n".join(lines)
    publish("quantize_footprint", "quantize: footprint and quality", text, write=not args.no_write)
    if not args.no_write:
        (Path(tempfile.gettempdir()) / "quantize_footprint.json").write_text(json.dumps(
            {"sizes": size_rows, "quality": {k: {kk: v[kk] for kk in ("rouge1", "rouge2", "rougeL")}
                                             for k, v in quality.items()}}, indent=2))


if __name__ == "__main__":
    main()
