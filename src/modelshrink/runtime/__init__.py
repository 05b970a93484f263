"""Run an export folder with onnxruntime, tokenizers and numpy only: no torch, no transformers.

    from modelshrink.runtime import load
    model = load("runs/student-onnx")
    model.summarize(["a long document ..."])          # greedy or beam search, the generation config's settings
    model.classify(["a sentence"])                    # class ids (or values, for a regression head)

The search reproduces transformers' `generate` step for step (greedy; beam search with its finished-
beam bookkeeping, length penalty and early stopping; min length, no-repeat n-grams, forced BOS / EOS),
so that the same settings give the same tokens as PyTorch; `export` checks that they do.

Command line (also torch-free): `python -m modelshrink.runtime DIR --input docs.jsonl`.

This folder imports nothing from the rest of modelshrink, so it can be copied into a service on its own.
Its modules: `model` (loading, the decoder's steps, classification), `search` (greedy and beam search),
`processors` (bans and forced tokens), `settings` (generation settings), `columns` (which column is the
text), `jsonl` (reading JSON Lines), `files` (the export folder's file names), `weights` (how its graphs store
their weights, as modelshrink.json records it), `cpu` (whether the processor multiplies int8 weights exactly),
`errors` (the user-error type), `cli` (the command line).
Importing this package is cheap (`modelshrink.errors` imports it): numpy comes with `load` and `ExportedModel`
(module `model`), onnxruntime and tokenizers when a folder is loaded.
"""

from .cli import main, run_file
from .columns import pick_columns
from .errors import UserError
from .files import CLASSIFIER, DECODER, DECODER_MERGED, DECODER_WITH_PAST, ENCODER, SEARCH_OPS, is_export
from .settings import Search, search_from_configs
from .weights import DEQUANTIZED, WeightFormat

__all__ = ["CLASSIFIER", "DECODER", "DECODER_MERGED", "DECODER_WITH_PAST", "DEQUANTIZED", "ENCODER", "SEARCH_OPS",
           "ExportedModel", "Search", "UserError", "WeightFormat", "is_export", "load", "main", "pick_columns",
           "run_file", "search_from_configs"]


def __getattr__(name: str):
    if name in ("ExportedModel", "load"):
        from . import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
