"""modelshrink on a GPU against what a user writes by hand, side by side in one run (issue 54, item 3).

    PYTHONPATH=src python benchmarks/gpu_throughput.py --json gpu.json        # one H100 or H200: about 5 minutes
    PYTHONPATH=src python benchmarks/gpu_throughput.py --only distill,quantize  # some of pseudolabel, distill, quantize
    PYTHONPATH=src python benchmarks/gpu_throughput.py --quick --json gpu.json  # within one 8-minute device call
    python benchmarks/gpu_throughput.py --publish gpu.json     # a run's tables (from its --json) into BENCHMARKS.md
    python benchmarks/gpu_throughput.py --tiny --device cpu --no-write --json /tmp/t.json   # tiny, on a CPU (the test)

One model for everything: BART-base's shape (d_model 768, 6 + 6 layers, 12 heads, FFN 3072, 50,265-entry
vocabulary) with random weights (seed 0) and a WordPiece tokenizer made from the bundled sample's words, both
built by `scale_out.py`'s `bart_model` (no hub, no downloads). Three parts:

* pseudolabel: `modelshrink.steps.pseudolabel.pseudolabel` against a plain loop of `model.generate(...)` over
  the very same batches (`modelshrink.generation.settings.plan_batches` with the same --max-tokens, padded by the
  tokenizer) of the same --docs documents of the bundled Debian sample, beam 4, every summary exactly --length
  tokens (min_length = max_length), sources <= --max-source-length tokens; fp32 and bf16 at each --max-tokens.
  Where `PseudolabelOptions` has a `generator` option, modelshrink runs twice: `generator="auto"` (a
  static-shape beam search: CUDA graphs on CUDA, the same step eagerly on a CPU) and `generator="transformers"`
  (its old path). docs/s is the
  generation loop (pseudolabel's manifest `seconds_this_run`; the plain loop timed around the same work:
  tokenizing, batching, generating, decoding). fp32 parity: how many summaries are equal, as strings, to the
  plain loop's (target >= 99%).
* distill: `modelshrink.steps.distill.distill` (label-smoothed cross-entropy) against a plain PyTorch loop
  written here (AdamW, the same model, batches, lr, clipping and schedule; autocast for bf16), fp32 and bf16,
  --train-batch pairs a step. Every training pair is exactly --max-source-length + --max-target-length tokens
  (sample documents and summaries joined until truncation cuts them), so every step has one shape and no
  padding: a step's FLOPs, counted once with `torch.utils.flop_counter.FlopCounterMode`, hold for every step,
  and MFU = FLOPs a token × tokens/s / the GPU's dense peak (a table below, by device name).
* quantize: `modelshrink.steps.quantize.quantize` (distillation-aware, DQ-BART; 8-8-8 and 2-2-8, bf16)
  against `distill` with the same losses against the same teacher (logits MSE + hidden + attention, label
  smoothing 0), --quantize-batch pairs a step; target >= 0.85× its tokens/s.

Warm-up is timed apart and kept out of the medians: pseudolabel runs every setting once in full first (its
docs/s is reported as the warm-up); each training run takes --warmup-steps untimed steps before its --steps
timed ones (the first round's untimed steps are reported). Then --rounds interleaved rounds (the order rotated
each round), median. Peak memory: torch.cuda.max_memory_allocated over a run, the model's weights included.
fp32 runs with torch's default matmul precision (TF32 off) unless something in the run changes it; the table
says which. Progress goes to stderr with timestamps, results to --json after every measurement (a run cut short
still leaves what it measured), tables to stdout, BENCHMARKS.md (never with --tiny unless --write) and the JSON,
whence `--publish` puts a remote run's tables into this checkout's BENCHMARKS.md. A setting that fails is reported
(one line in its table, the traceback on stderr) and the others still run; its part is then not written to
BENCHMARKS.md, and the run exits 1.

The defaults are sized for about 5 minutes on one H200 (12 pseudolabel settings × 3 passes of 600 documents;
7 training settings × 2 rounds of 2 + 3 steps, distill at 205 pairs = 65,600 tokens a step, quantize and its
baseline at 102 pairs); `--docs 400 --steps 2` for less, `--only` for one part.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch

from _report import cpu, publish
from scale_out import bart_model, fresh_peak, peak_since

PARTS = ("pseudolabel", "distill", "quantize")
# What each part needs beyond torch, checked before anything runs (the device machines have torch, transformers,
# accelerate and onnxruntime and no package index: a missing package is one line, not a traceback mid-run)
REQUIRES = {"pseudolabel": ("transformers", "tokenizers", "safetensors"),
            "distill": ("transformers", "tokenizers", "safetensors", "accelerate"),
            "quantize": ("transformers", "tokenizers", "safetensors", "accelerate")}
STEP_MODULES = {part: f"modelshrink.steps.{part}" for part in PARTS}
STARTED = time.perf_counter()

# Dense peaks from NVIDIA's datasheets, TFLOP/s: (a substring of torch.cuda.get_device_name, bf16 tensor cores,
# TF32 tensor cores, fp32 without tensor cores). First match wins: the specific names come first.
PEAKS = [
    ("H200 NVL", 835.0, 417.5, 60.0),
    ("H200", 989.0, 494.5, 67.0),
    ("H100 NVL", 835.0, 417.5, 60.0),
    ("H100 PCIe", 756.0, 378.0, 51.0),
    ("H100", 989.0, 494.5, 67.0),  # SXM: torch calls it "NVIDIA H100 80GB HBM3"
    ("A100", 312.0, 156.0, 19.5),
]

TITLES = {"pseudolabel": "GPU: pseudolabel against a plain model.generate loop",
          "distill": "GPU: distill against a plain PyTorch loop",
          "quantize": "GPU: distillation-aware quantize against distill"}
INTRO = {
    "pseudolabel": "Targets (issue 54): modelshrink at least 1.0× a plain `model.generate` loop over the same batches "
                   "in every setting, bf16 at least 3× it and at least 1.8× its own fp32; fp32 summaries equal to "
                   "generate's on at least 99% of documents; warm-up at most 5 s a shape.",
    "distill": "Targets (issue 54): distill bf16 at least 15% MFU (stretch 25%) at 64k tokens a step or more; fp32 at "
               "least 1.0× a plain PyTorch loop over the same batches.",
    "quantize": "Target (issue 54): distillation-aware quantization at least 0.85× the tokens/s of distill with the "
                "same distillation losses against the same teacher.",
}


def say(message: str) -> None:
    """A progress line on stderr, with the time and the seconds since the start."""
    print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - STARTED:6.1f}s] {message}", file=sys.stderr,
          flush=True)


class Results(dict):
    """Everything measured, written to --json after every measurement."""

    def __init__(self, path: str | None, **head) -> None:
        super().__init__(head)
        self.path = Path(path) if path else None

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(self, indent=1, default=str) + "\n")
        partial.replace(self.path)


def command_line() -> str:
    return " ".join(["python benchmarks/gpu_throughput.py"] +
                    [shlex.quote(a) for a in sys.argv[1:] if a not in ("--no-write", "--write")])


def machine(device: str) -> str:
    import transformers

    versions = (f"torch {torch.__version__}, transformers {transformers.__version__}, fp32 matmul precision "
                f"'{torch.get_float32_matmul_precision()}'")
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        return f"{props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}, {versions}"
    name = cpu()
    threads = plural(torch.get_num_threads(), "thread")
    return f"{name}, {threads}, {versions} (no GPU: a check of the code path, not a measurement)"


def peak_tflops(device: str) -> tuple[str, float, float, float] | None:
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(torch.device(device))
    return next(((key, *numbers) for key, *numbers in PEAKS if key in name), None)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def weights_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def gib(peak: int | None) -> str:
    return f"{peak / 2**30:.2f} GiB" if peak is not None else "n/a (CPU)"


def rounds_order(names: list[str], r: int) -> list[str]:
    return names[r % len(names):] + names[:r % len(names)]


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def median_of(rates: list[float]) -> float | None:
    return statistics.median(rates) if rates else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def times(x: float | None) -> str:
    return f"{x:.2f}×" if x is not None else "n/a"


def attempt(what: str, label: str, name: str, run, entry: dict, results: "Results") -> dict | None:
    """One measurement; a failure is recorded in `entry` and on stderr and the benchmark goes on (a GPU run is short
    and scarce: one setting that breaks must not cost the others)."""
    try:
        return run()
    except Exception as error:  # noqa: BLE001  (anything: recorded, reported, and the run exits 1 at the end)
        message = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        say(f"{what} {label} {name}: FAILED: {message}")
        traceback.print_exc()
        entry["errors"].append(f"{label}: {message}")
        results.save()
        return None


def failures(part: dict) -> list[str]:
    found = [f"{name}: {e}" for name, entry in part["settings"].items() for e in entry["errors"]]
    return found + part.get("errors", [])


# ---------------------------------------------------------------- pseudolabel against model.generate

def document_file(args, work: Path) -> Path:
    """The first --docs documents of the bundled sample (repeated, with new ids, if it has fewer)."""
    rows = [json.loads(line) for line in args.data.read_text().splitlines()]
    picked = [dict(rows[i % len(rows)], id=f"{rows[i % len(rows)]['id']}#{i // len(rows)}") if i >= len(rows)
              else rows[i] for i in range(args.docs)]
    path = work / "documents.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in picked))
    return path


def modelshrink_pseudolabel(model: Path, data: Path, out: Path, dtype: str, max_tokens: int,
                            generator: str | None, args) -> dict:
    from modelshrink.steps.pseudolabel import PseudolabelOptions, pseudolabel

    extra = {"generator": generator} if generator is not None else {}
    options = PseudolabelOptions(teacher=str(model), data=str(data), limit=args.docs, num_beams=args.beams,
                                 min_length=args.length, max_length=args.length, max_tokens=max_tokens,
                                 max_source_length=args.max_source_length, device=args.device, dtype=dtype, **extra)
    baseline = fresh_peak(args.device)
    path = pseudolabel(options, out, log=lambda message: say(f"  pseudolabel: {message}"))
    peak = peak_since(args.device, baseline)
    seconds = json.loads((path / "modelshrink.json").read_text())["metrics"]["seconds_this_run"]
    summaries = [json.loads(line)["summary"] for line in (path / "data.jsonl").read_text().splitlines()]
    shutil.rmtree(path)
    return {"seconds": seconds, "peak": peak, "summaries": summaries}


def generate_loop(model, tokenizer, data: Path, max_tokens: int, args) -> dict:
    """What a user writes: the same batches, padded, through `model.generate`, decoded."""
    from modelshrink.data import examples, open_data
    from modelshrink.generation.settings import plan_batches
    from modelshrink.options.pseudolabel import PseudolabelOptions

    # pseudolabel's window of batches: the count its --batch-size resolves to (older versions: the field's default)
    batch_size = getattr(PseudolabelOptions, "BATCH_SIZE", None) or PseudolabelOptions.__dataclass_fields__[
        "batch_size"].default
    device = torch.device(args.device)
    baseline = fresh_peak(args.device) - weights_bytes(model)
    summaries: dict[int, str] = {}
    lengths: set[int] = set()
    sync(args.device)
    started = time.perf_counter()
    stream = examples(open_data(data), "document", "summary", limit=args.docs)
    with torch.inference_mode():
        for batch in plan_batches(stream, tokenizer, batch_size, args.max_source_length, max_tokens):
            padded = tokenizer.pad({"input_ids": batch.token_ids}, return_tensors="pt").to(device)
            out = model.generate(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"],
                                 num_beams=args.beams, min_length=args.length, max_length=args.length)
            lengths.add(out.shape[1])
            for example, text in zip(batch.rows, tokenizer.batch_decode(out, skip_special_tokens=True)):
                summaries[example.index] = text.strip()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "peak": peak_since(args.device, baseline),
            "summaries": [summaries[i] for i in range(len(summaries))], "summary_tokens": sorted(lengths)}


def pseudolabel_part(args, model: Path, work: Path, results: Results) -> str:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from modelshrink.options.pseudolabel import PseudolabelOptions
    from modelshrink.precision import torch_dtype

    data = document_file(args, work)
    has_generator = "generator" in PseudolabelOptions.__dataclass_fields__
    # auto is the static search wherever the model allows it (a CPU too), so it stands for it
    systems = {"modelshrink (generator auto)": "auto"} if has_generator else {"modelshrink": None}
    if has_generator:
        systems["modelshrink (generator transformers)"] = "transformers"
    systems["plain generate"] = "plain"
    settings = {f"{dtype} · {mt} · {system}": (dtype, mt, system)
                for dtype in ("fp32", "bf16") for mt in args.max_tokens for system in systems}
    names = list(settings)
    plain_models: dict[str, object] = {}
    tokenizer = AutoTokenizer.from_pretrained(model)
    part = results["pseudolabel"] = {
        "documents": args.docs, "beams": args.beams, "summary_tokens": args.length, "max_tokens": args.max_tokens,
        "max_source_length": args.max_source_length, "generator_option": has_generator, "settings": {}, "parity": {}}
    for name, (dtype, mt, system) in settings.items():
        part["settings"][name] = {"dtype": dtype, "max_tokens": mt, "system": system, "warmup": None, "rounds": [],
                                  "peaks": [], "docs_per_s": None, "errors": []}

    def run(name: str, label: str) -> dict | None:
        return attempt("pseudolabel", label, name, lambda: measure(name, label), part["settings"][name], results)

    def measure(name: str, label: str) -> dict:
        dtype, mt, system = settings[name]
        if systems[system] == "plain":
            if dtype not in plain_models:
                plain_models[dtype] = AutoModelForSeq2SeqLM.from_pretrained(model).to(
                    torch.device(args.device), torch_dtype(dtype)).eval()
            got = generate_loop(plain_models[dtype], tokenizer, data, mt, args)
        else:
            got = modelshrink_pseudolabel(model, data, work / "pseudolabel", dtype, mt, systems[system], args)
        rate = args.docs / got["seconds"]
        say(f"pseudolabel {label} {name}: {rate:.1f} docs/s ({got['seconds']:.2f} s)"
            + (f", peak {gib(got['peak'])}" if got["peak"] is not None else ""))
        return {**got, "rate": rate}

    outputs: dict[str, list[str]] = {}
    started = time.perf_counter()
    for name in names:  # the warm-up pass: every setting once, whole, timed apart
        got = run(name, "warm-up")
        if got is not None:
            part["settings"][name]["warmup"] = {"seconds": round(got["seconds"], 3),
                                                "docs_per_s": round(got["rate"], 2)}
            results.save()
    for r in range(args.rounds):
        for name in rounds_order(names, r):
            got = run(name, f"round {r + 1}")
            if got is None:
                continue
            entry = part["settings"][name]
            entry["rounds"].append(round(got["rate"], 2))
            entry["peaks"].append(got["peak"])
            entry["docs_per_s"] = round(median_of(entry["rounds"]), 2)
            if "summary_tokens" in got:
                entry["summary_tokens"] = got["summary_tokens"]
            outputs.setdefault(name, got["summaries"])
            results.save()
    plain_models.clear()
    part["seconds"] = round(time.perf_counter() - started, 1)

    # parity and ratios against the plain loop of the same precision and batches
    for name, (dtype, mt, system) in settings.items():
        entry = part["settings"][name]
        plain = f"{dtype} · {mt} · plain generate"
        entry["vs_generate"] = ratio(entry["docs_per_s"], part["settings"][plain]["docs_per_s"])
        entry["vs_own_fp32"] = ratio(entry["docs_per_s"], part["settings"][f"fp32 · {mt} · {system}"]["docs_per_s"])
        if system != "plain generate" and name in outputs and plain in outputs:
            same = sum(a == b for a, b in zip(outputs[name], outputs[plain]))
            entry["same_as_generate"] = {"same": same, "of": len(outputs[plain])}
            if dtype == "fp32":
                part["parity"][name] = {"same": same, "of": len(outputs[plain]), "share": round(same / args.docs, 4),
                                        "target_met": same >= 0.99 * args.docs}
    results.save()

    main_system = next(iter(systems))
    lines = [
        f"Model: {args.described}. The first {args.docs} documents of the bundled Debian sample, beam {args.beams}, "
        f"every summary exactly {args.length} tokens (min_length = max_length), sources ≤ {args.max_source_length} "
        f"tokens; modelshrink's `pseudolabel` and a plain `model.generate` loop over the same batches "
        f"(`plan_batches`, same --max-tokens). Every setting runs once in full first (its warm-up, reported apart), "
        f"then {plural(args.rounds, 'interleaved round')}, median. Machine: {args.machine}. "
        f"Command: `{command_line()}` ({time.strftime('%Y-%m-%d')}; this part {part['seconds']:.0f} s).",
        "",
        "| precision | --max-tokens | system | docs/s | vs generate | vs its fp32 | same summaries as generate | "
        "peak GPU memory | warm-up pass | every round |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, (dtype, mt, system) in settings.items():
        e = part["settings"][name]
        same = e.get("same_as_generate")
        peaks = [p for p in e["peaks"] if p is not None]
        own = "" if dtype == "fp32" else times(e["vs_own_fp32"])
        equal = (f"{same['same']}/{same['of']}" if same else
                 "(reference)" if system == "plain generate" else "n/a")
        warm = f"{e['warmup']['seconds']:.1f} s ({e['warmup']['docs_per_s']:.1f} docs/s)" if e["warmup"] else "failed"
        rate = f"{e['docs_per_s']:.1f}" if e["docs_per_s"] else "failed"
        lines.append(f"| {dtype} | {mt:,} | {system} | {rate} | {times(e['vs_generate'])} | {own} | "
                     f"{equal} | {gib(max(peaks) if peaks else None)} | {warm} | "
                     f"{', '.join(f'{x:.1f}' for x in e['rounds'])} |")
    ours = {k: v for k, v in part["settings"].items() if v["system"] == main_system}
    known = [v["vs_generate"] for v in ours.values() if v["vs_generate"] is not None]
    worst = min(known) if len(known) == len(ours) else None
    bf16 = [v for v in ours.values() if v["dtype"] == "bf16"]
    parity = [v for k, v in part["parity"].items() if main_system in k]

    def verdict(ok: bool, shown: list[str]) -> str:
        return f"{'met' if ok else 'not met'} ({', '.join(shown)})"

    shares = [f"{100 * p['share']:.1f}%" for p in parity]
    lines += ["", f"Targets for {main_system}: ≥ 1.0× generate everywhere: "
              f"{verdict(worst is not None and worst >= 1, [f'lowest {times(worst)}'])}; bf16 ≥ 3× generate: "
              f"{verdict(all((v['vs_generate'] or 0) >= 3 for v in bf16), [times(v['vs_generate']) for v in bf16])}; "
              f"bf16 ≥ 1.8× its fp32: "
              f"{verdict(all((v['vs_own_fp32'] or 0) >= 1.8 for v in bf16), [times(v['vs_own_fp32']) for v in bf16])}; "
              f"fp32 parity ≥ 99%: {verdict(bool(parity) and all(p['target_met'] for p in parity), shares)}."]
    return "\n".join(lines + failed_lines(part))


# ---------------------------------------------------------------- training: distill and quantize

def training_file(args, tokenizer, work: Path, count: int) -> Path:
    """`count` pairs of exactly --max-source-length and --max-target-length tokens: consecutive sample documents
    (summaries) joined until they are longer than that, so truncation cuts every one to the same length."""
    from modelshrink.training.seq2seq import tokenize_pairs

    rows = [json.loads(line) for line in args.data.read_text().splitlines()]
    sizes = {key: [len(x) for x in tokenizer([r[key] for r in rows], add_special_tokens=False)["input_ids"]]
             for key in ("document", "summary")}

    def joined(key: str, start: int, need: int) -> str:
        parts, have, i = [], 0, start
        while have <= need:
            parts.append(rows[i % len(rows)][key])
            have += sizes[key][i % len(rows)]
            i += 1
        return "\n".join(parts)

    pairs = [{"id": f"pair-{i}", "document": joined("document", 7 * i, args.max_source_length),
              "summary": joined("summary", 11 * i, args.max_target_length)} for i in range(count)]
    tokenized = tokenize_pairs([SimpleNamespace(document=p["document"], reference=p["summary"]) for p in pairs],
                               tokenizer, args.max_source_length, args.max_target_length)
    lengths = {(len(t["input_ids"]), len(t["labels"])) for t in tokenized}
    if lengths != {(args.max_source_length, args.max_target_length)}:
        sys.exit(f"training pairs came out at lengths {sorted(lengths)[:5]}, expected one shape "
                 f"({args.max_source_length}, {args.max_target_length})")
    path = work / "pairs.jsonl"
    path.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs))
    return path


def common_training(args, batch: int) -> dict:
    return dict(max_steps=args.warmup_steps + args.steps, batch_size=batch, max_source_length=args.max_source_length,
                max_target_length=args.max_target_length, lr=args.lr, log_every=1, device=args.device, seed=0)


def from_train_log(path: Path, args) -> dict:
    log = [json.loads(line) for line in (path / "train_log.jsonl").read_text().splitlines()]
    steps = [e for e in log if "tokens" in e]
    timed = [e for e in steps if e["step"] > args.warmup_steps]
    return {"tokens": sum(e["tokens"] for e in timed), "seconds": sum(e["seconds"] for e in timed),
            "warmup_seconds": sum(e["seconds"] for e in steps if e["step"] <= args.warmup_steps),
            "step_seconds": [e["seconds"] for e in steps], "tokens_per_step": timed[0]["tokens"] if timed else 0}


def modelshrink_train(step: str, options, out: Path, args) -> dict:
    from modelshrink.steps.distill import distill
    from modelshrink.steps.quantize import quantize

    baseline = fresh_peak(args.device)
    path = (distill if step == "distill" else quantize)(options, out, log=lambda message: say(f"  {step}: {message}"))
    peak = peak_since(args.device, baseline)
    got = from_train_log(path, args)
    shutil.rmtree(path)
    return {**got, "peak": peak}


def plain_batches(model_dir: Path, pairs: Path, batch: int, args) -> tuple[list[list[dict]], object]:
    """The batches `distill` trains on (its tokenizing and batch plan: examples per step) and its collate, which
    the plain loop calls inside its steps as distill does."""
    from transformers import AutoTokenizer

    from modelshrink.training.seq2seq import make_collate, tokenize_pairs
    from modelshrink.training.batches import make_batches

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = [json.loads(line) for line in pairs.read_text().splitlines()]
    tokenized = tokenize_pairs([SimpleNamespace(document=r["document"], reference=r["summary"]) for r in rows],
                               tokenizer, args.max_source_length, args.max_target_length)
    plan = make_batches([t["length"] for t in tokenized], SimpleNamespace(seed=0, batch_size=batch, max_tokens=None), 0)
    return [[tokenized[i] for i in indices] for indices in plan], make_collate(tokenizer.pad_token_id)


def plain_train(model_dir: Path, batches: list[list[dict]], collate, precision: str, args) -> dict:
    """What a user writes: AdamW, linear decay, label-smoothed cross-entropy, clipping, autocast for bf16."""
    import torch.nn.functional as F
    from transformers import AutoModelForSeq2SeqLM

    device = torch.device(args.device)
    baseline = fresh_peak(args.device)
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, fused=device.type == "cuda")
    total = args.warmup_steps + args.steps
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: (total - step) / total)
    seconds, tokens, losses = [], [], []
    sync(args.device)
    for step in range(total):
        started = time.perf_counter()
        batch = collate(batches[step % len(batches)])
        input_ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        labels = batch["labels"].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(input_ids=input_ids, attention_mask=mask, use_cache=False,
                           decoder_input_ids=model.prepare_decoder_input_ids_from_labels(labels=labels)).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, label_smoothing=0.1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        sync(args.device)
        seconds.append(time.perf_counter() - started)
        tokens.append(batch["tokens"])
    peak = peak_since(args.device, baseline)
    w = args.warmup_steps
    return {"tokens": sum(tokens[w:]), "seconds": sum(seconds[w:]), "warmup_seconds": sum(seconds[:w]),
            "step_seconds": [round(s, 4) for s in seconds], "tokens_per_step": tokens[-1], "peak": peak,
            "first_loss": losses[0]}


def step_flops(model_dir: Path, batch: dict, args) -> int:
    """FLOPs of one training step's forward and backward (the optimizer's are negligible), fp32 on the device."""
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForSeq2SeqLM

    device = torch.device(args.device)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).to(device).train()
    labels = batch["labels"].to(device)
    with FlopCounterMode(display=False) as counter:
        logits = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                       decoder_input_ids=model.prepare_decoder_input_ids_from_labels(labels=labels),
                       use_cache=False).logits
        F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), label_smoothing=0.1).backward()
    del model, logits
    fresh_peak(args.device)
    return counter.get_total_flops()


def interleaved(part: dict, settings: dict, args, results: Results, what: str) -> None:
    """Run every training setting --rounds times, interleaved; record tokens/s and peaks into `part`."""
    names = list(settings)
    for name in names:
        part["settings"][name] = {"rounds": [], "peaks": [], "warmup_seconds": None, "step_seconds": [],
                                  "tokens_per_s": None, "errors": []}
    for r in range(args.rounds):
        for name in rounds_order(names, r):
            entry = part["settings"][name]
            got = attempt(what, f"round {r + 1}", name, lambda: settings[name](r), entry, results)
            if got is None:
                continue
            rate = got["tokens"] / got["seconds"]
            entry["rounds"].append(round(rate, 1))
            entry["peaks"].append(got["peak"])
            entry["step_seconds"].append(got["step_seconds"])
            entry["tokens_per_step"] = got["tokens_per_step"]
            entry["tokens_per_s"] = round(median_of(entry["rounds"]), 1)
            if entry["warmup_seconds"] is None:
                entry["warmup_seconds"] = round(got["warmup_seconds"], 3)
            if "first_loss" in got:
                entry["first_loss"] = got["first_loss"]
            say(f"{what} round {r + 1} {name}: {rate:,.0f} tokens/s ({got['tokens_per_step']:,} tokens a step, "
                f"timed steps {got['seconds']:.2f} s, untimed {got['warmup_seconds']:.2f} s)"
                + (f", peak {gib(got['peak'])}" if got["peak"] is not None else ""))
            results.save()


def distill_part(args, model: Path, pairs: Path, work: Path, results: Results) -> str:
    from modelshrink.options.distill import DistillOptions

    batches, collate = plain_batches(model, pairs, args.train_batch, args)
    first = collate(batches[0])
    part = results["distill"] = {"pairs_a_step": args.train_batch, "steps": args.steps,
                                 "warmup_steps": args.warmup_steps, "settings": {}, "errors": []}
    settings = {}
    for precision in ("fp32", "bf16"):
        options = DistillOptions(data=str(pairs), student=str(model), precision=precision,
                                 **common_training(args, args.train_batch))
        settings[f"{precision} · modelshrink distill"] = (
            lambda r, o=options, p=precision: modelshrink_train("distill", o, work / f"distill-{p}-{r}", args))
        settings[f"{precision} · plain PyTorch loop"] = (
            lambda r, p=precision: plain_train(model, batches, collate, p, args))
    if not (args.no_compile or args.tiny):  # compiled by inductor: minutes on a CPU
        options = DistillOptions(data=str(pairs), student=str(model), precision="bf16", compile=True,
                                 **common_training(args, args.train_batch))
        settings["bf16 · modelshrink distill --compile"] = (
            lambda r, o=options: modelshrink_train("distill", o, work / f"distill-bf16-compile-{r}", args))
    started = time.perf_counter()
    interleaved(part, settings, args, results, "distill")
    say("distill: counting one step's FLOPs")
    flops = attempt("distill", "FLOP count", "fp32 step", lambda: step_flops(model, first, args), part, results)
    part["seconds"] = round(time.perf_counter() - started, 1)
    per_token = flops / first["tokens"] if flops else None
    peaks = peak_tflops(args.device)
    part.update(flops_per_step=flops, flops_per_token=round(per_token) if per_token else None, peak_table=peaks)
    tf32 = torch.get_float32_matmul_precision() != "highest"
    for name, entry in part["settings"].items():
        precision = name.split(" · ")[0]
        entry["vs_plain"] = ratio(entry["tokens_per_s"],
                                  part["settings"][f"{precision} · plain PyTorch loop"]["tokens_per_s"])
        entry["tflops"] = round(per_token * entry["tokens_per_s"] / 1e12, 2) if per_token and entry["tokens_per_s"] \
            else None
        if peaks is not None and entry["tflops"] is not None:
            peak, which = ((peaks[1], "bf16 dense") if precision == "bf16" else
                           (peaks[2], "TF32 dense") if tf32 else (peaks[3], "fp32, no tensor cores"))
            entry["mfu"] = round(entry["tflops"] / peak, 4)
            entry["mfu_peak"] = f"{peak:g} TFLOP/s ({peaks[0]} {which})"
    results.save()

    counted = (f"FlopCounterMode counts {flops / 1e12:.3g} TFLOP in one step's forward and backward "
               f"({first['tokens']:,} tokens)" if flops else "the FLOP count failed")
    if peaks is not None:
        mfu_note = (f"MFU: {counted}, × steps/s, over the dense peak of the {peaks[0]} from NVIDIA's datasheet: bf16 "
                    f"{peaks[1]:g} TFLOP/s; fp32 against {peaks[3]:g} (no tensor cores) while TF32 is off, "
                    f"{peaks[2]:g} (TF32) when on (here: {'on' if tf32 else 'off'}).")
    else:
        mfu_note = f"MFU: n/a (no peak known for this device); {counted}."
    lines = [
        f"Model: {args.described}. {args.train_batch} pairs a step of exactly {args.max_source_length} + "
        f"{args.max_target_length} tokens ({first['tokens']:,} tokens, one shape, no padding) made from the "
        f"sample; label-smoothed (0.1) cross-entropy, AdamW lr {args.lr}, clipping 1.0, linear decay; the plain loop "
        f"runs on distill's own batches, bf16 under `torch.autocast`. Each run: "
        f"{plural(args.warmup_steps, 'untimed step')}, then {args.steps} timed; "
        f"{plural(args.rounds, 'interleaved round')}, median. {mfu_note} Machine: {args.machine}. "
        f"Command: `{command_line()}` ({time.strftime('%Y-%m-%d')}; this part {part['seconds']:.0f} s).",
        "",
        "| precision | system | tokens/s | vs plain loop | TFLOP/s | MFU | peak GPU memory | "
        "untimed steps, first run | every round |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in part["settings"].items():
        precision, system = name.split(" · ")
        mfu = f"{100 * e['mfu']:.1f}% of {e['mfu_peak']}" if "mfu" in e else "n/a"
        tflops = f"{e['tflops']:.1f}" if e["tflops"] is not None else "n/a"
        lines.append(f"| {precision} | {system} | {training_cells(e, times(e['vs_plain']), tflops, mfu)} |")
    ours = part["settings"]["bf16 · modelshrink distill"]
    fp32 = part["settings"]["fp32 · modelshrink distill"]
    mfu = f"{100 * ours['mfu']:.1f}%" if "mfu" in ours else "n/a"
    lines += ["", f"Targets: bf16 ≥ 15% MFU: {'met' if ours.get('mfu', 0) >= 0.15 else 'not met'} ({mfu}); "
              f"fp32 ≥ 1.0× the plain loop: {'met' if (fp32['vs_plain'] or 0) >= 1 else 'not met'} "
              f"({times(fp32['vs_plain'])})."]
    return "\n".join(lines + failed_lines(part))


def training_cells(e: dict, *middle: str) -> str:
    """tokens/s, the columns between, peak memory, the first run's untimed steps, every round."""
    peaks = [p for p in e["peaks"] if p is not None]
    rate = f"{e['tokens_per_s']:,.0f}" if e["tokens_per_s"] else "failed"
    warm = f"{e['warmup_seconds']:.2f} s" if e["warmup_seconds"] is not None else "n/a"
    return " | ".join([rate, *middle, gib(max(peaks) if peaks else None), warm,
                       ", ".join(f"{x:,.0f}" for x in e["rounds"])])


