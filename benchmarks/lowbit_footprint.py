"""What the deployed ONNX folder keeps of a model's compression, and how fast it runs: float32, --int8, --int4 and
`quantize` artifacts.

    python benchmarks/lowbit_footprint.py                 # a random BART of BART-base's shape (about 35 min)
    python benchmarks/lowbit_footprint.py --small --no-write

On one model (default: a random BART of BART-base's shape, vocabulary 50265, built as benchmarks/peers.py
builds it; or --model), each form is exported with `modelshrink export` (validation included):
float32, `--int8` (each matmul on the kernel measured fastest, and again with `--kernel int8`: onnxruntime's uint8
kernel everywhere, what --int8 wrote before it measured, and `--kernel nbits`), `--int4`, and `quantize --method direct` artifacts at 2-2-8 (ternary), 4-4-8 and 8-8-8,
each exported with the default `--activation-rounding` (auto: kernel, each integer kernel rounds its own input,
as --int8's does) and again with `none` (the uint8 kernel on the model's own codes of each input), 2-2-8 also with
`model` (the attention's own roundings kept, so it is not fused).
For each: the bytes of its .onnx files, the ratio to float32 and to the --int8 folder, export seconds, the
check's verdict and token agreement with PyTorch, the kernels its matmuls were given (`modelshrink.onnx.kernels`),
batch-1 latency of the runtime (beam 4, 2 threads, p50 and p90 over --docs documents taken in turn by every form,
so a load change hits all alike) and batch-16 throughput (--docs documents a pass, median of --rounds passes,
the forms taking turns).
Targets (issue 15): the ternary folder <= 0.5x the --int8 folder; --int4 <= 0.2x float32. Issue 29: the ternary
folder <= 0.3x the --int8 folder; 2-2-8 and 4-4-8 batch-1 p50 <= 0.5x float32's and <= 1.0x --int8's, batch-16
docs/s >= 1.2x float32's; 8-8-8 p50 <= 1.0x --int8's; --int4 p50 <= 0.6x float32's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _report import cpu, publish
from peers import BASE, SMALL, build_model, read_documents

QUANTIZED = ("2-2-8", "4-4-8", "8-8-8")
# also exported with these --activation-rounding values (the default, auto, is kernel: every matmul input's
# rounding left to its integer kernel): none multiplies the model's own codes of each input (the uint8 kernel);
# model keeps the attention's own roundings too (so it is not fused)
ROUNDINGS = {"2-2-8": ("none", "model"), "4-4-8": ("none",), "8-8-8": ("none",)}


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.onnx"))


def export(model: Path, out: Path, data: Path, **flags) -> dict:
    from modelshrink.steps.export import ExportCheckFailed, export_model
    from modelshrink.options.export import ExportOptions

    start = time.perf_counter()
    try:
        _, report = export_model(ExportOptions(model=str(model), data=str(data), **flags), out, overwrite=True)
        verdict = "passed"
    except ExportCheckFailed as e:
        report, verdict = json.loads((out / "export_report.json").read_text()), f"failed: {e}"
    generation = report.get("validation", {}).get("generation", {})
    kernels: dict[str, int] = {}
    for entry in report.get("storage", {}).values():
        for kernel, count in entry.get("low_bit_kernels", entry.get("int4_kernels", entry.get("int8_kernels", {}))).items():
            kernels[kernel] = kernels.get(kernel, 0) + count
    return {"seconds": time.perf_counter() - start, "check": verdict, "agreement": generation.get("agreement", "-"),
            "bytes": folder_bytes(out), "kernels": ", ".join(f"{k} {n}" for k, n in sorted(kernels.items())) or "-",
            "rms": report.get("validation", {}).get("rms_ratio")}


def speeds(folders: dict[str, Path], docs: list[str], beams: int, length: int, rounds: int) -> dict[str, dict]:
    """Batch-1 p50 and p90 seconds a document, and batch-16 documents a second (median of `rounds` passes)."""
    from modelshrink.runtime import load

    models = {name: load(folder, threads=2) for name, folder in folders.items()}
    settings = dict(num_beams=beams, min_length=length, max_length=length)
    times: dict[str, list[float]] = {name: [] for name in models}
    for model in models.values():  # warm-up
        model.summarize(docs[:1], batch_size=1, **settings)
    for doc in docs:
        for name, model in models.items():
            start = time.perf_counter()
            model.summarize([doc], batch_size=1, **settings)
            times[name].append(time.perf_counter() - start)
    passes: dict[str, list[float]] = {name: [] for name in models}
    for turn in range(rounds):
        order = list(models.items())
        for name, model in order[turn % len(order):] + order[:turn % len(order)]:  # each round starts elsewhere
            start = time.perf_counter()
            model.summarize(docs, batch_size=16, **settings)
            passes[name].append(len(docs) / (time.perf_counter() - start))
    return {name: {"p50": statistics.median(values), "p90": statistics.quantiles(values, n=10)[-1],
                   "docs_s": statistics.median(passes[name]), "passes": passes[name]} for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a float seq2seq model folder [default: a random BART of BART-base's shape]")
    parser.add_argument("--small", action="store_true", help="a tiny random BART (a smoke run)")
    parser.add_argument("--docs", type=int, default=12, help="documents for batch-1 latency")
    parser.add_argument("--length", type=int, default=32, help="summary length forced on every form (tokens)")
    parser.add_argument("--rounds", type=int, default=3, help="batch-16 passes of every form")
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    from modelshrink.steps.quantize import QuantizeOptions, quantize

    hf_logging.disable_progress_bar()

    work = Path(tempfile.mkdtemp(prefix="lowbit-"))
    model = Path(args.model) if args.model else work / "model"
    if not args.model:
        build_model(model, SMALL if args.small else BASE, seed=0)
    data = work / "docs.jsonl"
    docs = read_documents("validation", 40)
    data.write_text("".join(json.dumps({"document": d}) + "\n" for d in docs))
    forms: dict[str, dict] = {}
    folders: dict[str, Path] = {}
    for name, flags in (("float32", {}), ("--int8", {"int8": True}),
                        ("--int8 --kernel int8", {"int8": True, "kernel": "int8"}),
                        ("--int8 --kernel nbits", {"int8": True, "kernel": "nbits"}), ("--int4", {"int4": True})):
        folders[name] = work / name.strip("-").replace(" --", "-").replace(" ", "-")
        forms[name] = export(model, folders[name], data, **flags)
        print(name, forms[name], file=sys.stderr)
    for bits in QUANTIZED:
        artifact = quantize(QuantizeOptions(model=str(model), bits=bits, method="direct", device="cpu"), work / bits)
        name = f"quantize {bits}"
        folders[name] = work / f"{bits}-onnx"
        forms[name] = export(artifact, folders[name], data)
        print(name, forms[name], file=sys.stderr)
        for rounding in ROUNDINGS.get(bits, ()):
            name = f"quantize {bits}, rounding {rounding}"
            folders[name] = work / f"{bits}-{rounding}-onnx"
            forms[name] = export(artifact, folders[name], data, activation_rounding=rounding)
            print(name, forms[name], file=sys.stderr)
    speed = speeds(folders, docs[:args.docs], beams=4, length=args.length, rounds=args.rounds)
    f32, i8 = forms["float32"]["bytes"], forms["--int8"]["bytes"]
    lines = ["| export | MB | × float32 | × --int8 folder | export s (with check) | check (RMS ratio) | tokens = PyTorch | "
             "kernels (matmul nodes) | p50 batch 1 (ms) | p90 | p50 × float32 | p50 × --int8 | docs/s batch 16 | "
             "× float32 | every pass |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    base, int8 = speed["float32"], speed["--int8"]
    for name, form in forms.items():
        s = speed[name]
        rms = f" ({form['rms']:.3f})" if form["rms"] is not None else ""
        lines.append(f"| {name} | {form['bytes'] / 1e6:.1f} | {form['bytes'] / f32:.3f} | {form['bytes'] / i8:.3f} | "
                     f"{form['seconds']:.0f} | {form['check']}{rms} | {form['agreement']} | {form['kernels']} | "
                     f"{s['p50'] * 1e3:.0f} | {s['p90'] * 1e3:.0f} | {s['p50'] / base['p50']:.2f} | "
                     f"{s['p50'] / int8['p50']:.2f} | {s['docs_s']:.2f} | {s['docs_s'] / base['docs_s']:.2f} | "
                     f"{', '.join(f'{v:.2f}' for v in s['passes'])} |")

    def ratio(name: str, key: str, against: dict) -> str:
        return f"{speed[name][key] / against[key]:.2f}×"

    targets = [f"- ternary (2-2-8) folder ≤ 0.3× the --int8 folder: {forms['quantize 2-2-8']['bytes'] / i8:.3f}×; "
               f"--int4 ≤ 0.2× float32 on disk: {forms['--int4']['bytes'] / f32:.3f}×"]
    for name in ("quantize 2-2-8", "quantize 4-4-8", *(f"quantize {b}, rounding {r}" for b, rs in ROUNDINGS.items()
                                                       for r in rs if b != "8-8-8")):
        bits = name.split(" ", 1)[1]
        targets.append(f"- {bits}: p50 ≤ 0.5× float32's: {ratio(name, 'p50', base)}; ≤ 1.0× --int8's: "
                       f"{ratio(name, 'p50', int8)}; batch 16 ≥ 1.2× float32's: {ratio(name, 'docs_s', base)}")
    eights = [f"{ratio(name, 'p50', int8)}" + ("" if name == "quantize 8-8-8" else f" ({name.split(', ')[1]})")
              for name in forms if name.startswith("quantize 8-8-8")]
    targets.append(f"- 8-8-8: p50 ≤ 1.0× --int8's: {', '.join(eights)}; "
                   f"--int4: p50 ≤ 0.6× float32's: {ratio('--int4', 'p50', base)}")
    import onnxruntime
    import torch

    shape = "a random BART of BART-base's shape (6+6 layers, d 768, vocabulary 50265)" if not (
        args.model or args.small) else (args.model or "a tiny random BART (--small)")
    command = "python benchmarks/lowbit_footprint.py" + (" --small" if args.small else "") + (
        f" --model {args.model}" if args.model else "") + (f" --docs {args.docs}" if args.docs != 12 else "") + (
        f" --length {args.length}" if args.length != 32 else "") + (f" --rounds {args.rounds}" if args.rounds != 3 else "")
    text = "\n".join([f"`{command}` on {platform.node() or 'this machine'} ({cpu()},"
                      f" {len(os.sched_getaffinity(0))} cores), torch {torch.__version__}, onnxruntime "
                      f"{onnxruntime.__version__}; {shape}; validation on 4 documents of the Debian sample, "
                      f"latency over {args.docs} documents and batch-16 passes over the same documents "
                      f"({args.rounds} rounds), beam 4, {args.length} tokens forced, 2 threads; kernels chosen by "
                      f"`export`'s measurement on this machine ({time.strftime('%Y-%m-%d')}).", "",
                      *lines, "", "Targets:", *targets])
    publish("lowbit-footprint", "export: what the ONNX folder keeps of the compression", text,
            write=not args.no_write and not args.small)


if __name__ == "__main__":
    main()
