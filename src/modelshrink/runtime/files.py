"""The files of an export folder, under Optimum's names: `modelshrink.onnx` writes them, the runtime reads them."""

from __future__ import annotations

import os
from pathlib import Path

ENCODER = "encoder_model.onnx"
DECODER = "decoder_model.onnx"
DECODER_WITH_PAST = "decoder_with_past_model.onnx"
DECODER_MERGED = "decoder_model_merged.onnx"
CLASSIFIER = "model.onnx"
SEARCH_OPS = "search_ops.onnx"  # log-softmax and per-row top-k for beam search: logits, k -> values, indices
GRAPHS = (ENCODER, DECODER_MERGED, DECODER, DECODER_WITH_PAST, CLASSIFIER)
# modelshrink.json's resolved "weights" for a quantize artifact's integer weights (see modelshrink.onnx.compress)
DEQUANTIZED = "int8 initializers + DequantizeLinear"


def is_export(folder: str | os.PathLike) -> bool:
    """A folder holding the ONNX graphs of an export (what `modelshrink export` writes), complete or not:
    `load` says what is missing or damaged."""
    folder = Path(folder)
    return folder.is_dir() and any((folder / name).is_file() for name in GRAPHS)