def failed_lines(part: dict) -> list[str]:
    found = failures(part)
    return ["", "Failed (see the run's stderr): " + "; ".join(found) + "."] if found else []


def quantize_part(args, model: Path, pairs: Path, work: Path, results: Results) -> str:
    from modelshrink.options.distill import DistillOptions
    from modelshrink.options.quantize import QuantizeOptions

    common = common_training(args, args.quantize_batch)
    part = results["quantize"] = {"pairs_a_step": args.quantize_batch, "steps": args.steps,
                                  "warmup_steps": args.warmup_steps, "settings": {}}
    # quantize's losses (options/quantize.py: MSE on logits, hidden states and attention, weight 1 each, label
    # smoothing 0), the model teaching itself, as distill options
    kd = DistillOptions(data=str(pairs), teacher=str(model), student=str(model), kd_logits="mse", kd_hidden=1.0,
                        kd_attention=1.0, label_smoothing=0.0, precision="bf16", **common)
    settings = {"bf16 · distill, same KD losses": lambda r: modelshrink_train("distill", kd, work / f"kd-{r}", args)}
    for bits in ("8-8-8", "2-2-8"):
        options = QuantizeOptions(model=str(model), bits=bits, method="distill", data=str(pairs), precision="bf16",
                                  **common)
        settings[f"bf16 · quantize {bits}"] = (
            lambda r, o=options, b=bits: modelshrink_train("quantize", o, work / f"quantize-{b}-{r}", args))
    if not (args.no_compile or args.tiny):  # compiled by inductor: minutes on a CPU
        options = QuantizeOptions(model=str(model), bits="2-2-8", method="distill", data=str(pairs),
                                  precision="bf16", compile=True, **common)
        settings["bf16 · quantize 2-2-8 --compile"] = (
            lambda r, o=options: modelshrink_train("quantize", o, work / f"quantize-compile-{r}", args))
    started = time.perf_counter()
    interleaved(part, settings, args, results, "quantize")
    part["seconds"] = round(time.perf_counter() - started, 1)
    base = part["settings"]["bf16 · distill, same KD losses"]["tokens_per_s"]
    for entry in part["settings"].values():
        entry["vs_distill_kd"] = ratio(entry["tokens_per_s"], base)
    results.save()

    lines = [
        f"Model: {args.described}, teaching itself. {args.quantize_batch} pairs a step of exactly "
        f"{args.max_source_length} + {args.max_target_length} tokens; losses as `quantize` trains: cross-entropy "
        f"(no smoothing) + MSE on logits, hidden states and attention (weights 1); bf16, AdamW lr {args.lr}. Each "
        f"run: {plural(args.warmup_steps, 'untimed step')}, then {args.steps} timed; "
        f"{plural(args.rounds, 'interleaved round')}, median. "
        f"Machine: {args.machine}. Command: `{command_line()}` ({time.strftime('%Y-%m-%d')}; this part "
        f"{part['seconds']:.0f} s).",
        "",
        "| setting | tokens/s | vs distill, same KD losses | peak GPU memory | untimed steps, first run | "
        "every round |",
        "|---|---|---|---|---|---|",
    ]
    for name, e in part["settings"].items():
        lines.append(f"| {name.split(' · ')[1]} | {training_cells(e, times(e['vs_distill_kd']))} |")
    ratios = [e["vs_distill_kd"] for name, e in part["settings"].items() if "quantize" in name]
    met = all(x is not None and x >= 0.85 for x in ratios)
    lines += ["", f"Target ≥ 0.85× distill with the same KD losses: {'met' if met else 'not met'} "
              f"({', '.join(times(x) for x in ratios)})."]
    return "\n".join(lines + failed_lines(part))


