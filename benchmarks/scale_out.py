"""Scaling out `pseudolabel` on a CPU (processes against threads, bf16, a token budget), and bf16
against fp32 on a GPU for `pseudolabel` and `distill`, each side by side in one run.

    python benchmarks/scale_out.py                                   # CPU: 400 documents, 3 rounds
    python benchmarks/scale_out.py --docs 32 --rounds 1 --no-write   # a quick look
    python benchmarks/scale_out.py --no-bf16                         # without (c), which takes most of the run
    PYTHONPATH=src python benchmarks/scale_out.py --device cuda      # GPU: a BART-base-shaped model
    python benchmarks/scale_out.py --device cpu --tiny --no-write    # the GPU part's code, tiny, on a CPU

CPU part (the default). The first --docs documents of the bundled Debian sample (what the
quickstart labels), the bert2bert warm-started from the packaged MiniLM-L6 as teacher, beam 4, every
summary forced to exactly --length tokens (min_length = max_length) so that every setting does the
same decoding. Each setting is one whole `modelshrink pseudolabel` command in its own process tree,
the single process too: every setting then pays the same start-up (interpreter, imports, loading
the teacher), and the "whole command" column compares like with like. Settings, on --cores cores:

  (a) 1 process × --cores threads  (OMP_NUM_THREADS=cores);
  (b) --cores processes × 1 thread  (`accelerate launch --multi_gpu ... --device cpu`, gloo);
  (c) as (a) with `--dtype bf16` (on a CPU without bf16 instructions about 10× slower than fp32: with
      it, the default run takes about 40 minutes on 2 cores, most of it this setting);
  (d) as (a) with `--max-tokens` instead of `--batch-size`.

docs/s is the generation loop as `pseudolabel` records it in its manifest (all processes; loading
and process start-up excluded); the whole command is wall-clock from start to exit. Outputs are
compared with (a)'s: (b) must be byte-identical; bf16 changes the arithmetic and a token budget
the padding, so (c) and (d) may differ, and then the share of identical summaries is reported.

GPU part (`--device cuda`). A BART-base-shaped model built from `BartConfig` (d_model 768, 6 + 6
layers, 12 heads, FFN 3072, BART-base's 50,265-entry vocabulary) with random weights (seed 0) and
a WordPiece tokenizer built here from the sample's words (no hub, no files beyond the source tree):
  * pseudolabel docs/s, fp32 against `--dtype bf16`, batches packed by `--max-tokens`, every
    summary exactly --length tokens;
  * distill tokens/s (non-padding source + target tokens over the timed steps, after --warmup
    untimed ones) with `--precision fp32`, `bf16`, and bf16 with `--gradient-checkpointing`;
  * peak GPU memory of each run (torch.cuda.max_memory_allocated, reset before it; runs are in
    this process, one after another).
Every setting runs once untimed at full size before the rounds. fp32 matmuls run in full fp32 (torch's default, TF32 off). `--tiny` builds a small model instead and
runs a few documents and steps, to check the code path on a CPU; it never writes BENCHMARKS.md.

Settings are interleaved for --rounds rounds (the order rotated each round), so drift of the
machine falls on all of them alike; the median is reported. Targets (issue 13): (b) at least 0.9×
(a)'s docs/s with identical output; on a GPU, bf16 at least 1.8× fp32.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from _report import cpu, publish

CPU_INTRO = (
    "Target (issue 13): `pseudolabel` on 2 processes × 1 thread at least 0.9× the docs/s of 1 process × 2 "
    "threads, with byte-identical output; bf16 against fp32 on the CPU reported. docs/s is the generation loop "
    "as the manifest records it; the whole command adds interpreter start-up, imports, loading the teacher "
    "and, for several processes, the launcher and the process group.")
GPU_INTRO = (
    "Target (issue 13): bf16 at least 1.8× the throughput of fp32 on a GPU, for `pseudolabel` (docs/s, "
    "`--dtype`) and `distill` (tokens/s, `--precision`), on a model of BART-base's shape with random weights.")


def command_line() -> str:
    return " ".join(["python benchmarks/scale_out.py"] + [shlex.quote(a) for a in sys.argv[1:] if a != "--no-write"])


def native_bf16() -> str:
    """Whether the CPU has bf16 instructions; without them torch converts to fp32 and back around
    every kernel, and bf16 is several times slower than fp32."""
    from modelshrink.runtime.cpu import cpu_flags

    flags = cpu_flags()
    if not flags:
        return "bf16 instructions unknown"
    found = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return f"bf16 instructions: {', '.join(found)}" if found else "no bf16 instructions (avx512_bf16, amx_bf16)"


def rounds_order(names: list[str], r: int) -> list[str]:
    return names[r % len(names):] + names[:r % len(names)]


def same_summaries(a: Path, b: Path) -> tuple[int, int]:
    """How many rows of two data.jsonl files have the same summary, of how many."""
    rows_a = [json.loads(x)["summary"] for x in a.read_text().splitlines()]
    rows_b = [json.loads(x)["summary"] for x in b.read_text().splitlines()]
    return sum(x == y for x, y in zip(rows_a, rows_b)), max(len(rows_a), len(rows_b))


# ---------------------------------------------------------------- CPU: processes, threads, bf16

def cpu_settings(args) -> dict[str, dict]:
    n = args.cores
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(n),
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--num_cpu_threads_per_process", "1", "-m", "modelshrink"]
    single = [sys.executable, "-m", "modelshrink"]
    return {
        f"(a) 1 process × {n} threads": dict(argv=single, threads=n, processes=1, extra=[]),
        f"(b) {n} processes × 1 thread": dict(argv=launch, threads=1, processes=n, extra=[]),
        f"(c) 1 process × {n} threads, bf16": dict(argv=single, threads=n, processes=1, extra=["--dtype", "bf16"]),
        f"(d) 1 process × {n} threads, --max-tokens {args.max_tokens}": dict(
            argv=single, threads=n, processes=1, extra=["--max-tokens", str(args.max_tokens)]),
    }


def run_cli(setting: dict, teacher: Path, out: Path, docs: int, args) -> tuple[float, dict]:
    """One whole `pseudolabel` command; returns its wall-clock seconds and its manifest."""
    argv = setting["argv"] + [
        "pseudolabel", str(teacher), str(args.data), "-o", str(out), "--limit", str(docs), "--device", "cpu",
        "--num-beams", str(args.beams), "--min-length", str(args.length), "--max-length", str(args.length),
        "--batch-size", str(args.batch_size), "--max-source-length", str(args.max_source_length), *setting["extra"]]
    env = {**os.environ, "OMP_NUM_THREADS": str(setting["threads"]), "MKL_NUM_THREADS": str(setting["threads"])}
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {shlex.join(argv)}\n{done.stderr[-4000:]}")
    manifest = json.loads((out / "modelshrink.json").read_text())
    if manifest["resolved"]["processes"] != setting["processes"]:  # a launcher that fell back to one process
        sys.exit(f"{shlex.join(argv)} ran on {manifest['resolved']['processes']} processes, "
                 f"expected {setting['processes']}")
    return seconds, manifest


def cpu_part(args) -> None:
    from modelshrink.quickstart import warmstart_artifact
    from modelshrink.models.warmstart import packaged_minilm

    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    teacher = warmstart_artifact(packaged_minilm(), work / "teacher")
    settings = cpu_settings(args)
    if args.no_bf16:
        settings = {name: v for name, v in settings.items() if "--dtype" not in v["extra"]}
    names = list(settings)
    # Untimed, every setting once on one batch: the page cache then holds the teacher and the modules,
    # and a setting that cannot run stops the benchmark before the long rounds.
    for i, name in enumerate(names):
        run_cli(settings[name], teacher, work / f"warmup-{i}", min(args.docs, args.batch_size), args)
    loop: dict[str, list[float]] = {name: [] for name in names}
    wall: dict[str, list[float]] = {name: [] for name in names}
    outputs: dict[str, list[Path]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in rounds_order(names, r):
            out = work / f"r{r}-{names.index(name)}"
            seconds, manifest = run_cli(settings[name], teacher, out, args.docs, args)
            loop[name].append(manifest["metrics"]["seconds_this_run"])
            wall[name].append(seconds)
            outputs[name].append(out / "data.jsonl")
            print(f"round {r + 1} {name}: {args.docs / loop[name][-1]:.3f} docs/s in the loop, "
                  f"{seconds:.1f} s whole command", file=sys.stderr)

    base = names[0]
    reference = outputs[base][0].read_bytes()

    def against_base(name: str) -> str:
        identical = sum(p.read_bytes() == reference for p in outputs[name])
        if name == base:
            return ("reference" + (" (same in every round)" if args.rounds > 1 else "")
                    if identical == args.rounds else f"differs between rounds ({identical}/{args.rounds} same)")
        if identical == args.rounds:
            return "byte-identical" + (" (every round)" if args.rounds > 1 else "")
        differing = next(p for p in outputs[name] if p.read_bytes() != reference)
        same, total = same_summaries(outputs[base][0], differing)
        prefix = f"byte-identical in {identical}/{args.rounds} rounds, otherwise " if identical else ""
        return f"{prefix}{same}/{total} summaries identical ({100 * same / total:.1f}%)"

    base_loop, base_wall = statistics.median(loop[base]), statistics.median(wall[base])
    lines = [
        f"Teacher: bert2bert warm-started from MiniLM-L6 (49M parameters); the first {args.docs} documents of the "
        f"bundled Debian sample (`{args.data.name}`), beam {args.beams}, batch {args.batch_size} (setting d: "
        f"`--max-tokens {args.max_tokens}`), source truncated to {args.max_source_length} tokens, every summary "
        f"exactly {args.length} tokens; each setting a whole `modelshrink pseudolabel` command, (b) under "
        f"`accelerate launch --multi_gpu --num_processes {args.cores} ... --device cpu` (gloo); {args.rounds} "
        f"interleaved rounds after an untimed warm-up of each setting, median. Machine: {cpu()}, "
        f"{os.cpu_count()} cores ({native_bf16()}), torch {torch.__version__}, load average "
        f"{load_before:.2f} before the run. Command: `{command_line()}` ({time.strftime('%Y-%m-%d')}).",
        "",
        "| setting | docs/s, generation loop | vs (a) | whole command, s | docs/s with start-up | vs (a) | "
        "output against (a) | docs/s in the loop, every round |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in names:
        med_loop, med_wall = statistics.median(loop[name]), statistics.median(wall[name])
        lines.append(
            f"| {name} | {args.docs / med_loop:.3f} | {base_loop / med_loop:.3f}× | {med_wall:.1f} | "
            f"{args.docs / med_wall:.3f} | {base_wall / med_wall:.3f}× | {against_base(name)} | "
            f"{', '.join(f'{args.docs / s:.3f}' for s in loop[name])} |")
    publish("scale_out", "Scaling out pseudolabel on a CPU: processes, threads, bf16", "\n".join(lines),
            write=not args.no_write, intro=CPU_INTRO)


# ---------------------------------------------------------------- GPU: bf16 against fp32

def corpus_tokenizer(texts: list[str], vocab_size: int):
    """A BERT-style WordPiece tokenizer whose vocabulary is the corpus's words (most frequent first),
    its characters, and filler entries up to exactly `vocab_size`: made here, so the GPU machine
    needs neither the hub nor the packaged MiniLM, and the model gets BART-base's vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    normalizer, splitter = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    counts = Counter(w for t in texts for w, _ in splitter.pre_tokenize_str(normalizer.normalize_str(t)))
    chars = sorted({c for w in counts for c in w})
    words = [w for w, _ in counts.most_common() if len(w) > 1]
    vocab = (specials + chars + ["##" + c for c in chars] + words)[:vocab_size]
    vocab += [f"[unused{i}]" for i in range(vocab_size - len(vocab))]
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer, tok.decoder = normalizer, splitter, decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]", model_max_length=1024)


