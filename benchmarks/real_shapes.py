"""The sizes users compress: each seq2seq checkpoint of ../shared/checkpoints at its real architecture (its own
config.json, tokenizer and vocabulary; random weights from a fixed seed), exported and run beside PyTorch and
CTranslate2.

    python benchmarks/real_shapes.py --kits google-t5--t5-small,facebook--bart-large-cnn --docs 16

Per checkpoint: `modelshrink export` (float and --int8), each in a process of its own, timed, with its peak
resident memory (the child's own VmHWM) against the float model's bytes (issue 78's target: <= 3x, so that
a 16 GB machine exports pegasus-xsum); the folders' sizes; then batch-1 latency (p50, p90) and batch-16 docs/s of
PyTorch's `generate`, the runtime float and --int8, and CTranslate2 int8 where its converter takes the family,
every output forced to --length tokens at --beams beams (the same work for all), 2 intra-op threads. The documents:
the Debian validation descriptions of ../shared/data (else the bundled sample); translators read them as sources.
A graph past protobuf's 2 GB keeps its weights in `<graph>.onnx_data` (modelshrink.onnx.saving). --small shrinks
each model (a smoke run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _peer_systems import ct2_system, runtime_system, torch_system
from _report import cpu, publish
from peers import measure, read_documents

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = ROOT.parent / "shared" / "checkpoints"
KITS = ["google-t5--t5-small", "google--flan-t5-base", "sshleifer--distilbart-cnn-12-6", "facebook--bart-large-cnn",
        "facebook--m2m100_418M", "google--pegasus-xsum"]
# --small: whichever of these a config has (BART/M2M100/Pegasus, T5)
SMALL = {"d_model": 64, "d_kv": 16, "d_ff": 128, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "num_heads": 4,
         "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_layers": 1, "decoder_layers": 1,
         "num_layers": 1, "num_decoder_layers": 1}
SYSTEMS = {"torch": "PyTorch generate fp32", "fp32": "modelshrink runtime fp32", "int8": "modelshrink runtime int8",
           "ct2-int8": "CTranslate2 int8"}


def build(name: str, folder: Path, small: bool, seed: int) -> dict:
    """The checkpoint's architecture with random weights, saved with its tokenizer and generation config; returns
    its parameters and float32 bytes."""
    import torch
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    config = AutoConfig.from_pretrained(CHECKPOINTS / name)
    for key, value in (SMALL.items() if small else ()):
        if key in config.to_dict():
            setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForSeq2SeqLM.from_config(config).eval()
    model.save_pretrained(folder)
    for path in (CHECKPOINTS / name).iterdir():
        if path.name != "config.json" and path.is_file():
            shutil.copy(path, folder / path.name)
    parameters = sum(p.numel() for p in model.parameters())
    return {"parameters": parameters, "float_bytes": 4 * parameters, "vocabulary": config.vocab_size}


CHILD = """
import json, resource, sys, time
from modelshrink.options.export import ExportOptions
from modelshrink.steps.export import export_model
model, folder, data, flag, target = sys.argv[1:6]
start = time.perf_counter()
options = ExportOptions(model=model, data=data, samples=2, generation_docs=2, **({flag: True} if flag else {}))
_, report = export_model(options, folder, overwrite=True)
# VmHWM, the peak of this process's own memory: getrusage's ru_maxrss keeps, across the exec, the resident set of
# the parent it was forked from (which had just built the model), and reported up to 3x the export's own peak
try:
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) * 1024
except OSError:  # not Linux: ru_maxrss (kB on Linux, bytes on macOS), with the caveat above
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
print(json.dumps({"seconds": time.perf_counter() - start, "peak_rss": peak,
                  "check": report.get("validation", {}).get("failure") or "passed"}))
"""


def export(model: Path, folder: Path, data: Path, flag: str | None) -> dict:
    """`modelshrink export` in a process of its own: seconds, peak resident bytes, the check, the folder's bytes."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(model), str(folder), str(data), flag or "", ""],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["bytes"] = sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and not p.name.endswith(".json"))
    return result


