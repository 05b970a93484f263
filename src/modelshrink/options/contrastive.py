"""Options of `modelshrink contrastive`."""

from __future__ import annotations

from typing import ClassVar

from modelshrink.errors import UserError
from modelshrink.metrics.names import CLASSIFIER_METRICS
from modelshrink.options import REQUIRED, opt, options_class
from modelshrink.options.train import DATA, OPT, SPLITS, VAL, TrainOptions

START = "Teacher and student"
LOSS = "Loss (Eq. 4: α·CE + (1 − α)·KD + β·PT + γ·A-CDL; paper's search ranges in brackets)"


@options_class
class ContrastiveOptions(TrainOptions):
    """Every option of `modelshrink contrastive`. Defaults of the loss weights sit inside the
    paper's search ranges (section 4.2)."""

    STEP: ClassVar[str] = "contrastive"

    data: str = opt(REQUIRED, "Labelled training data: jsonl, csv/tsv, parquet, a datasets folder or a cached hub "
                              "name.", argument=True)
    teacher: str | None = opt(None, "Fine-tuned teacher classifier. Without it, --student is fine-tuned by "
                                    "cross-entropy alone.", panel=START)
    student: str | None = opt(None, "A separate student: a classifier, or a pretrained encoder (gets a new head). "
                                    "With --layers: the layers are copied from it, not from the teacher (PKD's "
                                    "and ACKD's student: pretrained layers, a fresh head).", panel=START)
    layers: int | None = opt(None, "Student of this many layers copied from the teacher (or from --student).",
                             panel=START, min=1)
    layer_selection: str = opt("spaced", "spaced (first and last kept; 6→3 = 0,3,5) or first (PKD).", panel=START,
                               choices=("spaced", "first"))
    layer_ids: list[int] | None = opt(None, "Explicit teacher layers, e.g. 0,2,4.", panel=START, metavar="IDS")
    trim_vocab: bool = opt(False, "Keep in the student only the tokens the training sentences use, the special "
                                  "tokens and every single character: a smaller embedding table (MiniLM's 30,522 "
                                  "rows are two thirds of a 3-layer student), the same tokens for the training "
                                  "sentences; the teacher reads each batch in its own ids.", panel=START)
    feature_map: str = opt("skip", "Layers where PT and A-CDL compare [CLS] features: skip (PKD; 12→6 = teacher "
                                   "2,4,6,8,10), last (PKD), or copied.", panel=START,
                           choices=("skip", "last", "copied"))
    feature_pooling: str = opt("cls", "The feature PT and A-CDL compare: cls (the first token's vector, the paper's "
                                      "reading) or mean (the mean over the sentence's tokens).", panel=START,
                               choices=("cls", "mean"))
    teacher_cache: bool = opt(True, "Run the frozen teacher once over the training data and reuse its logits and "
                                    "features every epoch (it is in eval mode: the same numbers up to float "
                                    "rounding); --no-teacher-cache runs it on every batch and keeps no table "
                                    "(N × (labels + mapped layers × hidden) floats).", panel=START)
    alpha: float = opt(0.5, "α, cross-entropy vs KD [0.1, 0.3, 0.5].", panel=LOSS, min=0, max=1)
    beta: float = opt(20.0, "β, patient loss [20, 40, 60].", panel=LOSS, min=0)
    gamma: float = opt(5e-3, "γ, A-CDL [5e-4, 5e-3, 5e-2].", panel=LOSS, min=0)
    temperature: float = opt(5.0, "T of KD (loss × T²) [PKD: 5, 10, 20].", panel=LOSS, above=0)
    kd: bool = opt(True, "The KD term.", panel=LOSS)
    pt: bool = opt(True, "The patient loss term.", panel=LOSS)
    acdl: bool = opt(True, "The contrastive term.", panel=LOSS)
    sar: bool = opt(True, "Sample adaptive reweighting (--no-sar: w = 1, plain CDL).", panel=LOSS)
    storage: bool = opt(True, "Dynamic feature storage (--no-storage: negatives from the batch).", panel=LOSS)
    negatives: str = opt("sum", "NEG of Eq. 2 over the negatives: sum (the paper's formula) or mean.", panel=LOSS,
                         choices=("sum", "mean"))
    contrast_temperature: float = opt(1.0, "τ dividing the cosines of A-CDL (1: the paper, which has none; MoCo "
                                           "uses 0.07).", panel=LOSS, above=0)
    storage_size: int = opt(1000, "Samples kept in the storage (FIFO).", panel=LOSS, min=1)
    predictor_layers: int = opt(2, "Depth of the SAR predictor MLP [2, 3, 4].", panel=LOSS, min=1)
    label_bins: int | None = opt(None, "Regression labels: equal-width bins used as classes by the contrastive "
                                       "term.", panel=LOSS, min=2)
    # a count on every device: ACKD's negatives are the batch's other sentences (options/batching.py)
    BATCH_SIZE: ClassVar[int] = 32
    GPU_MAX_TOKENS: ClassVar[int | None] = None

    batch_size: int | None = opt(None, "Sentences per batch and process [8, 16, 32]; a count on a GPU too (ACKD's "
                                       "negatives are the batch's other sentences). [default: 32]", panel=OPT, min=1)
    warmup_ratio: float = opt(0.1, "Warmup as a share of all steps.", panel=OPT, min=0, below=1)
    validation: str | None = opt(None, "Labelled validation data (accuracy, F1, MCC; Pearson for regression).",
                                 panel=VAL, metavar="DATA")
    eval_limit: int | None = opt(None, "Validation rows used. [default: all]", panel=VAL, min=1)
    metric: str = opt("accuracy", "Keep the checkpoint best by this: accuracy, f1, mcc (pearson, spearman for "
                                  "regression).", panel=VAL, choices=CLASSIFIER_METRICS)
    text_column: str | None = opt(None, "Sentence column. [default: auto]", panel=DATA)
    text_pair_column: str | None = opt(None, "Second sentence of a pair.", panel=DATA)
    label_column: str | None = opt(None, "Label column. [default: label]", panel=DATA)
    split: str | None = opt(None, f"Split of DATA ({SPLITS}).", panel=DATA)
    validation_split: str | None = opt(None, "Split of --validation.", panel=DATA)
    limit: int | None = opt(None, "Use only the first N training rows.", panel=DATA, min=1)
    max_length: int | None = opt(None, "Truncate inputs to this many tokens. [default: 128, the paper's, or the "
                                       "model's positions or tokenizer limit where smaller]", panel=DATA, min=1)
    trust_remote_code: bool = opt(False, "Allow models' own code from the hub.")
    allow_pickle: bool = opt(False, "Load pickle weights (pytorch_model.bin) with torch.load(weights_only=True); "
                                    "refused by default, since pickles can run code.")

    def check(self) -> None:
        if self.teacher is None and self.student is None:
            raise UserError("give --teacher T with --layers K (or --student S), or --student S alone to fine-tune it")
        copying = self.layers is not None or self.layer_ids is not None
        if copying and self.teacher is None and self.student is None:
            raise UserError("--layers/--layer-ids copy layers of --teacher (or of --student); give one")
        if self.layers is not None and self.layer_ids is not None:
            raise UserError("--layers and --layer-ids exclude each other")
        if self.teacher is not None and not copying and self.student is None:
            raise UserError("give the student: --layers K (copied from the teacher) or --student S")
        super().check()

    @property
    def finetune(self) -> bool:
        """No teacher: cross-entropy only."""
        return self.teacher is None

    def terms(self) -> list[str]:
        if self.finetune:
            return ["ce"]
        on = {"kd": self.kd and self.alpha < 1, "pt": self.pt, "acdl": self.acdl}  # α = 1 leaves KD no weight
        return ["ce"] + [name for name, used in on.items() if used]