def bart_model(folder: Path, args) -> str:
    """A BART-base-shaped model (or a tiny one) with random weights, saved with its tokenizer; returns
    a description for the table."""
    from transformers import BartConfig, BartForConditionalGeneration, GenerationConfig

    if args.tiny:
        shape = dict(vocab_size=2000, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128)
    else:  # facebook/bart-base
        shape = dict(vocab_size=50265, d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12,
                     decoder_attention_heads=12, encoder_ffn_dim=3072, decoder_ffn_dim=3072)
    texts = [json.loads(x)["document"] for x in args.data.read_text().splitlines()]
    tokenizer = corpus_tokenizer(texts, shape["vocab_size"])
    config = BartConfig(**shape, max_position_embeddings=1024, pad_token_id=0, bos_token_id=2, eos_token_id=3,
                        decoder_start_token_id=2, forced_bos_token_id=None, forced_eos_token_id=None)
    torch.manual_seed(0)
    model = BartForConditionalGeneration(config)
    # Every summary exactly --length tokens, whatever the random weights prefer.
    model.generation_config = GenerationConfig(
        num_beams=args.beams, min_length=args.length, max_length=args.length, no_repeat_ngram_size=0,
        early_stopping=True, pad_token_id=0, bos_token_id=2, eos_token_id=3, decoder_start_token_id=2)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    layers = f"{shape['encoder_layers']} + {shape['decoder_layers']} layers, d_model {shape['d_model']}"
    return (f"{'tiny BART' if args.tiny else 'BART-base shape'} ({layers}, vocabulary {shape['vocab_size']:,}, "
            f"{params / 1e6:.1f}M parameters, random weights)")