# ---------------------------------------------------------------- the run

def publish_from(path: Path) -> None:
    """The tables a run (on another machine, say) left in its --json, into BENCHMARKS.md; a tiny run's or a part
    with failures is refused."""
    from _report import write_section

    if not path.is_file():
        sys.exit(f"Error: --publish {path}: no such file")
    got = json.loads(path.read_text())
    if got.get("tiny"):
        sys.exit(f"Error: {path} is a --tiny run: a check of the code path, not a measurement to publish")
    tables = got.get("tables", {})
    if not tables:
        sys.exit(f"Error: {path} holds no finished table")
    for name, table in tables.items():
        if table["failures"]:
            say(f"{name}: {table['failures']} failures in that run; not written")
            continue
        write_section(table["section"], table["title"], table["text"], table["intro"])
        say(f"{name}: written to BENCHMARKS.md")


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (with --tiny)")
    parser.add_argument("--quick", action="store_true", help="a smaller run for one device call of at most 8 "
                        "minutes: 200 documents at --max-tokens 16384, one round, 1 + 2 training steps, no compile")
    parser.add_argument("--tiny", action="store_true", help="a tiny BART, a few documents and steps: the code path on "
                                                            "a CPU; writes BENCHMARKS.md only with --write")
    parser.add_argument("--only", default=",".join(PARTS), help=f"comma-separated parts of {', '.join(PARTS)}")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds, median [default: 2, 1 tiny]")
    parser.add_argument("--docs", type=int, default=None, help="pseudolabel documents [default: 600, 8 tiny]")
    parser.add_argument("--max-tokens", default=None,
                        help="pseudolabel token budgets, comma-separated [default: 16384,65536; 128,512 tiny]")
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--length", type=int, default=None, help="tokens per summary [default: 64, 8 tiny]")
    parser.add_argument("--max-source-length", type=int, default=None, help="[default: 256, 64 tiny]")
    parser.add_argument("--max-target-length", type=int, default=None, help="training targets [default: 64, 8 tiny]")
    parser.add_argument("--train-batch", type=int, default=None,
                        help="distill pairs a step [default: 205 = 65,600 tokens; 4 tiny]")
    parser.add_argument("--quantize-batch", type=int, default=None,
                        help="quantize and its distill baseline: pairs a step [default: 102; 4 tiny]")
    parser.add_argument("--steps", type=int, default=None, help="timed training steps a run [default: 3, 2 tiny]")
    parser.add_argument("--warmup-steps", type=int, default=None, help="untimed steps before them [default: 2, 1 tiny]")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--no-compile", action="store_true", help="leave out distill and quantize 2-2-8 in bf16 "
                        "with --compile (torch.compile of the forward and loss; its compilation is timed apart, in the "
                        "untimed steps) [default: with it on a GPU, without it with --tiny]")
    parser.add_argument("--json", default=None, help="write every result here (rewritten after each measurement)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    parser.add_argument("--write", action="store_true", help="with --tiny: write BENCHMARKS.md all the same")
    parser.add_argument("--publish", metavar="JSON", default=None,
                        help="run nothing: write the tables of a finished run's --json into BENCHMARKS.md")
    return parser


def missing_packages(parts: list[str]) -> list[str]:
    """The packages `parts` import that this Python lacks: those declared in REQUIRES, then whatever the steps'
    own modules fail to import."""
    import importlib
    import importlib.util

    missing = {name for part in parts for name in REQUIRES[part] if importlib.util.find_spec(name) is None}
    for part in parts:
        if not missing:
            try:
                importlib.import_module(STEP_MODULES[part])
            except ModuleNotFoundError as error:
                missing.add(error.name or str(error))
    return sorted(missing)


# --quick: one device call of at most 8 minutes, start-up and the model's build included, compilation left out
QUICK = dict(rounds=1, docs=200, max_tokens="16384", steps=2, warmup_steps=1)


def main() -> None:
    parser = arguments()
    args = parser.parse_args()
    if args.publish:
        return publish_from(Path(args.publish))
    tiny = args.tiny
    if args.quick:
        if tiny:
            parser.error("--quick and --tiny are two sizes: give one")
        args.no_compile = True
        for key, value in QUICK.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
    defaults = dict(rounds=1 if tiny else 2, docs=8 if tiny else 600, max_tokens="128,512" if tiny else "16384,65536",
                    length=8 if tiny else 64, max_source_length=64 if tiny else 256,
                    max_target_length=8 if tiny else 64, train_batch=4 if tiny else 205,
                    quantize_batch=4 if tiny else 102, steps=2 if tiny else 3, warmup_steps=1 if tiny else 2)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    parts = [p for p in PARTS if p in {x.strip() for x in args.only.split(",")}]  # always in this order
    if not parts or {x.strip() for x in args.only.split(",") if x.strip()} - set(PARTS):
        parser.error(f"--only takes {', '.join(PARTS)} (comma-separated), got {args.only!r}")
    try:
        args.max_tokens = [int(x) for x in args.max_tokens.split(",")]
    except ValueError:
        parser.error(f"--max-tokens takes comma-separated integers, got {args.max_tokens!r}")
    if min(args.rounds, args.docs, args.steps, args.warmup_steps, args.train_batch, args.quantize_batch) < 1:
        parser.error("--rounds, --docs, --steps, --warmup-steps, --train-batch and --quantize-batch must be ≥ 1")
    missing = missing_packages(parts)
    if missing:
        hint = ("PYTHONPATH=src, or pip install -e ." if "modelshrink" in missing
                else f"pip install {' '.join(missing)} (without a package index: carry their wheels)")
        sys.exit(f"Error: {', '.join(parts)} need{'s' if len(parts) == 1 else ''} {', '.join(missing)}, which "
                 f"this Python does not have: {hint}")
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            sys.exit("Error: --device cuda: torch sees no GPU here (add --tiny --device cpu to check the code path)")
        if not torch.cuda.is_bf16_supported():
            sys.exit(f"Error: {torch.cuda.get_device_name()} has no bf16, which every part measures")
    write = not args.no_write and (args.write or not tiny)
    if tiny and not write and not args.no_write:
        say("--tiny: results are not written to BENCHMARKS.md (add --write to write them)")

    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from modelshrink.quickstart import sample_path

    hf_logging.disable_progress_bar()
    args.data = sample_path()
    args.machine = machine(args.device)
    cuda = args.device.startswith("cuda")
    results = Results(args.json, command=command_line(), date=time.strftime("%Y-%m-%d %H:%M:%S"),
                      machine=args.machine, device=args.device, tiny=tiny, parts=parts,
                      gpu=torch.cuda.get_device_name(torch.device(args.device)) if cuda else None,
                      options={k: v for k, v in vars(args).items() if k not in ("data", "machine")})
    work, failed = Path(tempfile.mkdtemp(prefix="bench-gpu-")), 0
    try:
        say(f"building the model in {work} ({args.machine})")
        args.described = bart_model(work / "model", args)
        results["model"] = args.described
        results.save()
        model, pairs = work / "model", None
        for name in parts:
            if name == "pseudolabel":
                text = pseudolabel_part(args, model, work, results)
            else:
                if pairs is None:
                    count = max(args.train_batch if "distill" in parts else 1,
                                args.quantize_batch if "quantize" in parts else 1) * (args.warmup_steps + args.steps)
                    pairs = training_file(args, AutoTokenizer.from_pretrained(model), work, count)
                text = (distill_part if name == "distill" else quantize_part)(args, model, pairs, work, results)
            broken = failures(results[name])
            if broken and write:
                say(f"{name}: {len(broken)} failures; its table is not written to BENCHMARKS.md")
            publish(f"gpu_throughput_{name}", TITLES[name], text, write=write and not broken, intro=INTRO[name])
            results.setdefault("tables", {})[name] = {"section": f"gpu_throughput_{name}", "title": TITLES[name],
                                                      "intro": INTRO[name], "text": text, "failures": len(broken)}
            results.save()
            failed += len(broken)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["seconds"] = round(time.perf_counter() - STARTED, 1)
    results.save()
    say(f"done in {results['seconds']:.0f} s" + (f"; results in {args.json}" if args.json else ""))
    if failed:
        sys.exit(f"Error: {failed} measurements failed (their tracebacks are above)")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
