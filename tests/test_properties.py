"""Property-based checks of every entry point (issue 57): whatever option values and small corrupt inputs a user
gives, a command either does its work or stops with one line `Error: ...`, a non-zero exit, no traceback and
nothing written; the Python API either builds the options or raises UserError in one line.

Hypothesis draws the values: for every field of every step's options, values of the wrong type, out of range,
nan, empty strings, and right ones; for the inputs, files of a few bytes of junk, JSON of the wrong shape,
half-written JSON lines, and folders with a damaged config.json.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import typing

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from typer.testing import CliRunner

import modelshrink.cli  # noqa: F401  (registers every step's options class)
from modelshrink.cli import app
from modelshrink.commands._from_options import OPTIONS_OF
from modelshrink.errors import UserError
from modelshrink.options import _unwrap, flag_of, spec_of

runner = CliRunner()
CASES = itertools.count()  # one folder per drawn case
STEPS = ("pseudolabel", "distill", "quantize", "contrastive", "eval", "export")
# derandomized: CI draws the same cases on every run (a new failure is found by raising max_examples locally)
QUICK = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])
# a drawn command line that is valid runs the step for real: fewer of those (the suite must stay well under 15 min)
QUICK_CLI = settings(QUICK, max_examples=12)

ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-3, max_value=10 ** 6), st.floats(allow_nan=True),
    st.text(max_size=6), st.lists(st.integers(min_value=-2, max_value=9), max_size=3),
    st.lists(st.floats(min_value=-2, max_value=3), max_size=3),
)


def _fields(step: str) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(OPTIONS_OF[step]) if not spec_of(f).argument]


@pytest.mark.parametrize("step", STEPS)
@QUICK
@given(data=st.data())
def test_the_api_builds_the_options_or_raises_one_user_error_line(step, data):
    cls = OPTIONS_OF[step]
    required = {f.name: "x" for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING}
    chosen = data.draw(st.lists(st.sampled_from(_fields(step)), max_size=3, unique_by=lambda f: f.name))
    values = {f.name: data.draw(ANY_VALUE, label=f.name) for f in chosen}
    try:
        cls(**{**required, "max_steps": 1, **values} if "max_steps" in {f.name for f in dataclasses.fields(cls)}
            else {**required, **values})
    except UserError as e:
        assert str(e) and "\n" not in str(e), str(e)


def _cli_value(f: dataclasses.Field, hints: dict) -> st.SearchStrategy:
    """A command-line value for field `f`: anything a user might type, right or wrong."""
    inner = _unwrap(hints[f.name])
    words = st.sampled_from(["0", "-1", "1", "2.5", "nan", "inf", "", "abc", "1e9", "[1]", "a,b", "0,1"])
    if typing.get_origin(inner) is tuple:
        return st.lists(words, min_size=2, max_size=2)
    return words.map(lambda w: [w])


@pytest.mark.slow
@pytest.mark.parametrize("step", STEPS)
@QUICK_CLI
@given(data=st.data())
def test_the_command_line_does_its_work_or_stops_in_one_line_writing_nothing(step, data, saved_models, tmp_path):
    cls = OPTIONS_OF[step]
    hints = typing.get_type_hints(cls)
    corrupt = data.draw(st.sampled_from(["missing", "junk", "wrong-shape", "torn", "empty"]), label="input")
    folder = tmp_path / f"case-{next(CASES)}"
    folder.mkdir()
    source = folder / "data.jsonl"
    if corrupt != "missing":
        source.write_bytes({"junk": b"\x00\xff\x13garbage", "wrong-shape": b'[1, 2]\n{"x": 3}\n',
                            "torn": b'{"id": "a", "document": "the fox', "empty": b""}[corrupt])
    model = data.draw(st.sampled_from([str(saved_models["bart"]), str(folder / "no-model")]), label="model")
    positional = {"pseudolabel": [model, str(source)], "distill": [str(source), "--student", model],
                  "quantize": [model, str(source)], "contrastive": [str(source), "--teacher", model, "--layers", "1"],
                  "eval": [model, str(source)], "export": [model]}[step]
    flags: list[str] = []
    for f in data.draw(st.lists(st.sampled_from(_fields(step)), max_size=2, unique_by=lambda f: f.name)):
        if _unwrap(hints[f.name]) is bool:
            flags.append(flag_of(f))
        else:
            flags += [flag_of(f), *data.draw(_cli_value(f, hints), label=f.name)]
    if step in ("distill", "quantize", "contrastive") and "--max-steps" not in flags:
        flags += ["--max-steps", "1"]
    out = folder / "out"
    result = runner.invoke(app, [step, *positional, "-o", str(out), *flags])
    if result.exit_code == 0:
        return  # a valid input: the run did its work
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    lines = [line for line in result.output.strip().splitlines() if line.startswith("Error: ")]
    assert lines and "Traceback" not in result.output, result.output
    assert not out.exists(), (result.output, sorted(p.name for p in out.iterdir()))


@QUICK
@given(content=st.binary(max_size=40) | st.sampled_from([b"{", b"[]", b'{"model_type": 3}',
                                                          b'{"model_type": "bart", "d_model": "wide"}']))
def test_a_damaged_config_is_one_line(content, saved_models, tmp_path_factory):
    import shutil

    folder = tmp_path_factory.mktemp("damaged") / "model"
    shutil.copytree(saved_models["bart"], folder)
    (folder / "config.json").write_bytes(content)
    out = folder.parent / "out"
    result = runner.invoke(app, ["export", str(folder), "-o", str(out), "--no-validate"])
    assert result.exit_code == 1, result.output
    assert result.output.strip().startswith("Error: ") and len(result.output.strip().splitlines()) == 1, result.output
    assert not out.exists()


def test_the_cases_are_drawn_from_every_option():
    """The command-line property walks every non-positional option of every step (none is left out by a filter)."""
    for step in STEPS:
        assert _fields(step), step
        assert all(flag_of(f).startswith("--") for f in _fields(step))
    json.dumps([flag_of(f) for step in STEPS for f in _fields(step)])


RUN_FLAGS = ("--limit", "--batch-size", "--num-beams", "--max-length", "--column")


@pytest.mark.slow
@QUICK
@given(flags=st.lists(st.tuples(st.sampled_from(RUN_FLAGS),
                                st.sampled_from(["0", "-1", "1", "2", "abc", "", "2.5", "document", "nope"])),
                      max_size=3),
       corrupt=st.sampled_from(["missing", "junk", "wrong-shape", "torn", "empty", "good"]))
def test_run_does_its_work_or_stops_in_one_line(flags, corrupt, plain_models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    export = _bart_export(plain_models, tmp_path_factory)
    source = folder / "docs.jsonl"
    if corrupt != "missing":
        source.write_bytes({"junk": b"\x00\xff\x13garbage", "wrong-shape": b'[1, 2]\n{"x": 3}\n',
                            "torn": b'{"id": "a", "document": "the fox', "empty": b"",
                            "good": b'{"id": "a", "document": "the quick brown fox"}\n'}[corrupt])
    result = runner.invoke(app, ["run", str(export), "--input", str(source), *[x for pair in flags for x in pair]])
    if result.exit_code == 0:
        return
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code in (1, 2) and "Traceback" not in result.output, result.output
    assert result.output.strip().startswith("Error: ") and len(result.output.strip().splitlines()) == 1, result.output


_EXPORTS: dict = {}


def _bart_export(plain_models, tmp_path_factory):
    if "bart" not in _EXPORTS:
        out = tmp_path_factory.mktemp("export") / "bart-onnx"
        result = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(out), "--no-validate"])
        assert result.exit_code == 0, result.output
        _EXPORTS["bart"] = out
    return _EXPORTS["bart"]


@QUICK
@given(data=st.data())
def test_quickstart_options_are_taken_or_refused_in_one_line(data, tmp_path_factory, monkeypatch):
    """quickstart's options, drawn (the chain itself is replaced by a stub: a valid set of options would run it)."""
    import modelshrink.quickstart

    ran = []
    monkeypatch.setattr(modelshrink.quickstart, "run_quickstart", lambda options, output, **kw: ran.append(output)
                        or {"systems": []})
    hints = typing.get_type_hints(OPTIONS_OF["quickstart"])
    flags: list[str] = []
    for f in data.draw(st.lists(st.sampled_from(_fields("quickstart")), max_size=3, unique_by=lambda f: f.name)):
        flags += [flag_of(f), *data.draw(_cli_value(f, hints), label=f.name)]
    out = tmp_path_factory.mktemp("qs") / "out"
    result = runner.invoke(app, ["quickstart", "-o", str(out), *flags])
    if result.exit_code == 0 or ran:
        return
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.output.strip().startswith("Error: ") and len(result.output.strip().splitlines()) == 1, result.output
    assert not out.exists()
