"""The names of the metrics modelshrink reports, by task: the one list that the options, the steps, `eval`,
the model cards and `eval --compare` read.

A leaf (it imports nothing), so the options offer these names as choices without loading a scorer, torch or
rouge-score. The order here is the order of help text, tables and outputs.
"""

from __future__ import annotations

ROUGE_METRICS = ("rouge1", "rouge2", "rougeL", "rougeLsum")  # summaries: rouge-score's F1 × 100
TRANSLATION_METRICS = ("bleu", "chrf")  # sacreBLEU's corpus BLEU and chrF
CLASSIFICATION_METRICS = ("accuracy", "f1", "mcc")
REGRESSION_METRICS = ("pearson", "spearman")

SEQ2SEQ_METRICS = ROUGE_METRICS + TRANSLATION_METRICS  # what validation of generated text reports
CLASSIFIER_METRICS = CLASSIFICATION_METRICS + REGRESSION_METRICS  # what validation of a classifier reports
ALL_METRICS = SEQ2SEQ_METRICS + CLASSIFIER_METRICS

# each metric -> (the Hub's metric type, its display name), for a model card's model-index; in ALL_METRICS's order
RESULT_METRICS = {"rouge1": ("rouge", "ROUGE-1"), "rouge2": ("rouge", "ROUGE-2"), "rougeL": ("rouge", "ROUGE-L"),
               "rougeLsum": ("rouge", "ROUGE-Lsum"), "bleu": ("sacrebleu", "BLEU"), "chrf": ("chrf", "chrF"),
               "accuracy": ("accuracy", "Accuracy"), "f1": ("f1", "F1"), "mcc": ("matthews_correlation", "MCC"),
               "pearson": ("pearsonr", "Pearson"), "spearman": ("spearmanr", "Spearman")}
