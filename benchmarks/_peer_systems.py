"""The systems of benchmarks/peers.py: each a function from documents to generated ids (start token left out)
and its bytes on disk. Every one tokenizes inside its timing and detokenizes nowhere."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


def torch_system(model_dir: Path, length: int, beams: int, max_source: int):
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    size = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))

    def run(docs: list[str]) -> list[list[int]]:
        enc = tokenizer(docs, truncation=True, max_length=max_source, padding=True, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**enc, num_beams=beams, min_length=length + 1, max_length=length + 1,
                                 no_repeat_ngram_size=0, length_penalty=1.0, early_stopping=False)
        return out[:, 1:].tolist()
    return run, size


def runtime_system(folder: Path, length: int, beams: int, max_source: int, threads: int):
    from modelshrink.runtime import load

    runtime = load(folder, threads=threads)
    settings = runtime.settings(num_beams=beams, min_length=length + 1, max_length=length + 1, no_repeat_ngram_size=0,
                                length_penalty=1.0, early_stopping=False)

    def run(docs: list[str]) -> list[list[int]]:
        enc = runtime.encode(docs, max_length=max_source)
        return runtime.generate_ids(enc["input_ids"], enc["attention_mask"], settings)[:, 1:].tolist()
    return run, sum(p.stat().st_size for p in folder.glob("*.onnx"))


def ct2_system(folder: Path, model_dir: Path, compute_type: str, length: int, beams: int, max_source: int,
               threads: int):
    import ctranslate2
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.enable_truncation(max_source)
    translator = ctranslate2.Translator(str(folder), device="cpu", compute_type=compute_type, inter_threads=1,
                                        intra_threads=threads)

    def run(docs: list[str]) -> list[list[int]]:
        source = [e.tokens for e in tokenizer.encode_batch(docs)]
        out = translator.translate_batch(source, beam_size=beams, min_decoding_length=length,
                                         max_decoding_length=length, length_penalty=1.0, max_batch_size=0)
        return [[tokenizer.token_to_id(t) for t in r.hypotheses[0]] for r in out]
    return run, (folder / "model.bin").stat().st_size


class OptimumServer:
    """ORTModelForSeq2SeqLM in the interpreter of MODELSHRINK_OPTIMUM_PYTHON (see _optimum_peer.py), one
    JSON line per batch each way; the child times its own generate, so the pipe is not in the numbers."""

    def __init__(self, python: str, folder: Path, tokenizer: Path, length: int, beams: int, max_source: int,
                 threads: int):
        script = Path(__file__).with_name("_optimum_peer.py")
        self.process = subprocess.Popen([python, str(script), "serve", str(folder), str(tokenizer), str(length),
                                         str(beams), str(max_source), str(threads)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.size = json.loads(self.process.stdout.readline())["bytes"]
        self.seconds = 0.0

    def __call__(self, docs: list[str]) -> list[list[int]]:
        self.process.stdin.write(json.dumps({"docs": docs}) + "\n")
        self.process.stdin.flush()
        reply = json.loads(self.process.stdout.readline())
        self.seconds = reply["seconds"]
        return reply["ids"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def optimum_export(python: str, model_dir: Path, folder: Path) -> dict:
    out = subprocess.run([python, str(Path(__file__).with_name("_optimum_peer.py")), "export", str(model_dir),
                          str(folder)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed")
    return json.loads(out.stdout.strip().splitlines()[-1])
