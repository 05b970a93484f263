"""Options of `modelshrink distill`."""

from __future__ import annotations

from typing import ClassVar

from modelshrink.errors import UserError
from modelshrink.metrics.names import SEQ2SEQ_METRICS
from modelshrink.options import REQUIRED, opt, options_class
from modelshrink.options.generation import GEN, prefix_option, source_lang_option, target_lang_option
from modelshrink.options.train import DATA, OPT, SPEED, SPLITS, VAL, TrainOptions

START = "Starting point"
LOSS = "Losses"
LOGIT_LOSSES = ("kl", "mse")


@options_class
class DistillOptions(TrainOptions):
    """Every option of `modelshrink distill`; the training options come from TrainOptions."""

    STEP: ClassVar[str] = "distill"
    GOES_WITH: ClassVar[dict[str, str]] = {"cross_attention_init": "init_encoder_decoder"}

    data: str = opt(REQUIRED, "Training pairs: gold (document, summary) or a pseudolabel artifact.", argument=True)
    teacher: str | None = opt(None, "Teacher model: the student copies its layers, and word-level losses compare "
                                    "against it.", panel=START)
    student: str | None = opt(None, "A separate student model (or, alone, a model to fine-tune).", panel=START)
    init_encoder_decoder: str | None = opt(None, "Warm-start an encoder-decoder from pretrained BERT/RoBERTa "
                                                 "encoders.", panel=START, metavar="ENCODER[,DECODER]")
    cross_attention_init: str = opt("self", "With --init-encoder-decoder: start cross-attention as a copy of each "
                                            "decoder layer's self-attention (self), or random.", panel=START,
                                    choices=("self", "random"))
    encoder_layers: int | None = opt(None, "Student encoder layers copied from the teacher. [default: all]",
                                     panel=START, min=1)
    decoder_layers: int | None = opt(None, "Student decoder layers copied from the teacher. [default: all]",
                                     panel=START, min=1)
    trim_vocab: bool = opt(False, "Keep in the student only the tokens the training data uses (documents and "
                                  "summaries), the special tokens and every single character: smaller embedding "
                                  "tables and LM head, the same tokens for the corpus' texts (MiniLM on the Debian "
                                  "descriptions: 30,522 → 19,792).", panel=START)
    layer_selection: str = opt("spaced", "spaced (first and last kept; 12→3 = 0,6,11; one layer = the last) or "
                                         "first.", panel=START, choices=("spaced", "first"))
    encoder_layer_ids: list[int] | None = opt(None, "Explicit teacher encoder layers, e.g. 0,6,11.", panel=START,
                                              metavar="IDS")
    decoder_layer_ids: list[int] | None = opt(None, "Explicit teacher decoder layers.", panel=START, metavar="IDS")
    kd_logits: str | None = opt(None, "Logit distillation: kl (with --temperature) or mse (DQ-BART). "
                                      "[default: off]", panel=LOSS, choices=LOGIT_LOSSES)
    kd_logits_weight: float = opt(1.0, "Weight of the logit loss.", panel=LOSS, min=0)
    temperature: float = opt(2.0, "Temperature of --kd-logits kl (loss scaled by T²).", panel=LOSS, above=0)
    kd_hidden: float = opt(0.0, "Weight of the hidden-state MSE (0 = off).", panel=LOSS, min=0)
    kd_attention: float = opt(0.0, "Weight of the attention MSE: encoder self, decoder self, cross (0 = off).",
                              panel=LOSS, min=0)
    label_smoothing: float = opt(0.1, "Label smoothing of the cross-entropy (PLATE: 0.1).", panel=LOSS, min=0,
                                 below=1)
    fused_cross_entropy: bool | None = opt(None, "Take the cross-entropy from the decoder's last hidden state in "
                                                 "chunks of tokens, never holding the [tokens, vocabulary] logits "
                                                 "(the same loss). Not with --kd-logits, which compares the logits. "
                                                 "[default: on wherever it is exact]", panel=SPEED)
    batch_size: int | None = opt(None, "Pairs per batch and process. [default: 16; on a GPU, --max-tokens 4096 "
                                       "instead]", panel=OPT, min=1)
    validation: str | None = opt(None, "Validation pairs, scored by ROUGE, BLEU and chrF.", panel=VAL, metavar="DATA")
    eval_limit: int | None = opt(200, "Validation documents used.", panel=VAL, min=1)
    metric: str = opt("rouge2", "Keep the checkpoint best by this (bleu, chrf: sacreBLEU's, for translation).",
                      panel=VAL, choices=SEQ2SEQ_METRICS)
    num_beams: int | None = opt(None, "Beam size.", panel=GEN, min=1)
    max_length: int | None = opt(None, "Maximum summary length in tokens.", panel=GEN, min=1)
    max_source_length: int | None = opt(None, "Truncate documents to this many tokens. [default: the smaller of "
                                              "the tokenizer's model_max_length and the model's positions]",
                                        panel=GEN, min=1)
    max_target_length: int = opt(128, "Truncate summaries to this many tokens for training.", panel=GEN, min=1)
    prefix: str | None = prefix_option()
    target_lang: str | None = target_lang_option()
    source_lang: str | None = source_lang_option()
    split: str | None = opt(None, f"Split of DATA ({SPLITS}).", panel=DATA)
    validation_split: str | None = opt(None, "Split of --validation.", panel=DATA)
    text_column: str | None = opt(None, "Document column. [default: auto]", panel=DATA)
    summary_column: str | None = opt(None, "Summary column. [default: auto]", panel=DATA)
    limit: int | None = opt(None, "Use only the first N training pairs.", panel=DATA, min=1)
    trust_remote_code: bool = opt(False, "Allow models' own code from the hub.")
    allow_pickle: bool = opt(False, "Load pickle weights (pytorch_model.bin) with torch.load(weights_only=True); "
                                    "refused by default, since pickles can run code.")

    def check(self) -> None:
        if self.teacher and self.init_encoder_decoder:
            raise UserError("--teacher and --init-encoder-decoder exclude each other: a warm start has no teacher")
        if self.teacher is None and self.student is None and self.init_encoder_decoder is None:
            raise UserError("give a starting point: --teacher T (and --encoder-layers/--decoder-layers or --student), "
                            "--student S, or --init-encoder-decoder ENCODER")
        if self.student is not None and self.init_encoder_decoder is not None:
            raise UserError("--student and --init-encoder-decoder exclude each other")
        if self.fused_cross_entropy and self.compile:
            raise UserError("--fused-cross-entropy is not compiled (--compile): its chunked loss is not checked under "
                            "torch.compile; a compiled run takes the plain cross-entropy, so leave it out")
        if self.fused_cross_entropy and self.kd_logits is not None:
            raise UserError(f"--fused-cross-entropy never holds the logits that --kd-logits {self.kd_logits} compares; "
                            "leave it out (the fused loss is on wherever it is exact)")
        shrinking = [self.encoder_layers, self.decoder_layers, self.encoder_layer_ids, self.decoder_layer_ids]
        if any(v is not None for v in shrinking):
            if self.teacher is None:
                raise UserError("--encoder-layers/--decoder-layers (and the *-layer-ids) copy layers of --teacher; "
                                "give --teacher")
            if self.student is not None:
                raise UserError("give either --student or layer counts to copy from the teacher, not both")
        if self.encoder_layers is not None and self.encoder_layer_ids is not None:
            raise UserError("--encoder-layers and --encoder-layer-ids exclude each other")
        if self.decoder_layers is not None and self.decoder_layer_ids is not None:
            raise UserError("--decoder-layers and --decoder-layer-ids exclude each other")
        if self.word_level and self.teacher is None:
            raise UserError("word-level losses (--kd-logits, --kd-hidden, --kd-attention) need --teacher")
        if self.max_steps != 0:  # --max-steps 0 trains nothing, so it needs no budget
            super().check()

    @property
    def word_level(self) -> bool:
        return self.kd_logits is not None or self.kd_hidden > 0 or self.kd_attention > 0
