"""The metric names have one home, modelshrink.metrics.names: no other module writes a list of them, and
the home loads nothing heavy, so the options can offer the names as choices."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from modelshrink.metrics import glue
from modelshrink.metrics.names import (ALL_METRICS, CLASSIFIER_METRICS, CLASSIFICATION_METRICS, REGRESSION_METRICS,
                                       RESULT_METRICS, ROUGE_METRICS, SEQ2SEQ_METRICS, TRANSLATION_METRICS)

SRC = Path(__file__).resolve().parents[1] / "src" / "modelshrink"
HOME = SRC / "metrics" / "names.py"
# lists of metric names that are not lists of reported metrics
ALLOWED = {SRC / "metrics" / "style.py": "rouge-score's types for matching summary sentences to the document"}


def _name_lists(path: Path) -> list[int]:
    """Lines where a tuple, list or set holding two or more metric-name literals is written."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, (ast.Tuple, ast.List, ast.Set))
            and sum(isinstance(e, ast.Constant) and e.value in ALL_METRICS for e in node.elts) >= 2]


def test_no_module_but_the_home_writes_a_list_of_metric_names():
    found = {f"{path.relative_to(SRC)}:{line}" for path in SRC.rglob("*.py")
             if path != HOME and path not in ALLOWED for line in _name_lists(path)}
    assert not found, f"metric names written outside metrics/names.py (import them from there): {sorted(found)}"
    assert _name_lists(HOME), "the test no longer sees the home's own lists"


def test_the_names_by_task_make_the_derived_tuples_in_output_order():
    assert SEQ2SEQ_METRICS == ROUGE_METRICS + TRANSLATION_METRICS
    assert CLASSIFIER_METRICS == CLASSIFICATION_METRICS + REGRESSION_METRICS
    assert ALL_METRICS == ("rouge1", "rouge2", "rougeL", "rougeLsum", "bleu", "chrf", "accuracy", "f1", "mcc",
                           "pearson", "spearman")
    assert tuple(RESULT_METRICS) == ALL_METRICS
    assert tuple(glue.GLUE_CONVENTIONS) == CLASSIFIER_METRICS


def test_the_options_offer_the_names_without_loading_a_scorer():
    code = ("import sys; from modelshrink.options import contrastive, distill, quantize; "
            "print(sorted(m for m in ('torch', 'rouge_score', 'sacrebleu', 'numpy') if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_the_options_choices_are_the_names():
    from modelshrink.options.contrastive import ContrastiveOptions
    from modelshrink.options.distill import DistillOptions
    from modelshrink.options.quantize import QuantizeOptions

    from modelshrink.options import spec_of

    def choices(cls):
        return spec_of(cls.__dataclass_fields__["metric"]).choices

    assert tuple(choices(DistillOptions)) == SEQ2SEQ_METRICS
    assert tuple(choices(ContrastiveOptions)) == CLASSIFIER_METRICS
    assert tuple(choices(QuantizeOptions)) == ALL_METRICS + (None,)
