"""Facts that have one home (issue 56, item 3): a reviewer grepping src/ for the fact finds its definition once,
and every other module imports it."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path
from types import SimpleNamespace

SRC = Path(__file__).resolve().parents[1] / "src" / "modelshrink"


def _modules_matching(pattern: str) -> set[str]:
    return {str(path.relative_to(SRC)) for path in SRC.rglob("*.py")
            if re.search(pattern, path.read_text(), re.MULTILINE)}


def test_whether_a_model_is_quantized_is_answered_by_one_function():
    from transformers import BartConfig

    from modelshrink.quant.model import QUANT_METHOD, is_quantized

    assert _modules_matching(r"[\"']quant_method[\"']") == {"quant/model.py"}  # only the format's module reads it
    assert _modules_matching(r"def _?(is_)?quantized\(") == {"quant/model.py"}
    ours, theirs = {"quant_method": QUANT_METHOD, "bits": "2-2-8"}, {"quant_method": "bitsandbytes"}
    assert is_quantized(BartConfig(quantization_config=ours))  # a transformers config keeps it as a dict
    assert is_quantized({"quantization_config": ours})  # config.json as read
    assert is_quantized(SimpleNamespace(quantization_config=SimpleNamespace(quant_method=QUANT_METHOD)))
    for other in (BartConfig(), BartConfig(quantization_config=theirs), {"quantization_config": theirs}, {}, [],
                  {"quantization_config": None}):
        assert not is_quantized(other), other


def test_the_version_is_written_once_in_a_leaf_that_pyproject_and_the_package_read():
    import modelshrink
    from modelshrink._version import __version__

    project = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert _modules_matching(r"^__version__\s*=") == {"_version.py"}
    # low modules import the leaf, not the package facade that imports upward
    assert not _modules_matching(r"^from modelshrink import .*\b__version__\b")
    assert modelshrink.__version__ == __version__
    assert importlib.metadata.version("modelshrink") == __version__, \
        "the installed metadata is older than _version.py: pip install -e . again"


def test_which_model_types_only_translate_is_a_family_fact():
    from modelshrink.families import FAMILIES, TRANSLATION_TYPES

    assert _modules_matching(r"^TRANSLATION_TYPES\s*=") == {"families.py"}
    assert _modules_matching(r"\(\s*[\"']marian[\"'],\s*[\"']m2m_100[\"']\s*\)") == {"families.py"}
    assert set(TRANSLATION_TYPES) <= {t for family in FAMILIES for t in family.model_types}


def test_modules_and_functions_stay_small():
    """Issue 56: no module of the package over 450 lines, no function over 80: a reader takes either in at once."""
    import ast

    long_modules = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
                    if (n := len(p.read_text().splitlines())) > 450}
    long_functions = {f"{p.relative_to(SRC)}:{node.name}": node.end_lineno - node.lineno + 1
                      for p in SRC.rglob("*.py") for node in ast.walk(ast.parse(p.read_text()))
                      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.end_lineno - node.lineno + 1 > 80}
    assert not long_modules and not long_functions, (long_modules, long_functions)
