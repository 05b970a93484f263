"""Options of `modelshrink eval` (one system; `--compare` takes its own few options)."""

from __future__ import annotations

from typing import ClassVar

from modelshrink.errors import UserError
from modelshrink.metrics.stats import SIGNIFICANCE_METHODS
from modelshrink.options import REQUIRED, opt, options_class
from modelshrink.options.generation import GEN, TemperatureOptions
from modelshrink.options.train import SPLITS

SCORE = "Scoring"
TASKS = ("auto", "summarization", "translation")  # of generated text
COLS = "Columns"


@options_class
class EvalOptions(TemperatureOptions):
    """Every option of `modelshrink eval MODEL DATA` or `modelshrink eval PREDICTIONS`."""

    STEP: ClassVar[str] = "eval"

    model: str | None = opt(None, "A model (or export folder) that generates or predicts.", argument=True)
    data: str = opt(REQUIRED, "The data to evaluate on, or a file or artifact that already holds predictions.",
                    argument=True)
    against: str | None = opt(None, "Paired significance test against OTHER on the same documents: an eval artifact "
                                    "or a predictions file.", panel=SCORE)
    significance: str = opt("permutation", "permutation (approximate randomization) or bootstrap (paired).",
                            panel=SCORE, choices=SIGNIFICANCE_METHODS)
    task: str = opt("auto", "What generated text is scored as: summarization (ROUGE, style) or translation (sacreBLEU's "
                            "BLEU and chrF); auto: translation when the rows are source/target pairs, else "
                            "summarization. Classifiers are found from the model or the labels.", panel=SCORE,
                    choices=TASKS)
    limited_length_recall: bool = opt(False, "Also ROUGE recall with predictions cut to the reference's length (NYT "
                                             "protocol, PLATE Table 2).", panel=SCORE)
    resamples: int = opt(1000, "Bootstrap resamples for the 95% intervals.", panel=SCORE, min=100)
    significance_resamples: int = opt(10000, "Resamples of the significance test.", panel=SCORE, min=100)
    seed: int = opt(0, "Seed of the bootstrap, the significance test and --lambda-range draws.", panel=SCORE)
    reference_size: str | None = opt(None, "Model folder whose bytes on disk the compression ratio is taken "
                                           "against.", panel=SCORE, metavar="TEACHER")
    latency_docs: int = opt(16, "Documents timed one at a time (batch 1) after 2 warm-up; 0 skips.", panel=SCORE,
                            min=0)
    tokenizer: str | None = opt(None, "Tokenizer for token lengths of a predictions file.", panel=SCORE)
    allow_empty: bool = opt(False, "Score the outputs even when every one is empty (refused otherwise: all-empty "
                                   "outputs mean a translator without --target-lang or a broken model, not a "
                                   "score).", panel=SCORE)
    batch_size: int | None = opt(None, "Batch size (throughput is measured at it). [default: 16; on a GPU, "
                                       "--max-tokens 16384 instead]", panel=GEN, min=1)
    threads: int | None = opt(None, "An export folder's onnxruntime threads, for scoring and latency. [default: every "
                                    "core] One is faster for a small model at batch 1 (a 6+3 MiniLM student: 1.15× "
                                    "on 2 cores), every core at batch 16.", panel=GEN, min=1)
    split: str | None = opt(None, f"Split of {SPLITS}.", panel=COLS)
    text_column: str | None = opt(None, "Document / sentence column. [default: auto]", panel=COLS)
    summary_column: str | None = opt(None, "MODEL DATA: the gold summary column. [default: auto]", panel=COLS)
    prediction_column: str | None = opt(None, "PREDICTIONS: the system output. [default: prediction, or summary when "
                                              "a reference column exists]", panel=COLS)
    reference_column: str | None = opt(None, "PREDICTIONS: the gold summary. [default: reference, summary, "
                                             "highlights or target]", panel=COLS)
    references: str | None = opt(None, "PREDICTIONS: take gold summaries from this dataset, matched by id.",
                                 panel=COLS)
    source_lang: str | None = opt(None, "Translation rows nested as {\"translation\": {LANG: text}}: the source "
                                        "language's key (with --target-lang). Also the source language a "
                                        "multilingual translator's tokenizer marks (src_lang).", panel=COLS)
    target_lang: str | None = opt(None, "Nested translation rows: the target language's key. Also the language a "
                                        "multilingual translator (mBART-50, M2M100, NLLB) writes: a code of its "
                                        "tokenizer or its language (de -> de_DE, __de__); alone over flat rows too.",
                                  panel=COLS)
    label_column: str | None = opt(None, "Classifiers: the label column. [default: label]", panel=COLS)
    text_pair_column: str | None = opt(None, "Classifiers: second sentence of a pair.", panel=COLS)
    id_column: str | None = opt(None, "Row id column. [default: id, else the row number]", panel=COLS)
    limit: int | None = opt(None, "Use only the first N rows.", panel=COLS, min=1)
    device: str = opt("auto", "cpu, cuda, cuda:N, or auto.")
    trust_remote_code: bool = opt(False, "Allow the model's own code from the hub.")
    allow_pickle: bool = opt(False, "Load pickle weights (pytorch_model.bin) with torch.load(weights_only=True); "
                                    "refused by default, since pickles can run code.")

    def check(self) -> None:
        if self.model is None:
            for name in ("attention_stats", "attention_plot", "reference_size"):
                if getattr(self, name):
                    raise UserError(f"--{name.replace('_', '-')} needs a model (MODEL DATA), not a predictions file")
            if self.generator != "auto":
                raise UserError(f"--generator {self.generator} chooses who runs a model's search; it needs a model "
                                "(MODEL DATA), not a predictions file")
            if given := self.temperature_options():
                raise UserError(f"{given[0]} sets the attention temperature a model generates at; it needs a model "
                                "(MODEL DATA), not a predictions file")
        self.check_temperature()
        if self.model is not None and self.references is not None:
            raise UserError("--references is for scoring a predictions file; with a model the references come "
                            "from DATA (--summary-column)")
