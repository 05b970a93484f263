"""Generation options shared by the steps that generate summaries (pseudolabel, eval)."""

from __future__ import annotations

from modelshrink.options import Options, opt, options_class
from modelshrink.precision import PRECISIONS

GEN = "Generation (defaults: the model's generation config)"


@options_class
class GenerationOptions(Options):
    """Beam search settings; each defaults to the model's generation_config.json."""

    num_beams: int | None = opt(None, "Beam size.", panel=GEN, min=1)
    length_penalty: float | None = opt(None, "Beam length penalty.", panel=GEN)
    min_length: int | None = opt(None, "Minimum summary length in tokens.", panel=GEN, min=0)
    max_length: int | None = opt(None, "Maximum summary length in tokens.", panel=GEN, min=1)
    no_repeat_ngram_size: int | None = opt(None, "Block repeated n-grams of this size.", panel=GEN, min=0)
    max_source_length: int | None = opt(None, "Truncate documents to this many tokens. [default: the smaller of the "
                                              "tokenizer's model_max_length and the model's positions]", panel=GEN,
                                        min=1)
    batch_size: int = opt(16, "Documents per batch (sorted by length).", panel=GEN, min=1)
    max_tokens: int | None = opt(None, "Batch by a padded-token budget instead: length-sorted documents packed up to "
                                       "N source tokens per batch (longest × count). A document longer than N is "
                                       "truncated to N tokens, with a warning naming it.", panel=GEN, min=1)
    dtype: str = opt("fp32", "Run the model in fp32, bf16 or fp16 (fp16 needs a GPU; bf16 runs on a CPU, slowly).",
                     panel=GEN, choices=PRECISIONS)
