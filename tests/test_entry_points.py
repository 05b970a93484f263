"""Bad input at every entry point gets one clear line (issue 57): `run`'s numbers, `eval --against` across tasks,
usage errors of the command line."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from conftest import write_jsonl
from modelshrink.cli import app

runner = CliRunner()


def _one_line(result, code: int, *fragments: str) -> str:
    output = result.output.strip()
    assert result.exit_code == code, output
    assert len(output.splitlines()) == 1 and output.startswith("Error: "), output
    assert "Traceback" not in output and "╭" not in output
    for fragment in fragments:
        assert fragment in output, output
    return output


@pytest.fixture(scope="module")
def bart_export(plain_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "bart-onnx"
    result = runner.invoke(app, ["export", str(plain_models["bart"]), "-o", str(out), "--no-validate"])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("option", ["--batch-size", "--max-length", "--limit", "--num-beams", "--threads"])
def test_run_refuses_a_number_below_one_naming_the_option(option, bart_export, docs_jsonl):
    result = runner.invoke(app, ["run", str(bart_export), "--input", str(docs_jsonl), option, "0"])
    _one_line(result, 2, f"{option} must be >= 1, got 0")


def test_run_library_refuses_the_same_numbers(bart_export, docs_jsonl):
    from modelshrink.runtime.cli import run_file
    from modelshrink.runtime.errors import UserError

    with pytest.raises(UserError, match="--batch-size must be >= 1, got 0"):
        list(run_file(str(bart_export), str(docs_jsonl), batch_size=0))


def test_eval_against_an_evaluation_of_another_task_is_refused_before_generating(saved_models, docs_jsonl, tmp_path):
    labels = write_jsonl(tmp_path / "labels.jsonl", [{"id": f"doc-{i}", "prediction": i % 2, "label": i % 2}
                                                     for i in range(12)])
    classified = tmp_path / "eval-classes"
    assert runner.invoke(app, ["eval", str(labels), "-o", str(classified)]).exit_code == 0
    summaries = write_jsonl(tmp_path / "summaries.jsonl", [{"id": f"doc-{i}", "prediction": "a summary",
                                                            "reference": "the summary"} for i in range(12)])
    result = runner.invoke(app, ["eval", str(summaries), "-o", str(tmp_path / "e"), "--against", str(classified)])
    _one_line(result, 1, "is an evaluation of classification, this run's task is summarization")
    result = runner.invoke(app, ["eval", str(saved_models["bart"]), str(docs_jsonl), "-o", str(tmp_path / "m"),
                                 "--against", str(classified)])
    _one_line(result, 1, "compare summarization with summarization")
    assert not (tmp_path / "e").exists() and not (tmp_path / "m").exists()


@pytest.mark.parametrize("args,fragments", [
    (["pseudolabel", "t", "d", "-o", "x", "--num-beams", "zero"], ["Invalid value for '--num-beams'",
                                                                    "(see 'modelshrink pseudolabel --help')"]),
    (["pseudolabel", "t", "d", "-o", "x", "--config", "missing.toml"], ["'--config'", "does not exist"]),
    # the option is named; its quoting is Click's and Typer's wording, which changes between their versions
    (["distill", "d", "--bogus"], ["No such option", "--bogus", "(see 'modelshrink distill --help')"]),
    (["eval", "m", "d", "--target-lang"], ["'--target-lang' requires an argument"]),
])
def test_usage_errors_are_one_line_naming_the_option(args, fragments, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_line(runner.invoke(app, args), 2, *fragments)


def test_a_recipe_value_that_does_not_parse_is_one_line_naming_file_and_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.toml").write_text("[pseudolabel]\nlambda_range = [1.0]\n")
    result = runner.invoke(app, ["pseudolabel", "t", "d", "-o", "x", "--config", "r.toml"])
    _one_line(result, 1, "config r.toml: [pseudolabel] lambda_range = [1.0]: expected a list of 2 numbers")


def _broken_copy(saved_models, tmp_path, how: str):
    import json
    import shutil

    folder = tmp_path / f"teacher-{how}"
    shutil.copytree(saved_models["bart"], folder)
    if how in ("deleted", "rebuilt"):
        (folder / "tokenizer.json").unlink()
    if how == "rebuilt":  # the tokenizer class of a BART checkpoint: rebuilt from its config, it has 5 tokens
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "BartTokenizer"}))
    if how == "other":  # another model's tokenizer: T5's, whose pad and eos ids differ
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(saved_models["t5"] / name, folder / name)
    return folder


@pytest.mark.parametrize("how,fragment", [("deleted", "tokenizer"), ("rebuilt", "only its special ones"),
                                          ("other", "pad_token_id is 0, the model's 1")])
@pytest.mark.parametrize("step", ["pseudolabel", "export"])
def test_a_model_whose_tokenizer_does_not_fit_is_refused_in_one_line(how, fragment, step, saved_models, docs_jsonl,
                                                                    tmp_path):
    teacher = _broken_copy(saved_models, tmp_path, how)
    args = [str(teacher), str(docs_jsonl)] if step == "pseudolabel" else [str(teacher), "--no-validate"]
    result = runner.invoke(app, [step, *args, "-o", str(tmp_path / "out")])
    _one_line(result, 1, str(teacher), fragment)
    assert not (tmp_path / "out").exists()


def test_quickstart_refuses_a_length_beyond_the_teachers_positions_before_making_its_folder(tmp_path):
    result = runner.invoke(app, ["quickstart", "--max-source-length", "100000", "-o", str(tmp_path / "out")])
    _one_line(result, 1, "--max-source-length 100000 is more than the packaged MiniLM's 512 positions")
    assert not (tmp_path / "out").exists()