def fresh_peak(device: str) -> float:
    """Free what earlier runs left and reset the peak counter; returns the bytes still allocated."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    return 0.0


def peak_since(device: str, baseline: float) -> float | None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - baseline
    return None


def gpu_pseudolabel(model: Path, out: Path, docs: int, dtype: str, args) -> tuple[float, float | None]:
    """docs/s of the generation loop and the run's peak GPU memory."""
    from modelshrink.steps.pseudolabel import PseudolabelOptions, pseudolabel

    baseline = fresh_peak(args.device)
    options = PseudolabelOptions(teacher=str(model), data=str(args.data), limit=docs, num_beams=args.beams,
                                 min_length=args.length, max_length=args.length, max_tokens=args.max_tokens,
                                 max_source_length=args.max_source_length, device=args.device, dtype=dtype)
    path = pseudolabel(options, out)
    peak = peak_since(args.device, baseline)
    return docs / json.loads((path / "modelshrink.json").read_text())["metrics"]["seconds_this_run"], peak


def gpu_distill(model: Path, out: Path, precision: str, checkpointing: bool, args) -> tuple[float, float | None]:
    """tokens/s over the timed steps and the run's peak GPU memory."""
    from modelshrink.steps.distill import DistillOptions, distill

    baseline = fresh_peak(args.device)
    options = DistillOptions(data=str(args.data), student=str(model), max_steps=args.warmup + args.steps,
                             batch_size=args.train_batch_size, max_source_length=args.max_source_length,
                             max_target_length=args.max_target_length, lr=1e-4, log_every=1, device=args.device,
                             seed=0, precision=precision, gradient_checkpointing=checkpointing)
    path = distill(options, out)
    peak = peak_since(args.device, baseline)
    log = [json.loads(x) for x in (path / "train_log.jsonl").read_text().splitlines()]
    timed = [e for e in log if "tokens" in e and e["step"] > args.warmup]
    return sum(e["tokens"] for e in timed) / sum(e["seconds"] for e in timed), peak


