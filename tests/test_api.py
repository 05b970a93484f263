"""The Python API: README's "From Python" section runs as written on tiny models, every name it exports
resolves to the step's function or options class, each with an example in its docstring."""

from __future__ import annotations

import contextlib
import inspect
import io
import re
import shutil
from pathlib import Path

import pytest

import modelshrink
from conftest import DOCUMENTS, SUMMARIES, write_jsonl

ROOT = Path(__file__).resolve().parents[1]


def _section_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## From Python\n"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


@pytest.mark.slow
def test_readme_from_python_runs_on_tiny_models(saved_models, tmp_path, monkeypatch):
    shutil.copytree(saved_models["bart"], tmp_path / "teacher")
    write_jsonl(tmp_path / "docs.jsonl", [{"id": i, "document": d} for i, d in enumerate(DOCUMENTS)])
    write_jsonl(tmp_path / "valid.jsonl", [{"id": i, "document": d, "summary": s}
                                           for i, (d, s) in enumerate(zip(DOCUMENTS[:4], SUMMARIES[:4]))])
    monkeypatch.chdir(tmp_path)
    blocks = _section_blocks()
    assert len(blocks) == 2
    namespace: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(blocks[0], "README.md (From Python, block 1)", "exec"), namespace)
    lines = printed.getvalue().splitlines()
    assert lines[0].startswith("ROUGE-L ") and "95% interval [" in lines[0]
    assert lines[1].startswith("[") and len(namespace["model"].summarize(["one document"])) == 1
    for name in ("labels", "student", "student-888", "eval-888", "student-onnx"):
        assert (tmp_path / name / "modelshrink.json").is_file(), name
    assert namespace["scores"]["rougeL"] == pytest.approx(float(re.search(r"ROUGE-L ([\d.]+)", lines[0])[1]), abs=0.01)

    # the second block prints the command's own one line, which its comment quotes
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(blocks[1], "README.md (From Python, block 2)", "exec"), namespace)
    said = re.search(r"# (.*)", blocks[1].splitlines()[-1])[1]
    assert printed.getvalue().strip() == said
    assert not (tmp_path / "bad").exists()


def test_every_exported_name_is_the_steps_own(monkeypatch):
    from modelshrink.errors import UserError
    from modelshrink.options.distill import DistillOptions
    from modelshrink.runtime.model import load
    from modelshrink.steps import contrastive, distill, evaluate, export, pseudolabel, quantize

    assert modelshrink.UserError is UserError and modelshrink.DistillOptions is DistillOptions
    assert modelshrink.load is load and modelshrink.export is export.export_model
    for module, name in ((pseudolabel, "pseudolabel"), (distill, "distill"), (quantize, "quantize"),
                         (contrastive, "contrastive"), (evaluate, "evaluate")):
        assert getattr(modelshrink, name) is getattr(module, name)
    assert set(modelshrink.__all__) <= set(dir(modelshrink))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        modelshrink.nothing  # noqa: B018


@pytest.mark.parametrize("name", ["pseudolabel", "distill", "quantize", "contrastive", "evaluate", "export", "load"])
def test_each_function_has_typed_options_and_an_example(name):
    function = getattr(modelshrink, name)
    doc = inspect.getdoc(function)
    # a Markdown block (what the API reference renders as code), of Python that compiles
    example = doc.split("```python\n", 1)[1].split("\n```", 1)[0]
    assert f"modelshrink.{name}(" in example, name
    compile(example, f"modelshrink.{name}'s example", "exec")
    parameters = inspect.signature(function).parameters
    if name != "load":
        options = next(iter(parameters.values()))
        assert options.name == "options" and options.annotation.endswith("Options"), options


def test_importing_modelshrink_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, modelshrink; modelshrink.DistillOptions; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


@pytest.mark.parametrize("build,message", [
    (lambda m: m.DistillOptions(data="d.jsonl", student="s", max_steps="ten"), "--max-steps must be a whole number, got 'ten'"),
    (lambda m: m.ExportOptions(model="m", opset="seventeen"), "--opset must be a whole number, got 'seventeen'"),
    (lambda m: m.PseudolabelOptions(teacher="t", data="d", lambda_range=[1.0]), "--lambda-range must be a list of 2 numbers"),
    (lambda m: m.PseudolabelOptions(teacher="t", data="d", lambda_range=[1.0, "2"]),
     "--lambda-range must be a number for every item"),
    (lambda m: m.EvalOptions(data="d", num_beams=2.5), "--num-beams must be a whole number, got 2.5"),
    (lambda m: m.DistillOptions(data="d", student="s", max_steps=True), "--max-steps must be a whole number, got True"),
    (lambda m: m.QuantizeOptions(model="m", data="d", max_steps=1, kd_hidden="1"), "--kd-hidden must be a number"),
    (lambda m: m.DistillOptions(data="d", student="s", max_steps=1, decoder_layer_ids="0,1"),
     "--decoder-layer-ids must be a list"),
])
def test_options_built_in_python_refuse_a_wrong_type_in_one_line_before_anything_is_written(build, message, tmp_path,
                                                                                              monkeypatch):
    """The options objects check types as the command line does (README: a bad value raises UserError), when they
    are built: nothing has run, so nothing is written."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(modelshrink.UserError) as caught:
        build(modelshrink)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_a_path_is_taken_where_a_path_is_asked_for():
    options = modelshrink.DistillOptions(data=Path("pairs.jsonl"), student=Path("student"), max_steps=1)
    assert options.data == "pairs.jsonl" and options.recorded()["student"] == "student"
    assert modelshrink.PseudolabelOptions(teacher="t", data="d", lam=2).lam == 2  # an int where a float is asked
