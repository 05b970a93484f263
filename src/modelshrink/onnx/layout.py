"""The export folder as each client expects it (`modelshrink export --layout`).

`optimum` (the default): the graphs beside config.json under Optimum's names, as Optimum's
`ORTModelForSeq2SeqLM` / `ORTModelForSequenceClassification` load them; nothing to rewrite.

`transformers.js`: `@huggingface/transformers` (4.x) loads a seq2seq model from `onnx/encoder_model{suffix}.onnx`
and `onnx/decoder_model_merged{suffix}.onnx` (a classifier from `onnx/model{suffix}.onnx`), where the suffix
names the weight type ("dtype": none for fp32, `_quantized` for q8, `_q4`, ...) picked by
`transformers.js_config.dtype` in config.json, else by the device (q8 in a browser's wasm, fp32 in Node). So the
graphs move to onnx/ under the name of their weight type, and config.json names that type: loading without a
dtype picks the graphs that were written. It has no decoder in two graphs, and runs only the seq2seq model types
below (no EncoderDecoderModel, so no bert2bert). Our runtime finds the graphs in either layout
(`modelshrink.runtime.files.graph_path`); search_ops.onnx, which transformers.js does not use, stays beside
config.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from modelshrink.errors import UserError
from modelshrink.families import ENCODER_DECODER_TYPE
from modelshrink.onnx.saving import move_graph
from modelshrink.runtime.files import DTYPE_SUFFIXES, SUBFOLDER
from modelshrink.runtime.weights import FLOAT32, INT4, INT8, WeightFormat

# Seq2seq model types transformers.js 4.3 has a model for (MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES) among
# those we export; bart, t5, marian, mbart and m2m_100 are tested (tests/test_clients.py). Every classifier type we
# export is there too.
TRANSFORMERS_JS_SEQ2SEQ = ("bart", "mbart", "marian", "m2m_100", "t5", "mt5")
# the weights' format (modelshrink.runtime.weights) -> transformers.js's dtype of the graphs
DTYPES = {FLOAT32: "fp32", INT8: "q8", INT4: "q4"}
# a quantize artifact's: by the narrowest codes it stores; with none, its int8 initializers
QUANTIZED_DTYPES = {2: "q4", 3: "q4", 4: "q4", 8: "q8"}
QUANTIZED_WITHOUT_CODES = "int8"


def check_layout(layout: str, kind: str, config: Any, merge: bool) -> None:
    """A one-line UserError, before anything is written, for a folder the layout's client could not run."""
    if layout != "transformers.js" or kind != "seq2seq":
        return
    if config.model_type not in TRANSFORMERS_JS_SEQ2SEQ:
        what = "EncoderDecoderModel (bert2bert)" if config.model_type == ENCODER_DECODER_TYPE else config.model_type
        raise UserError(f"--layout transformers.js: transformers.js has no model for {what}; it runs the seq2seq "
                        f"types {', '.join(TRANSFORMERS_JS_SEQ2SEQ)} and the classifiers (use --layout optimum "
                        "for this model)")
    if not merge:
        raise UserError("--layout transformers.js needs the merged decoder (transformers.js loads "
                        "decoder_model_merged.onnx only): drop --no-merge")


def dtype_of(weights: WeightFormat) -> str:
    """transformers.js's name for how the graphs store their weights."""
    if weights.kind in DTYPES:
        return DTYPES[weights.kind]
    if not weights.widths:
        return QUANTIZED_WITHOUT_CODES
    if min(weights.widths) in QUANTIZED_DTYPES:
        return QUANTIZED_DTYPES[min(weights.widths)]
    raise ValueError(f"no transformers.js dtype for weights {weights.description!r}: add it to QUANTIZED_DTYPES")


def apply_layout(folder: Path, graphs: list[str], layout: str, weights: WeightFormat) -> list[str]:
    """Rewrite the finished folder for `layout`; returns the graphs' paths relative to `folder`."""
    if layout == "optimum":
        return graphs
    dtype = dtype_of(weights)
    (folder / SUBFOLDER).mkdir()
    moved = []
    for name in graphs:
        target = f"{SUBFOLDER}/{name.removesuffix('.onnx')}{DTYPE_SUFFIXES[dtype]}.onnx"
        move_graph(folder / name, folder / target)
        moved.append(target)
    config = json.loads((folder / "config.json").read_text())
    config["transformers.js_config"] = {"dtype": dtype}
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return moved
