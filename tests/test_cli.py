"""The command line: exit codes, one-line errors, nothing written on bad input, stdout = path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import DOCUMENTS, SUMMARIES, read_rows, write_jsonl
from modelshrink.artifacts import staging_path
from modelshrink.cli import app

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def assert_one_line_error(result, code, *fragments):
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert result.stdout == ""
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_success_prints_only_the_path_and_chains(saved_models, docs_jsonl, tmp_path):
    out = tmp_path / "pl"
    result = invoke("pseudolabel", saved_models["bart"], docs_jsonl, "-o", out, "--lambda", "2.0", "--device", "cpu")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{out}\n"
    # the output is a dataset artifact another step can read
    again = invoke("pseudolabel", saved_models["t5"], result.stdout.strip(), "-o", tmp_path / "pl2", "--limit", "3")
    assert again.exit_code == 0, again.stderr
    assert len(read_rows(tmp_path / "pl2")) == 3


def test_lambda_range_option(saved_models, docs_jsonl, tmp_path):
    result = invoke("pseudolabel", saved_models["t5"], docs_jsonl, "-o", tmp_path / "pl", "--lambda-range", "1", "2",
                    "--seed", "3", "--lambda-cross", "1.5")
    assert result.exit_code == 0, result.stderr
    rows = read_rows(tmp_path / "pl")
    assert all(1 <= r["lambda"] <= 2 and r["lambda_by_kind"]["decoder_cross"] == 1.5 for r in rows)


def test_config_recipe_supplies_options_and_the_command_line_wins(saved_models, docs_jsonl, tmp_path):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(f'[pseudolabel]\nteacher = "{saved_models["bart"]}"\ndata = "{docs_jsonl}"\n'
                      f'lambda = 2.0\nnum-beams = 3\nlimit = 4\n')
    result = invoke("--config", recipe, "pseudolabel", "-o", tmp_path / "pl", "--limit", "2")
    assert result.exit_code == 0, result.stderr
    manifest = json.loads((tmp_path / "pl" / "modelshrink.json").read_text())
    assert manifest["options"]["lambda"] == 2.0 and manifest["options"]["num_beams"] == 3
    assert manifest["options"]["limit"] == 2
    bad = tmp_path / "bad.toml"
    bad.write_text("[pseudolabel]\nlambada = 2.0\n")
    assert_one_line_error(invoke("--config", bad, "pseudolabel", "-o", tmp_path / "x"), 1, "no option 'lambada'")


def _bad_inputs(tmp_path, saved_models, classifier_path, docs_jsonl):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    no_text = write_jsonl(tmp_path / "notext.jsonl", [{"body": "x", "tldr": "y"}])
    bad_line = tmp_path / "badline.jsonl"
    bad_line.write_text('{"document": "fine"}\n{"document": "broken\n')
    corrupt = tmp_path / "corrupt.jsonl.gz"
    corrupt.write_bytes(b"\x1f\x8b not really gzip")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "something").write_text("x")
    t = saved_models["bart"]
    return {
        "missing data": ([t, tmp_path / "nope.jsonl"], ["does not exist"]),
        "unreadable data": ([t, corrupt], ["cannot read"]),
        "empty dataset": ([t, empty], ["has no rows"]),
        "missing text column": ([t, no_text], ["no text column", "columns found: body, tldr"]),
        "named column missing": ([t, docs_jsonl, "--text-column", "body"], ["no column 'body'", "document"]),
        "undecodable line": ([t, bad_line], ["line 2 is not valid JSON"]),
        "lambda zero": ([t, docs_jsonl, "--lambda", "0"], ["--lambda must be > 0"]),
        "lambda negative": ([t, docs_jsonl, "--lambda", "-1"], ["--lambda must be > 0"]),
        "range reversed": ([t, docs_jsonl, "--lambda-range", "2", "1"], ["A <= B"]),
        "not seq2seq": ([classifier_path, docs_jsonl], ["not an encoder-decoder", "bert",
                                                        "BertForSequenceClassification"]),
        "teacher missing": ([tmp_path / "no-model", docs_jsonl], ["does not exist"]),
        "teacher is a dataset": ([docs_jsonl, docs_jsonl], ["is a file"]),
    }, a_file, taken


@pytest.mark.parametrize("case", [
    "missing data", "unreadable data", "empty dataset", "missing text column", "named column missing",
    "undecodable line", "lambda zero", "lambda negative", "range reversed", "not seq2seq", "teacher missing",
    "teacher is a dataset",
])
def test_bad_input_is_one_line_exit_1_nothing_written(case, tmp_path, saved_models, classifier_path, docs_jsonl):
    cases, _, _ = _bad_inputs(tmp_path, saved_models, classifier_path, docs_jsonl)
    args, fragments = cases[case]
    out = tmp_path / "out"
    assert_one_line_error(invoke("pseudolabel", *args, "-o", out), 1, *fragments)
    assert not out.exists() and not staging_path(out).exists()


def test_output_that_exists_or_is_a_file(tmp_path, saved_models, classifier_path, docs_jsonl):
    _, a_file, taken = _bad_inputs(tmp_path, saved_models, classifier_path, docs_jsonl)
    assert_one_line_error(invoke("pseudolabel", saved_models["bart"], docs_jsonl, "-o", a_file), 1, "is a file")
    assert a_file.read_text() == "x"
    assert_one_line_error(invoke("pseudolabel", saved_models["bart"], docs_jsonl, "-o", taken), 1,
                          "already exists", "--overwrite")
    assert sorted(p.name for p in taken.iterdir()) == ["something"]
    ok = invoke("pseudolabel", saved_models["bart"], docs_jsonl, "-o", taken, "--overwrite", "--limit", "2")
    assert ok.exit_code == 0 and sorted(p.name for p in taken.iterdir()) == ["data.jsonl", "modelshrink.json"]


def test_usage_errors_exit_2(saved_models, docs_jsonl):
    assert invoke("pseudolabel", saved_models["bart"], docs_jsonl).exit_code == 2  # no --output
    assert invoke("pseudolabel", saved_models["bart"], docs_jsonl, "-o", "x", "--lambda", "two").exit_code == 2
    assert invoke("no-such-command").exit_code == 2


def test_help_lists_defaults_and_an_example():
    result = invoke("pseudolabel", "--help")
    assert result.exit_code == 0
    for text in ("--lambda-range", "--num-beams", "--output-temperature", "--resume", "default: 16",
                 "modelshrink pseudolabel runs/teacher train.jsonl"):
        assert text in result.stdout
    assert "pseudolabel" in invoke("--help").stdout


@pytest.fixture(scope="module")
def offline(saved_models, tmp_path_factory):
    """The offline runs below, each in a fresh interpreter (the hub libraries read HF_HUB_OFFLINE and HF_HOME when
    they are imported), all started at once: each is mostly one core importing torch, and two cores run two at a time.
    Returns name -> (the finished run, its output folder)."""
    root = tmp_path_factory.mktemp("offline")
    docs = write_jsonl(root / "docs.jsonl", [{"id": f"doc-{i}", "document": d, "summary": s}
                                             for i, (d, s) in enumerate(zip(DOCUMENTS, SUMMARIES))])
    # a hub name resolves from the local cache: the tiny BART, built here by hand in the hub cache layout
    repo = root / "cached-model" / "hf" / "hub" / "models--tiny--bart"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for f in Path(saved_models["bart"]).iterdir():
        (snapshot / f.name).write_bytes(f.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    runs = {"uncached model": (["pseudolabel", "someone/not-a-cached-model", docs], {}),
            "cached model": (["pseudolabel", "tiny/bart", docs, "--limit", "2"], {}),
            "uncached dataset": (["pseudolabel", saved_models["bart"], "someone/not-a-cached-dataset"],
                                 {"HF_DATASETS_OFFLINE": "1"})}
    started = {}
    for name, (args, env) in runs.items():
        folder = root / name.replace(" ", "-")
        folder.mkdir(exist_ok=True)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(folder / "hf"), **env}
        process = subprocess.Popen([sys.executable, "-m", "modelshrink", *map(str, args), "-o", str(folder / "o")],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        started[name] = process, folder / "o"
    finished = {}

    def result(name):
        if name not in finished:
            process, out = started[name]
            stdout, stderr = process.communicate(timeout=300)
            finished[name] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), out
        return finished[name]

    yield result
    for process, _ in started.values():  # the runs of tests that were deselected or failed first
        process.kill()
        process.wait()


@pytest.mark.slow
def test_uncached_hub_name_offline_is_a_clear_error(offline):
    result, out = offline("uncached model")
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("Error: teacher someone/not-a-cached-model is not a "
                                                              "local folder and is not in the Hugging Face cache")
    assert not out.exists()


@pytest.mark.slow
def test_cached_hub_name_works_offline(offline):
    """A hub name resolves from the local cache (built by hand in the hub cache layout, see `offline`)."""
    result, out = offline("cached model")
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "modelshrink.json").read_text())
    assert {"role": "teacher", "hub": "tiny/bart"} in manifest["parents"]


@pytest.mark.slow
def test_interrupted_cli_run_resumes(saved_models, docs_jsonl, tmp_path, monkeypatch):
    import modelshrink.generation.summarizer as pl  # where pseudolabel's teacher generates

    original = pl.generate_ids
    calls = {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(pl, "generate_ids", flaky)  # transformers' generate (the static search's resume: test_staticgen)
    out = tmp_path / "pl"
    args = ("--batch-size", "4", "--generator", "transformers")
    first = invoke("pseudolabel", saved_models["bart"], docs_jsonl, "-o", out, *args)
    assert first.exit_code == 130 and "--resume" in first.stderr and not out.exists()
    second = invoke("pseudolabel", saved_models["bart"], docs_jsonl, "-o", out, *args, "--resume")
    assert second.exit_code == 0, second.stderr
    assert len(read_rows(out)) == 12 and calls["n"] == 1 + 1 + 2  # batch 1, the interrupt, batches 2 and 3


@pytest.mark.slow
def test_uncached_hub_dataset_offline_is_a_clear_error(offline):
    result, out = offline("uncached dataset")
    assert result.returncode == 1, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: data someone/not-a-cached-dataset is not a local path, and loading it as a hub "
                           "dataset failed"), last
    assert not out.exists()