def ct2_convert(model: Path, folder: Path) -> str | None:
    """CTranslate2's int8 conversion; None when it worked, else its first line (a family it does not take)."""
    try:
        from ctranslate2.converters import TransformersConverter
    except ImportError:
        return "ctranslate2 is not installed (pip install ctranslate2, or modelshrink[bench])"
    try:
        TransformersConverter(str(model)).convert(str(folder), force=True, quantization="int8")
    except Exception as e:  # the converter raises ValueError for an unregistered config, others for the rest
        return str(e).splitlines()[0][:160]
    return None


def rows_of(name: str, info: dict, exports: dict, results: dict, notes: dict, docs: int) -> list[str]:
    float_gb = info["float_bytes"] / 1e9
    out = []
    for form in ("fp32", "int8"):
        e = exports[form]
        if "error" in e:
            out.append(f"| {name} | export {form} |  |  | failed: {e['error']} |  |  |  |")
            continue
        out.append(f"| {name} | export {form} | {e['seconds']:.0f} s | {e['peak_rss'] / 1e9:.2f} GB "
                   f"({e['peak_rss'] / info['float_bytes']:.1f}× the float model's {float_gb:.2f} GB) | "
                   f"{e['bytes'] / 1e6:.0f} MB | {e['check']} |  |  |")
    ct2 = results.get("ct2-int8")
    for system, label in SYSTEMS.items():
        if system in notes:
            out.append(f"| {name} | {label} | not measured: {notes[system]} |  |  |  |  |  |")
        if system not in results:
            continue
        r = results[system]
        versus = f"{ct2['p50'] / r['p50']:.2f}×; {r['docs_s'] / ct2['docs_s']:.2f}×" if ct2 else ""
        same = "" if r["same"] is None else f"{r['same']}/{docs}"
        out.append(f"| {name} | {label} | p50 {r['p50']:.0f} ms, p90 {r['p90']:.0f} ms | {r['docs_s']:.2f} docs/s "
                   f"| | | {versus} | {same} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kits", default=",".join(KITS), help=f"Comma-separated, of: {', '.join(KITS)}.")
    parser.add_argument("--docs", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--length", type=int, default=None, help="Tokens every system generates [47; 8 --small].")
    parser.add_argument("--beams", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-source-length", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--small", action="store_true", help="Each model shrunk: a smoke run of the script.")
    parser.add_argument("--output", default=None, help="Keep models and exports here [default: a temporary "
                        "folder, removed].")
    parser.add_argument("--no-write", action="store_true", help="Print the table; leave BENCHMARKS.md alone.")
    parser.add_argument("--exports-only", action="store_true", help="Export again; the speed rows are those of the "
                        "run that wrote --output's <kit>/results.json (after a change to export alone).")
    args = parser.parse_args()
    kits = [k.strip() for k in args.kits.split(",") if k.strip()]
    if unknown := set(kits) - set(KITS):
        parser.error(f"unknown kits {sorted(unknown)}; expected some of {KITS}")
    if args.exports_only and not args.output:
        parser.error("--exports-only reads the earlier run's results from --output")
    if not CHECKPOINTS.is_dir():
        parser.error(f"{CHECKPOINTS} is absent: it holds the checkpoints' configs and tokenizers")

    import torch

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    length = args.length or (8 if args.small else 47)
    work = Path(args.output) if args.output else Path(tempfile.mkdtemp(prefix="bench-real-shapes-"))
    work.mkdir(parents=True, exist_ok=True)
    docs = read_documents("validation", args.docs, bundled=args.small)
    lines = [f"{args.docs} Debian validation documents, beam {args.beams}, {length} tokens forced, {args.threads} "
             f"threads, {cpu()}; `python benchmarks/real_shapes.py --kits {','.join(kits)} --docs {args.docs}"
             + (f" --rounds {args.rounds}" if args.rounds != 1 else "") + (" --small" if args.small else "")
             + (" --exports-only" if args.exports_only else "") + f"` ({time.strftime('%Y-%m-%d')}).", "",
             "| checkpoint (random weights) | what | time / latency | peak memory / docs/s | folder | check "
             "| vs CTranslate2 int8 (p50; docs/s) | outputs equal to PyTorch's |", "|---|---|---|---|---|---|---|---|"]
    for name in kits:
        lines += run_kit(name, args, work, docs, length, log)
    write = not args.no_write and not args.small
    publish("real_shapes", "Real checkpoint shapes: export, memory and speed",
            "\n".join(lines + (earlier_rows(kits) if write else [])), write=write)


def run_kit(name: str, args: argparse.Namespace, work: Path, docs: list[str], length: int, log) -> list[str]:
    """One checkpoint: build, export (float, --int8), measure; its table rows. With --exports-only the model and
    the speed results are the earlier run's in --output."""
    folder = work / name
    folder.mkdir(exist_ok=True)
    earlier = json.loads((folder / "results.json").read_text()) if args.exports_only else None
    if earlier is None:
        log(f"{name}: building")
        info = build(name, folder / "model", args.small, args.seed)
    else:
        info = earlier["info"]
    data = folder / "docs.jsonl"
    data.write_text("".join(json.dumps({"document": d}) + "\n" for d in docs[:4]))
    exports = {}
    for form, flag in (("fp32", None), ("int8", "int8")):
        log(f"{name}: export {form}")
        exports[form] = export(folder / "model", folder / f"export-{form}", data, flag)
    if earlier is None:
        results, notes = measure_kit(name, folder, exports, args, docs, length, log)
    else:
        results, notes = earlier["results"], earlier["notes"]
    (folder / "results.json").write_text(json.dumps({"info": info, "exports": exports, "results": results,
                                                     "notes": notes}, indent=2))
    rows = rows_of(f"{name} ({info['parameters'] / 1e6:.0f} M)", info, exports, results, notes, len(docs))
    if not args.output:
        shutil.rmtree(folder)
    return rows


def measure_kit(name: str, folder: Path, exports: dict, args: argparse.Namespace, docs: list[str], length: int,
                log) -> tuple[dict, dict]:
    """Batch-1 latency and batch-16 docs/s of PyTorch, the two exports and CTranslate2 int8; (results, notes)."""
    notes: dict[str, str] = {}
    source = min(args.max_source_length, 512)
    systems = {"torch": torch_system(folder / "model", length, args.beams, source)[0]}
    for form in ("fp32", "int8"):
        if "error" in exports[form]:
            notes[form] = "its export failed"
        else:
            systems[form] = runtime_system(folder / f"export-{form}", length, args.beams, source, args.threads)[0]
    why = ct2_convert(folder / "model", folder / "ct2-int8")
    if why is None and not (folder / "model" / "tokenizer.json").is_file():
        shutil.copy(folder / "export-fp32" / "tokenizer.json", folder / "model" / "tokenizer.json")
    if why is None:
        systems["ct2-int8"] = ct2_system(folder / "ct2-int8", folder / "model", "int8", length, args.beams,
                                         source, args.threads)[0]
    else:
        notes["ct2-int8"] = why
    log(f"{name}: measuring {', '.join(systems)}")
    return measure(systems, docs, args.rounds, 16, log), notes


def earlier_rows(kits: list[str]) -> list[str]:
    """The rows BENCHMARKS.md holds for checkpoints this run did not measure (a checkpoint's rows come from its
    own run, at the parameters the line above the table names; each checkpoint takes minutes to an hour)."""
    from _report import BENCHMARKS

    text = BENCHMARKS.read_text() if BENCHMARKS.exists() else ""
    if "<!-- real_shapes:begin -->" not in text:
        return []
    section = text.split("<!-- real_shapes:begin -->", 1)[1].split("<!-- real_shapes:end -->", 1)[0]
    return [line for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| checkpoint") and line.split(" ")[1] not in kits]


if __name__ == "__main__":
    main()
