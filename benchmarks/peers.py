"""modelshrink's runtime beside PyTorch, CTranslate2 and Optimum's ORTModel on one BART-base-shaped model.

    python benchmarks/peers.py --docs 100 --rounds 3

The model: a BartForConditionalGeneration of BART-base's shape (6+6 layers, d 768, 12 heads, FFN 3072) and
vocabulary size (50,265: a byte-level BPE trained here on the Debian documents), random weights from a fixed
seed. Every system gets the same documents (the Debian validation split of ../shared/data, else the bundled
sample), beam 4 and outputs forced to --length tokens (minimum length = maximum length, EOS never allowed),
so all of them do the same work; 2 intra-op threads, 1 inter-op thread each. Systems (--systems):
  torch      PyTorch eager, float32 (`model.generate`)
  fp32 int8 int4   `modelshrink export` (plain, --int8, --int4), run by `modelshrink.runtime.load`; --int8 and
                   --int4 take the integer kernel measured fastest on this machine for each weight
  int8-u8          --int8 --kernel int8: every matmul on onnxruntime's uint8 kernel (what --int8 wrote before
                   it measured its kernels)
  int8-nbits       --int8 --kernel nbits: every matmul on MatMulNBits at 8 bits (what --int8 chose on an AVX-512
                   VNNI machine before it weighed the s8 kernel)
  int8-traced      --int8 with --self-attention traced: the cache copied at every step instead of written in place,
                   the cross-attention over the batch's longest source (not in the default systems)
  ct2-fp32 ct2-int8   CTranslate2 (pip install ctranslate2, or modelshrink[bench]), compute type float32 / int8
  optimum    Optimum's ORTModelForSeq2SeqLM, only when MODELSHRINK_OPTIMUM_PYTHON names a Python with
             optimum-onnx (it needs transformers 4, which cannot sit beside ours): a server in that interpreter
Measured: batch-1 latency p50 and p90 (every document through every system in turn, the order rotating),
batch-16 docs/s (--rounds interleaved passes, median), files on disk, generated tokens equal to PyTorch's,
and the export time of `modelshrink export` against Optimum's exporter (both with their validation, timed
around the library call in a warm interpreter). Tokenization is inside every timing; detokenization in none.
Targets (issue 15): --int4 <= 0.2x float32 on disk; runtime int8 at batch 16 >= 1.0x CTranslate2 int8,
keeping the batch-1 lead; export within 2x of Optimum's export time.
--student PATH adds a table for a trained bert2bert (our systems only: CTranslate2 has no converter for
EncoderDecoderModel; the run checks that again). --small: a tiny shape, for a smoke run.
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

from _peer_systems import OptimumServer, ct2_system, optimum_export, runtime_system, torch_system
from _report import cpu, publish

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "debian-descriptions"
SYSTEMS = ["torch", "fp32", "int8", "int8-u8", "int8-nbits", "int4", "ct2-fp32", "ct2-int8", "optimum"]
EXPORTS = {"fp32": (None, {}), "int8": ("int8", {}), "int8-u8": ("int8", {"kernel": "int8"}),
           "int8-nbits": ("int8", {"kernel": "nbits"}),
           "int8-traced": ("int8", {"self_attention": "traced"}), "int4": ("int4", {})}
LABELS = {"torch": "PyTorch eager fp32", "fp32": "modelshrink runtime fp32", "int8": "modelshrink runtime int8",
          "int8-traced": "modelshrink runtime int8, attention traced",
          "int8-u8": "modelshrink runtime int8, uint8 kernel",
          "int8-nbits": "modelshrink runtime int8, MatMulNBits",
          "int4": "modelshrink runtime int4", "ct2-fp32": "CTranslate2 fp32", "ct2-int8": "CTranslate2 int8",
          "optimum": "Optimum ORTModelForSeq2SeqLM fp32"}
BASE = dict(d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12, decoder_attention_heads=12,
            encoder_ffn_dim=3072, decoder_ffn_dim=3072, max_position_embeddings=1024, vocab_size=50265)
SMALL = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
             encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=256, vocab_size=1000)


def read_documents(split: str, limit: int | None = None, bundled: bool = False) -> list[str]:
    import gzip

    path = SHARED / f"{split}.jsonl.gz"
    if bundled or not path.is_file():
        path = ROOT / "src" / "modelshrink" / "samples" / "debian" / f"{split}.jsonl"
    docs = []
    with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
        for line in f:
            docs.append(json.loads(line)["document"])
            if len(docs) == limit:
                break
    return docs


def build_model(folder: Path, shape: dict, seed: int, beams: int = 4) -> None:
    """A random BART of `shape` with a byte-level BPE of exactly its vocabulary size, saved with save_pretrained;
    its generation config searches `beams` beams, as a summarizer's does (facebook/bart-large-cnn: 4), which is
    what `export` fuses the cross-attention for (modelshrink.onnx.cross_attention)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import BartConfig, BartForConditionalGeneration, PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>"]  # BART's ids 0-3; <mask> is the last id, as in BART's vocabulary
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(read_documents("train", bundled=shape is SMALL), trainers.BpeTrainer(
        vocab_size=shape["vocab_size"] - 1, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    filler = shape["vocab_size"] - 1 - bpe.get_vocab_size()  # a small corpus runs out of merges first
    bpe.add_tokens([f"<unused{i}>" for i in range(filler)])
    bpe.add_special_tokens(["<mask>"])
    bpe.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        unk_token="<unk>", mask_token="<mask>",
                                        model_max_length=shape["max_position_embeddings"])
    assert len(tokenizer) == shape["vocab_size"], len(tokenizer)
    torch.manual_seed(seed)
    # normalize_before etc. are keys of facebook/bart-base's config.json that transformers 5 no longer sets by
    # default; CTranslate2's converter reads them, as it would from the real checkpoint
    config = BartConfig(**shape, bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2,
                        forced_eos_token_id=None, normalize_before=False, normalize_embedding=True,
                        add_final_layer_norm=False)
    model = BartForConditionalGeneration(config).eval()
    model.generation_config.num_beams = beams
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def timed_export(model: Path, folder: Path, flag: str | None, data: Path, **more) -> dict:
    """`modelshrink export` (with its validation) into `folder`: seconds in all and in validation."""
    from modelshrink.steps.export import export_model
    from modelshrink.options.export import ExportOptions

    stamps: list[tuple[float, str]] = []
    start = time.perf_counter()
    options = ExportOptions(model=str(model), data=str(data), **({flag: True} if flag else {}), **more)
    _, report = export_model(options, folder, overwrite=True, log=lambda m: stamps.append((time.perf_counter(), m)))
    total = time.perf_counter() - start
    began = next((t for t, m in stamps if m.startswith("validating")), None)
    return {"seconds": total, "validation_seconds": None if began is None else total - (began - start),
            "check": report.get("validation", {}).get("failure") or "passed"}


def ct2_error(model: Path) -> str:
    """What CTranslate2's converter says about `model` (a bert2bert): its first line, or 'converted'."""
    from ctranslate2.converters import TransformersConverter

    try:
        TransformersConverter(str(model)).convert(tempfile.mkdtemp(prefix="ct2-check-"), force=True)
    except Exception as e:  # the converter raises ValueError for an unregistered config, others for the rest
        return str(e).splitlines()[0].split(" (supported configurations")[0]
    return "converted"


def tiny_bert2bert(folder: Path) -> Path:
    from transformers import BertConfig, EncoderDecoderConfig, EncoderDecoderModel

    common = dict(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    config = EncoderDecoderConfig.from_encoder_decoder_configs(
        BertConfig(**common), BertConfig(**common, is_decoder=True, add_cross_attention=True))
    EncoderDecoderModel(config).save_pretrained(folder)
    return folder


# ---------------------------------------------------------------- the physical limit

def memory_bandwidth(threads: int, megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second this machine streams from memory: the fastest of `repeats` reads of an array far larger
    than the caches (a sum of int64 words, split over `threads` threads; numpy releases the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    words = np.ones(megabytes * 2**20 // 8, dtype=np.int64)
    parts = np.array_split(words, threads)
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(np.sum, parts))
            best = min(best, time.perf_counter() - start)
    return words.nbytes / best


def streaming_bound(shape: dict, length: int, bandwidth: float, bytes_per_weight: float = 1.0) -> dict:
    """The least time one document can take at batch 1 when every decoder step reads the weights it multiplies
    once from memory (`bytes_per_weight`: 1 for int8): per step the self-attention (4 d x d), the cross-attention's
    query and output (2 d x d; its keys and values are computed once per document), the FFN (2 d x ffn) of every
    decoder layer and the output projection (vocabulary x d); once per document the encoder's layers. Activations,
    the cache and the search are left out: a floor, not an estimate."""
    d, ffn = shape["d_model"], shape["decoder_ffn_dim"]
    step = shape["decoder_layers"] * (6 * d * d + 2 * d * ffn) + shape["vocab_size"] * d
    encoder = shape["encoder_layers"] * (4 * d * d + 2 * d * shape["encoder_ffn_dim"])
    seconds = ((step * length) + encoder) * bytes_per_weight / bandwidth
    return {"step_mb": step * bytes_per_weight / 1e6, "bandwidth_gb_s": bandwidth / 1e9, "seconds": seconds}


# ---------------------------------------------------------------- measuring

def measure(systems: dict, docs: list[str], rounds: int, batch: int, log) -> dict:
    """Batch-1 latency per document and batch-`batch` passes, interleaved: the system order rotates per
    document and per round, so a load change on the machine hits every system alike."""
    names = list(systems)

    def clock(name: str, part: list[str]) -> tuple[float, list]:
        start = time.perf_counter()
        ids = systems[name](part)
        seconds = time.perf_counter() - start
        # the Optimum server reports its own generate time (the pipe and JSON are not part of it)
        return (getattr(systems[name], "seconds", None) or seconds), ids

    for name in names:  # warm-up: first-call allocations, thread pools
        clock(name, docs[:1])
        clock(name, docs[:min(batch, len(docs))])
    latency: dict[str, list[float]] = {n: [] for n in names}
    for i, doc in enumerate(docs):
        for name in names[i % len(names):] + names[:i % len(names)]:
            latency[name].append(clock(name, [doc])[0] * 1000)
    passes: dict[str, list[float]] = {n: [] for n in names}
    outputs: dict[str, list] = {}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            seconds, got = 0.0, []
            for start in range(0, len(docs), batch):
                s, ids = clock(name, docs[start:start + batch])
                seconds, got = seconds + s, got + ids
            passes[name].append(len(docs) / seconds)
            outputs[name] = got
        log(f"round {r + 1}: " + ", ".join(f"{n} {passes[n][-1]:.2f}" for n in names) + " docs/s")
    reference = outputs.get("torch")
    return {n: {"p50": float(np.percentile(latency[n], 50)), "p90": float(np.percentile(latency[n], 90)),
                "docs_s": float(np.median(passes[n])), "every": passes[n],
                "lengths": sorted({len(x) for x in outputs[n]}),
                "same": None if reference is None else sum(a == b for a, b in zip(outputs[n], reference))}
            for n in names}


def table(results: dict, sizes: dict, docs: int, notes: dict, bound: dict | None = None) -> list[str]:
    fp32 = sizes.get("fp32")
    ct2 = results.get("ct2-int8")
    lines = ["| system | MB on disk | vs runtime fp32 | batch-1 p50 ms | p90 ms | docs/s, batch 16 (median) "
             "| vs CTranslate2 int8 (p50; docs/s) | every round, docs/s | outputs equal to PyTorch's |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in SYSTEMS:
        if name in notes:
            lines.append(f"| {LABELS[name]} | not measured: {notes[name]} |  |  |  |  |  |  |  |")
        if name not in results:
            continue
        r = results[name]
        ratio = f"{sizes[name] / fp32:.2f}×" if fp32 else ""
        versus = f"{ct2['p50'] / r['p50']:.2f}×; {r['docs_s'] / ct2['docs_s']:.2f}×" if ct2 else ""
        same = "" if r["same"] is None else f"{r['same']}/{docs}"
        lines.append(f"| {LABELS[name]} | {sizes[name] / 1e6:.1f} | {ratio} | {r['p50']:.1f} | {r['p90']:.1f} | "
                     f"{r['docs_s']:.3f} | {versus} | {', '.join(f'{x:.3f}' for x in r['every'])} | {same} |")
    if bound:
        lines.append(f"| weight-streaming bound, int8 weights ({bound['step_mb']:.1f} MB a decoder step at "
                     f"{bound['bandwidth_gb_s']:.1f} GB/s) |  |  | {bound['seconds'] * 1000:.1f} |  |  |  |  |  |")
    return lines


def against_bound(results: dict, bound: dict) -> str:
    """Each int8 system's batch-1 p50 as a multiple of the weight-streaming bound (issue 29: aim for <= 1.5x)."""
    parts = [f"{LABELS[n]} {results[n]['p50'] / (bound['seconds'] * 1000):.2f}×"
             for n in ("int8", "int8-u8", "int8-nbits", "ct2-int8") if n in results]
    return ("Batch-1 p50 against the weight-streaming bound (`streaming_bound` in the script: the weights a "
            f"decoder step multiplies read once from memory, × {bound['length']} steps, plus the encoder's; "
            f"bandwidth measured by the script just before the systems): {', '.join(parts)}.") if parts else ""


def prepare(args, work: Path, model_dir: Path, chosen: list[str], samples: Path, optimum_python: str | None,
            notes: dict, log) -> dict:
    """Exports (timed), CTranslate2 conversions and the Optimum export, each unless --reuse finds it."""
    exports_file = work / "export_times.json"
    exports = json.loads(exports_file.read_text()) if args.reuse and exports_file.is_file() else {}
    for name, (flag, more) in EXPORTS.items():
        if name in chosen and not (args.reuse and (work / f"export-{name}" / "modelshrink.json").is_file()):
            log(f"modelshrink export {flag or 'fp32'}" + "".join(f" --{k.replace('_', '-')} {v}" for k, v in more.items()))
            exports[name] = timed_export(model_dir, work / f"export-{name}", flag, samples, **more)
    if optimum_python and "optimum" in chosen and not (args.reuse and (work / "optimum" / "config.json").is_file()):
        log("Optimum export")
        try:
            exports["optimum"] = optimum_export(optimum_python, model_dir, work / "optimum")
        except RuntimeError as e:
            notes["optimum"] = f"its export failed: {e}"
    exports_file.write_text(json.dumps(exports, indent=2))
    for name in ("ct2-fp32", "ct2-int8"):
        if name in chosen and name not in notes and not (args.reuse and (work / name / "model.bin").is_file()):
            from ctranslate2.converters import TransformersConverter

            TransformersConverter(str(model_dir)).convert(str(work / name), force=True,
                                                          quantization=name[4:].replace("fp32", "float32"))
    return exports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3, help="Interleaved batch-16 passes (median reported).")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"Comma-separated, of: {', '.join(SYSTEMS)}.")
    parser.add_argument("--length", type=int, default=None, help="Generated tokens per document, all systems "
                        "[default: 47; 8 with --small].")
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-source-length", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--student", default=None, help="A trained bert2bert: a second table, our systems only.")
    parser.add_argument("--small", action="store_true", help="A tiny model: a smoke run of the whole script.")
    parser.add_argument("--output", default=None, help="Keep the model, exports, conversions and peers.json "
                        "here [default: a temporary folder, removed].")
    parser.add_argument("--reuse", action="store_true", help="Reuse what --output holds (reused exports keep "
                        "the times measured when they were made).")
    parser.add_argument("--no-write", action="store_true", help="Print the table; leave BENCHMARKS.md alone.")
    args = parser.parse_args()
    chosen = [s.strip() for s in args.systems.split(",") if s.strip()]
    if unknown := set(chosen) - set(SYSTEMS):
        parser.error(f"unknown systems {sorted(unknown)}; expected some of {SYSTEMS}")

    import torch

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    load_before = os.getloadavg()[0]
    work = Path(args.output) if args.output else Path(tempfile.mkdtemp(prefix="bench-peers-"))
    work.mkdir(parents=True, exist_ok=True)
    shape = SMALL if args.small else BASE
    args.length = args.length or (8 if args.small else 47)
    args.max_source_length = min(args.max_source_length, shape["max_position_embeddings"])
    docs = read_documents("validation", args.docs)
    samples = work / "validation-docs.jsonl"  # what the exports validate on
    samples.write_text("".join(json.dumps({"document": d}) + "\n" for d in docs[:4]))
    model_dir = work / "model"
    if not (args.reuse and (model_dir / "config.json").is_file()):
        log(f"building the random BART ({shape['d_model']} wide, vocabulary {shape['vocab_size']})")
        build_model(model_dir, shape, args.seed, args.beams)

    notes: dict[str, str] = {}
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        for name in ("ct2-fp32", "ct2-int8"):
            notes[name] = "ctranslate2 is not installed (pip install ctranslate2, or modelshrink[bench])"
        log("ctranslate2 is not installed: its rows are skipped (pip install ctranslate2)")
    optimum_python = os.environ.get("MODELSHRINK_OPTIMUM_PYTHON")
    if not optimum_python:
        notes["optimum"] = "MODELSHRINK_OPTIMUM_PYTHON is not set (a Python with optimum-onnx, on transformers 4)"
        log("Optimum: " + notes["optimum"])
    exports = prepare(args, work, model_dir, chosen, samples, optimum_python, notes, log)
    student_ct2 = "ctranslate2 is not installed" if "ct2-int8" in notes else \
        ct2_error(Path(args.student) if args.student else tiny_bert2bert(work / "tiny-bert2bert"))

    systems, sizes = {}, {}
    common = dict(length=args.length, beams=args.beams, max_source=args.max_source_length)
    for name in [n for n in chosen if n not in notes]:
        if name == "torch":
            systems[name], sizes[name] = torch_system(model_dir, **common)
        elif name in EXPORTS:
            systems[name], sizes[name] = runtime_system(work / f"export-{name}", threads=args.threads, **common)
        elif name.startswith("ct2-"):
            systems[name], sizes[name] = ct2_system(work / name, model_dir, name[4:].replace("fp32", "float32"),
                                                    threads=args.threads, **common)
        else:
            systems[name] = OptimumServer(optimum_python, work / "optimum", model_dir / "tokenizer.json",
                                          threads=args.threads, **common)
            sizes[name] = systems[name].size
    bound = dict(streaming_bound(shape, args.length, memory_bandwidth(args.threads)), length=args.length)
    log(f"weight-streaming bound: {bound['seconds'] * 1000:.0f} ms a document ({bound['bandwidth_gb_s']:.1f} GB/s)")
    log(f"measuring {', '.join(systems)} on {len(docs)} documents")
    results = measure(systems, docs, args.rounds, 16, log)
    if "optimum" in systems:
        systems["optimum"].close()
    (work / "peers.json").write_text(json.dumps({"results": results, "sizes": sizes, "exports": exports, "bound": bound,
                                                 "notes": notes, "student_ct2": student_ct2}, indent=2))
    lines = [describe(args, shape, len(docs), load_before, exports, sizes, student_ct2), ""]
    lines += table(results, sizes, len(docs), notes, bound)
    if note := against_bound(results, bound):
        lines += ["", note]
    if args.student:
        lines += student_table(args, work, docs, log)
    publish("peers", "peers: the runtime beside PyTorch, CTranslate2 and Optimum", "\n".join(lines),
            not args.no_write and not args.small,
            "Targets (issue 15): `--int4` ≤ 0.2× float32 on disk; runtime int8 at batch 16 ≥ 1.0× CTranslate2 int8 "
            "on the same model, keeping the batch-1 lead; `export` (validation included) within 2× of Optimum's "
            "export time.")
    if not args.output:
        shutil.rmtree(work, ignore_errors=True)


def student_table(args, work: Path, docs: list[str], log) -> list[str]:
    """Our systems on a trained bert2bert student (same documents, fixed length)."""
    student = Path(args.student)
    common = dict(length=args.length, beams=args.beams, max_source=args.max_source_length)
    systems, sizes = {}, {}
    systems["torch"], sizes["torch"] = torch_system(student, **common)
    for name, flag in (("fp32", None), ("int8", "int8"), ("int4", "int4")):
        if not (args.reuse and (work / f"student-{name}" / "modelshrink.json").is_file()):
            log(f"student: modelshrink export {flag or 'fp32'}")
            timed_export(student, work / f"student-{name}", flag, work / "validation-docs.jsonl")
        systems[name], sizes[name] = runtime_system(work / f"student-{name}", threads=args.threads, **common)
    results = measure(systems, docs, args.rounds, 16, log)
    return ["", f"The trained bert2bert `{student}` (our systems only; CTranslate2 cannot convert it):", ""] + \
        table(results, sizes, len(docs), {})


def describe(args, shape: dict, docs: int, load_before: float, exports: dict, sizes: dict, student_ct2: str) -> str:
    import onnxruntime
    import torch
    import transformers

    try:
        import ctranslate2
        versions = f", ctranslate2 {ctranslate2.__version__}"
    except ImportError:
        versions = ""
    times = "; ".join(f"{name} {e['seconds']:.0f} s" + (f" (validation {e['validation_seconds']:.0f} s, {e['check']})"
                                                        if e.get("validation_seconds") else "")
                      for name, e in exports.items())
    if {"fp32", "optimum"} <= set(exports):
        times += f"; fp32 against Optimum's: {exports['fp32']['seconds'] / exports['optimum']['seconds']:.2f}×"
    int4 = f" --int4 on disk: {sizes['int4'] / sizes['fp32']:.3f}× of float32." if {"int4", "fp32"} <= set(sizes) else ""
    source = "debian-descriptions/validation of ../shared/data" if SHARED.is_dir() else "the bundled Debian sample"
    return (f"Model: random BartForConditionalGeneration, {shape['encoder_layers']}+{shape['decoder_layers']} layers, "
            f"d {shape['d_model']}, vocabulary {shape['vocab_size']} (byte-level BPE trained on the Debian "
            f"documents), seed {args.seed}. The first {docs} documents of {source} (sources ≤ "
            f"{args.max_source_length} tokens), beam {args.beams}, every output exactly {args.length} tokens; "
            f"{args.threads} intra-op threads, 1 inter-op. Batch-1 latency over every document, the systems taking "
            f"turns in a rotating order; batch-16 throughput: median of {args.rounds} interleaved rounds. Export "
            f"times (library call in a warm interpreter, validation included): {times or 'not measured'}.{int4} "
            f"The trained bert2bert student: CTranslate2's converter says \"{student_ct2}\". Machine: "
            f"{cpu()}, {len(os.sched_getaffinity(0))} cores, load average {load_before:.1f} at the "
            f"start; torch {torch.__version__}, transformers {transformers.__version__}, onnxruntime "
            f"{onnxruntime.__version__}{versions}. Command: `{' '.join(['python benchmarks/peers.py'] + sys.argv[1:])}` "
            f"({time.strftime('%Y-%m-%d')}).")


if __name__ == "__main__":
    main()