def gpu_part(args) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-scale-gpu-"))
    described = bart_model(work / "model", args)
    model = work / "model"
    settings = {
        "pseudolabel fp32": lambda out, docs: gpu_pseudolabel(model, out, docs, "fp32", args),
        "pseudolabel bf16 (`--dtype bf16`)": lambda out, docs: gpu_pseudolabel(model, out, docs, "bf16", args),
        "distill fp32": lambda out, docs: gpu_distill(model, out, "fp32", False, args),
        "distill bf16 (`--precision bf16`)": lambda out, docs: gpu_distill(model, out, "bf16", False, args),
        "distill bf16 + `--gradient-checkpointing`": lambda out, docs: gpu_distill(model, out, "bf16", True, args),
    }
    names = list(settings)
    # Untimed: one whole pass of every setting. The first use of a dtype's kernels at each new shape pays for
    # loading and selecting them; on an H200 a 32-document warm-up and distill's 5 untimed steps left round 1
    # of every bf16 setting 3-5x slower than rounds 2 and 3 (2026-11-26).
    for i, name in enumerate(names):
        settings[name](work / f"warmup-{i}", args.docs)
    rates: dict[str, list[float]] = {name: [] for name in names}
    peaks: dict[str, list[float | None]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in rounds_order(names, r):
            rate, peak = settings[name](work / f"r{r}-{names.index(name)}", args.docs)
            rates[name].append(rate)
            peaks[name].append(peak)
            unit = "docs/s" if name.startswith("pseudolabel") else "tokens/s"
            print(f"round {r + 1} {name}: {rate:.1f} {unit}" +
                  (f", peak {peak / 2**30:.2f} GiB" if peak is not None else ""), file=sys.stderr)

    if args.device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(args.device))
        machine = (f"{props.name} ({props.total_memory / 2**30:.0f} GiB), CUDA {torch.version.cuda}, torch "
                   f"{torch.__version__}, fp32 matmul precision '{torch.get_float32_matmul_precision()}'")
    else:
        machine = (f"{cpu()}, {torch.get_num_threads()} threads, torch {torch.__version__} "
                   "(no GPU: a check of the code path, not a measurement)")
    lines = [
        f"Model: {described}, WordPiece tokenizer from the sample's words. pseudolabel: the first {args.docs} "
        f"documents of the bundled Debian sample (`{args.data.name}`), beam {args.beams}, `--max-tokens "
        f"{args.max_tokens}`, sources ≤ {args.max_source_length} tokens, every summary exactly {args.length} tokens. "
        f"distill: the same sample, batch {args.train_batch_size}, sources ≤ {args.max_source_length}, summaries ≤ "
        f"{args.max_target_length}, {args.steps} timed steps after {args.warmup} untimed. An untimed pass of every setting, then "
        f"{args.rounds} interleaved rounds, median; peak memory is torch.cuda.max_memory_allocated over the run. Machine: {machine}. "
        f"Command: `{command_line()}` ({time.strftime('%Y-%m-%d')}).",
        "",
        "| setting | throughput (median) | vs fp32 | peak GPU memory | every round |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        kind = name.split()[0]
        unit = "docs/s" if kind == "pseudolabel" else "tokens/s"
        base = statistics.median(rates[f"{kind} fp32"])
        med = statistics.median(rates[name])
        known = [p for p in peaks[name] if p is not None]
        peak = f"{max(known) / 2**30:.2f} GiB" if known else "n/a (CPU)"
        lines.append(f"| {name} | {med:.1f} {unit} | {med / base:.2f}× | {peak} | "
                     f"{', '.join(f'{x:.1f}' for x in rates[name])} |")
    publish("scale_out_gpu", "bf16 against fp32 on a GPU: pseudolabel and distill", "\n".join(lines),
            write=not (args.no_write or args.tiny), intro=GPU_INTRO)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu: the processes/threads part; cuda (or --tiny): "
                                                        "the bf16 part")
    parser.add_argument("--tiny", action="store_true", help="the bf16 part on a tiny model, a few documents and "
                                                            "steps (to test it on a CPU); never writes")
    parser.add_argument("--docs", type=int, default=None, help="[default: 400 on the CPU, 2000 on a GPU, 16 tiny]")
    parser.add_argument("--rounds", type=int, default=None, help="[default: 3, 1 with --tiny]")
    parser.add_argument("--cores", type=int, default=2, help="CPU part: 1 process × N threads against N × 1")
    parser.add_argument("--length", type=int, default=None, help="tokens per summary [default: 24 CPU, 64 GPU]")
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16, help="CPU part: documents per batch")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="padded source tokens per pseudolabel batch [default: 2048 CPU, 16384 GPU]")
    parser.add_argument("--max-source-length", type=int, default=256)
    parser.add_argument("--train-batch-size", type=int, default=None, help="distill batch [default: 64, 8 tiny]")
    parser.add_argument("--max-target-length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=None, help="timed distill steps [default: 30, 3 tiny]")
    parser.add_argument("--warmup", type=int, default=None, help="untimed distill steps [default: 5, 1 tiny]")
    parser.add_argument("--no-bf16", action="store_true", help="CPU part: leave out setting (c); on a CPU without "
                                                               "bf16 instructions it is ~10× slower than fp32 and "
                                                               "takes most of the run")
    parser.add_argument("--no-write", action="store_true", help="print only; leave BENCHMARKS.md alone")
    args = parser.parse_args()
    from modelshrink.quickstart import sample_path

    args.data = sample_path()
    bf16_part = args.tiny or args.device.startswith("cuda")
    tiny = args.tiny
    defaults = dict(docs=16 if tiny else 2000 if bf16_part else 400, rounds=1 if tiny else 3,
                    length=8 if tiny else 64 if bf16_part else 24, max_tokens=2048 if tiny or not bf16_part else 16384,
                    train_batch_size=8 if tiny else 64, steps=3 if tiny else 30, warmup=1 if tiny else 5)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no GPU here (run the CPU part without --device, or add --tiny)")
    if args.tiny and not args.no_write:
        print("--tiny: results are not written to BENCHMARKS.md", file=sys.stderr)
    (gpu_part if bf16_part else cpu_part)(args)


if __name__ == "__main__":
    main()
