"""Generation options shared by the steps that generate summaries (pseudolabel, eval), with PLATE's
attention temperature and the attention statistics taken under it."""

from __future__ import annotations

from typing import Any, ClassVar

from modelshrink.errors import UserError
from modelshrink.options import Options, opt, options_class
from modelshrink.precision import PRECISIONS

GEN = "Generation (defaults: the model's generation config)"


def prefix_option(panel: str = GEN) -> Any:
    """--prefix, as every step that feeds documents to a seq2seq model takes it (modelshrink.runtime.inputs)."""
    return opt(None, "Text written in front of every document, as the model was trained to read it (T5: "
                     "\"summarize: \"); \"\" for none. [default: the labels' or the model's own: its config's "
                     "summarization prefix, else its prefix]", panel=panel)


def target_lang_option(panel: str = GEN) -> Any:
    """--target-lang of the steps that make a multilingual translator write one language (modelshrink.languages)."""
    return opt(None, "Multilingual translators (mBART-50, M2M100, NLLB): the language to translate into, a code of "
                     "the tokenizer or its language (de -> de_DE, __de__). [default: the labels', else the one the "
                     "model's generation config forces]", panel=panel)


def source_lang_option(panel: str = GEN) -> Any:
    """--source-lang of the steps that make a multilingual translator's tokenizer mark its sources."""
    return opt(None, "Multilingual translators: the language of the sources, which the tokenizer marks with its code "
                     "(src_lang; de -> de_DE, __de__). [default: the labels', else the tokenizer's saved src_lang]",
               panel=panel)
GENERATORS = ("auto", "static", "transformers")


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
    # --batch-size left out: this many documents a batch on a CPU; on a GPU, --max-tokens GPU_MAX_TOKENS instead
    # (options/batching.py)
    BATCH_SIZE: ClassVar[int] = 16
    GPU_MAX_TOKENS: ClassVar[int | None] = 16_384

    batch_size: int | None = opt(None, "Documents per batch (sorted by length). [default: 16; on a GPU, --max-tokens "
                                       "16384 instead]", panel=GEN, min=1)
    max_tokens: int | None = opt(None, "Batch by a padded-token budget instead: length-sorted documents packed up to "
                                       "N source tokens per batch (longest × count). A document longer than N is "
                                       "truncated to N tokens, with a warning naming it. [default: 16384 on a GPU "
                                       "unless --batch-size is given; none on a CPU]", panel=GEN, min=1)
    prefix: str | None = prefix_option()
    dtype: str = opt("fp32", "Run the model in fp32, bf16 or fp16 (fp16 needs a GPU; bf16 runs on a CPU, slowly).",
                     panel=GEN, choices=PRECISIONS)
    generator: str = opt("auto", "Who runs the search: 'static' (fixed shapes, preallocated caches, one CUDA graph "
                                 "per shape on a GPU, the same step eagerly on a CPU; BART, mBART, Pegasus, Marian, "
                                 "M2M100, T5, bert2bert), 'transformers' (its generate), or 'auto': static wherever "
                                 "the model and settings allow (on a CPU too: ~1.3x generate's speed at beam 4, the "
                                 "same ids), saying in one line why not where they do not.", panel=GEN,
                         choices=GENERATORS)


PLATE = "Attention temperature (PLATE)"


@options_class
class TemperatureOptions(GenerationOptions):
    """PLATE's attention temperature while generating, and where the cross attention then looks.
    Shared by `pseudolabel` (the teacher labelling) and `eval` (any seq2seq model), so the statistics
    of a teacher at λ = 2 come out of the same options whichever step produced them."""

    lam: float | None = opt(None, "λ for every attention module: τ = sqrt(λ·d), logits / sqrt(λ). The paper uses "
                                  "1.5 or 2.0. [default: 1.0]", panel=PLATE, flags=("--lambda",), above=0)
    lambda_enc: float | None = opt(None, "λ for encoder self-attention only (Table 4).", panel=PLATE, above=0)
    lambda_dec: float | None = opt(None, "λ for decoder self-attention only.", panel=PLATE, above=0)
    lambda_cross: float | None = opt(None, "λ for decoder cross-attention only.", panel=PLATE, above=0)
    lambda_range: tuple[float, float] | None = opt(None, "Draw λ ~ U[A, B] per document (seeded by --seed, recorded "
                                                         "per row); the paper uses 1 2.", panel=PLATE, metavar="A B",
                                                   above=0)
    attention_stats: bool = opt(False, "Evident cross-attention weights (> 0.15) by document position, 5 bins "
                                       "(PLATE Fig. 2), measured at the λ the summaries are generated with.",
                                panel=PLATE)
    attention_plot: str | None = opt(None, "Write a PNG heatmap of this document's cross attention at that λ (PLATE "
                                           "Fig. 1).", panel=PLATE, metavar="DOC_ID")

    def temperature_options(self) -> list[str]:
        """The λ options given, as flags (empty: the model's own temperature)."""
        names = ("lam", "lambda_enc", "lambda_dec", "lambda_cross", "lambda_range")
        return [f"--{n.replace('_', '-')}" if n != "lam" else "--lambda" for n in names if getattr(self, n) is not None]

    def check_temperature(self) -> None:
        if self.lambda_range is not None:
            a, b = self.lambda_range
            if a > b:
                raise UserError(f"--lambda-range A B needs A <= B, got {a} > {b}")
            if self.lam is not None:
                raise UserError("--lambda and --lambda-range exclude each other; give one")
            if None not in (self.lambda_enc, self.lambda_dec, self.lambda_cross):
                raise UserError("--lambda-range draws λ for the attention kinds without their own λ, but "
                                "--lambda-enc, --lambda-dec and --lambda-cross fix all three; drop one of them "
                                "or --lambda-range")
