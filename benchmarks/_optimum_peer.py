"""Optimum's side of benchmarks/peers.py, run by the interpreter that MODELSHRINK_OPTIMUM_PYTHON names
(optimum-onnx needs transformers 4, which cannot be installed beside modelshrink's transformers 5).
It imports neither modelshrink nor anything of this repository.

    PYTHON _optimum_peer.py export MODEL_DIR OUT_DIR
        Optimum's exporter (main_export, its own validation included); prints {"seconds": ...}.
    PYTHON _optimum_peer.py serve ONNX_DIR TOKENIZER_JSON LENGTH BEAMS MAX_SOURCE THREADS
        ORTModelForSeq2SeqLM on that folder; prints {"bytes": ...}, then answers each line {"docs": [...]} on
        stdin with {"ids": [[...]], "seconds": ...}: the generated ids without the start token, and the
        seconds of tokenization and generate.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def export(model_dir: str, out_dir: str) -> None:
    from optimum.exporters.onnx import main_export

    start = time.perf_counter()
    main_export(model_dir, output=out_dir, task="text2text-generation-with-past")
    print(json.dumps({"seconds": time.perf_counter() - start, "validation_seconds": None, "check": "passed"}))


def serve(folder: str, tokenizer_json: str, length: int, beams: int, max_source: int, threads: int) -> None:
    import onnxruntime as ort
    import torch
    from optimum.onnxruntime import ORTModelForSeq2SeqLM
    from tokenizers import Tokenizer

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    model = ORTModelForSeq2SeqLM.from_pretrained(folder, session_options=options, provider="CPUExecutionProvider")
    tokenizer = Tokenizer.from_file(tokenizer_json)
    tokenizer.enable_truncation(max_source)
    pad = tokenizer.token_to_id("<pad>") or 0
    # Optimum writes the two decoders and the merged one; ORTModelForSeq2SeqLM loads the merged one if present
    names = ["encoder_model.onnx"] + (["decoder_model_merged.onnx"] if (Path(folder) / "decoder_model_merged.onnx")
                                      .is_file() else ["decoder_model.onnx", "decoder_with_past_model.onnx"])
    print(json.dumps({"bytes": sum((Path(folder) / n).stat().st_size for n in names)}), flush=True)
    for line in sys.stdin:
        docs = json.loads(line)["docs"]
        start = time.perf_counter()
        encoded = tokenizer.encode_batch(docs)
        width = max(len(e.ids) for e in encoded)
        ids = torch.full((len(docs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(docs), width), dtype=torch.long)
        for row, e in enumerate(encoded):
            ids[row, :len(e.ids)], mask[row, :len(e.ids)] = torch.tensor(e.ids), 1
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, num_beams=beams, min_length=length + 1,
                                 max_length=length + 1, no_repeat_ngram_size=0, length_penalty=1.0,
                                 early_stopping=False)
        seconds = time.perf_counter() - start
        print(json.dumps({"ids": out[:, 1:].tolist(), "seconds": seconds}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "export":
        export(sys.argv[2], sys.argv[3])
    else:
        serve(sys.argv[2], sys.argv[3], *map(int, sys.argv[4:8]))
