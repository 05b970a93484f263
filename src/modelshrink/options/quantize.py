"""Options of `modelshrink quantize`."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, ClassVar

from modelshrink.errors import UserError
from modelshrink.metrics.names import ALL_METRICS
from modelshrink.options import REQUIRED, opt, options_class
from modelshrink.options.generation import GEN, prefix_option, source_lang_option, target_lang_option
from modelshrink.options.train import DATA, OPT, SPLITS, VAL, TrainOptions
from modelshrink.quant.spec import check_budget_spec, parse_bits, parse_candidates

TRAIN = "Training (--method distill)"
BUDGET = "Bits under a size budget"
# all that `--method direct` reads; every other option goes with --method distill
DIRECT_READS = frozenset({"model", "bits", "method", "granularity", "allow_low_activation_bits", "activation_clip",
                          "device", "trust_remote_code", "allow_pickle"})
# what a budget adds to them: its calibration sample comes from --data, drawn with --seed, batched by --batch-size
BUDGET_READS = frozenset({"budget_mb", "budget_of", "candidate_bits", "calibration_examples", "data", "split", "text_column",
                          "summary_column", "text_pair_column", "label_column", "limit", "seed", "batch_size",
                          "max_source_length", "max_target_length", "prefix", "target_lang", "source_lang"})


@options_class
class QuantizeOptions(TrainOptions):
    """Every option of `modelshrink quantize`. The training options (TrainOptions and the losses)
    apply to `--method distill`."""

    STEP: ClassVar[str] = "quantize"
    GOES_WITH: ClassVar[dict[str, str]] = {"candidate_bits": "budget_mb", "calibration_examples": "budget_mb",
                                           "budget_of": "budget_mb"}

    model: str = opt(REQUIRED, "A trained full-precision model: seq2seq, or a BERT-style classifier.", argument=True)
    bits: str = opt("8-8-8", "W-E-A: bits of linear weights, word embeddings, activations. 2 = ternary (TWN), "
                             "3-8 = symmetric linear. Then rules for parts of the model, later over earlier: "
                             "2-2-8,cross_attention=8,decoder.ffn=4,decoder.0=8,lm_head=4; positions=8 "
                             "quantizes learned position tables (float otherwise).")
    method: str = opt("distill", "distill (distillation-aware training, DQ-BART 2.3) or direct.",
                      choices=("distill", "direct"))
    granularity: str | None = opt(None, "Scale of linear weights: per tensor or per output row. Embeddings: always "
                                        "per row. [default: tensor (DQ-BART's); row with --budget-mb, whose 4-bit "
                                        "candidates round outlier-heavy weights worse than ternary per tensor]",
                                  choices=("tensor", "row", None))
    allow_low_activation_bits: bool = opt(False, "Permit activations below 8 bits.")
    activation_clip: float | None = opt(None, "Clamp activations to +-this before their max-abs scale, as the DQ-BART "
                                              "authors' code does (2.5). [default: no clamp]")
    budget_mb: float | None = opt(None, "Size of the weights file in MB (10^6 bytes): each layer group's weight bits "
                                        "chosen by its measured sensitivity, never over the budget. Needs --data.",
                                  panel=BUDGET, above=0, metavar="MB")
    budget_of: str = opt("artifact", "What --budget-mb bounds: the artifact's weights file, or what `export` stores "
                                     "of it: the same, with a second copy of a word-embedding table that the encoder "
                                     "and the decoder share (the export's two graphs each hold it). Not counted: the "
                                     "graphs' own nodes (a few tenths of a MB; leave room for them).",
                         panel=BUDGET, choices=("artifact", "export"))
    candidate_bits: str = opt("2,4,8", "Widths the budget chooses from (3 is stored as 4, 5-7 as 8).", panel=BUDGET,
                              metavar="BITS,BITS")
    calibration_examples: int = opt(64, "Examples of --data the sensitivity is measured on (drawn with --seed).",
                                    panel=BUDGET, min=1)
    data: str | None = opt(None, "Training data for --method distill: pairs (seq2seq) or labelled sentences "
                                 "(classifiers).", panel=TRAIN)
    teacher: str | None = opt(None, "Full-precision teacher. [default: MODEL itself]", panel=TRAIN)
    encoder_layers: int | None = opt(None, "Also shrink: encoder layers copied from the teacher.", panel=TRAIN, min=1)
    decoder_layers: int | None = opt(None, "Also shrink: decoder layers copied from the teacher.", panel=TRAIN, min=1)
    kd_logits_weight: float = opt(1.0, "Weight of the logits MSE.", panel=TRAIN, min=0)
    kd_hidden: float = opt(1.0, "Weight of the hidden-state MSE.", panel=TRAIN, min=0)
    kd_attention: float = opt(1.0, "Weight of the attention MSE.", panel=TRAIN, min=0)
    label_smoothing: float = opt(0.0, "Label smoothing of the task loss.", panel=TRAIN, min=0, below=1)
    batch_size: int | None = opt(None, "Examples per batch and process. [default: 16; on a GPU, --max-tokens 4096 "
                                       "instead]", panel=OPT, min=1)
    validation: str | None = opt(None, "Validation data (ROUGE, BLEU, chrF for seq2seq; accuracy/F1/MCC for "
                                       "classifiers).",
                                 panel=VAL, metavar="DATA")
    eval_limit: int | None = opt(200, "Validation rows used.", panel=VAL, min=1)
    metric: str | None = opt(None, "Keep the checkpoint best by this. [default: rouge2 for seq2seq, accuracy for "
                                   "classifiers, pearson for regression]", panel=VAL, choices=ALL_METRICS + (None,))
    num_beams: int | None = opt(None, "Beam size of validation summaries.", panel=GEN, min=1)
    max_length: int | None = opt(None, "Maximum validation summary length in tokens.", panel=GEN, min=1)
    max_source_length: int | None = opt(None, "Truncate documents / sentences to this many tokens.", panel=DATA,
                                        min=1)
    max_target_length: int = opt(128, "Truncate summaries to this many tokens for training.", panel=DATA, min=1)
    prefix: str | None = prefix_option(DATA)
    target_lang: str | None = target_lang_option(DATA)
    source_lang: str | None = source_lang_option(DATA)
    split: str | None = opt(None, f"Split of --data ({SPLITS}).", panel=DATA)
    validation_split: str | None = opt(None, "Split of --validation.", panel=DATA)
    text_column: str | None = opt(None, "Document / sentence column. [default: auto]", panel=DATA)
    summary_column: str | None = opt(None, "Seq2seq: the summary column. [default: auto]", panel=DATA)
    text_pair_column: str | None = opt(None, "Classifiers: second sentence of a pair.", panel=DATA)
    label_column: str | None = opt(None, "Classifiers: the label column. [default: label]", panel=DATA)
    limit: int | None = opt(None, "First N training rows.", panel=DATA, min=1)
    trust_remote_code: bool = opt(False, "Allow models' own code from the hub.")
    allow_pickle: bool = opt(False, "Load pickle weights (pytorch_model.bin) with torch.load(weights_only=True); "
                                    "refused by default, since pickles can run code.")

    def scale_note(self, widths: tuple[int, ...]) -> str | None:
        """A line for a run whose 3- or 4-bit linear weights (`widths`, read from the quantized model) got one scale
        a tensor by default, not asked for."""
        if not widths or self.granularity is not None:
            return None
        return (f"note: {' and '.join(map(str, widths))}-bit weights with one scale a tensor (the default, DQ-BART's) "
                "spend their levels on outliers: a trained MiniLM's feed-forward weights round worse at 4 bits than "
                "ternary (benchmarks/weight_rounding.py); --granularity row is usually better")

    def check(self) -> None:
        # unset: per row under a budget (benchmarks/weight_rounding.py: per tensor, 4 bits can round worse than 2);
        # left unset in the record, which replays to the same choice
        granularity = self.granularity or ("row" if self.budget_mb is not None else "tensor")
        self.spec: Any = parse_bits(self.bits, self.allow_low_activation_bits, granularity, self.activation_clip)
        if self.budget_mb is not None:
            check_budget_spec(self.spec)
            parse_candidates(self.candidate_bits)
            if self.data is None:
                raise UserError("--budget-mb measures each layer's sensitivity on examples: give --data")
        if self.method == "direct":
            reads = DIRECT_READS | (BUDGET_READS if self.budget_mb is not None else frozenset())
            ignored = self.given({f.name for f in fields(self)} - reads)
            if ignored:
                raise UserError(f"--method direct quantizes the model as it is, without data or training: "
                                f"{', '.join(ignored)} {'goes' if len(ignored) == 1 else 'go'} with --method distill")
            return
        if self.data is None:
            raise UserError("--method distill trains: give --data (and a budget, --max-steps or --epochs)")
        super().check()
