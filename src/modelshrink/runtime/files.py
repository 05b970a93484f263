"""The files of an export folder, under Optimum's names: `modelshrink.onnx` writes them, the runtime reads them.

Two layouts (`modelshrink export --layout`): Optimum's keeps the graphs beside config.json; transformers.js's
keeps them in `onnx/`, each named by its weight type as transformers.js names them (`encoder_model_q4.onnx`),
and config.json's `transformers.js_config` says which type to load. `graph_path` finds a graph in either.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ENCODER = "encoder_model.onnx"
DECODER = "decoder_model.onnx"
DECODER_WITH_PAST = "decoder_with_past_model.onnx"
DECODER_MERGED = "decoder_model_merged.onnx"
CLASSIFIER = "model.onnx"
SEARCH_OPS = "search_ops.onnx"  # log-softmax and per-row top-k for beam search: logits, k -> values, indices
GRAPHS = (ENCODER, DECODER_MERGED, DECODER, DECODER_WITH_PAST, CLASSIFIER)
# transformers.js's layout: the folder of the graphs, and the suffix of a graph's name for each weight type
# ("dtype"), as @huggingface/transformers 4.x names them (src/utils/dtypes.js)
SUBFOLDER = "onnx"
DTYPE_SUFFIXES = {"fp32": "", "fp16": "_fp16", "int8": "_int8", "uint8": "_uint8", "q8": "_quantized", "q4": "_q4",
                  "q4f16": "_q4f16", "bnb4": "_bnb4"}


def graph_path(folder: str | os.PathLike, name: str, config: dict[str, Any] | None = None) -> Path:
    """Where `folder` keeps graph `name`: beside config.json (Optimum's layout), else in onnx/ under the name
    transformers.js loads, the suffix of the dtype that config.json's `transformers.js_config` gives it (fp32
    when none). The path may not exist: the caller says what is missing."""
    folder = Path(folder)
    if (folder / name).is_file() or not (folder / SUBFOLDER).is_dir():
        return folder / name
    stem = name.removesuffix(".onnx")
    dtype = ((config or {}).get("transformers.js_config") or {}).get("dtype") or "fp32"
    if isinstance(dtype, dict):  # transformers.js also takes one dtype per graph
        dtype = dtype.get(stem, "fp32")
    return folder / SUBFOLDER / f"{stem}{DTYPE_SUFFIXES.get(dtype, '')}.onnx"


def is_export(folder: str | os.PathLike) -> bool:
    """A folder holding the ONNX graphs of an export (what `modelshrink export` writes, in either layout),
    complete or not: `load` says what is missing or damaged."""
    folder = Path(folder)
    return folder.is_dir() and any((folder / name).is_file() or (folder / SUBFOLDER / name).is_file()
                                   or any((folder / SUBFOLDER).glob(name.removesuffix(".onnx") + "_*.onnx"))
                                   for name in GRAPHS)
