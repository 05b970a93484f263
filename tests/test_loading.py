"""Model folders as users have them: damaged or missing files are one line naming the file, pickle
weights are refused unless --allow-pickle, and lengths never run past the model's positions.
(Damaged ONNX export folders: test_runtime.py.)"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from conftest import DOCUMENTS, bert_tokenizer, build, write_jsonl
from modelshrink.artifacts import staging_path
from modelshrink.cli import app
from modelshrink.errors import UserError
from modelshrink.models import load_classifier, load_seq2seq
from modelshrink.quant.model import WEIGHTS_NAME

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(result, *fragments) -> str:
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert result.stdout == ""
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def copy(model: Path, tmp_path: Path, name: str = "model") -> Path:
    return Path(shutil.copytree(model, tmp_path / name))


DAMAGES = {
    "half": lambda data: data[: len(data) // 2],
    "tail cut": lambda data: data[:-64],
    "empty": lambda data: b"",
    "random bytes": lambda data: os.urandom(max(len(data), 64)),
}


@pytest.mark.parametrize("file", ["model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                                  "tokenizer_config.json"])
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_file_is_one_line_naming_it(saved_models, tmp_path, file, damage):
    folder = copy(saved_models["bart"], tmp_path)
    (folder / file).write_bytes(DAMAGES[damage]((folder / file).read_bytes()))
    with pytest.raises(UserError, match=f"cannot load teacher from {folder}: {file} is damaged or incomplete"):
        load_seq2seq(str(folder))


@pytest.mark.parametrize("step", ["pseudolabel", "distill", "eval", "export", "quantize"])
def test_every_step_names_a_truncated_weights_file(step, saved_models, docs_jsonl, tmp_path):
    folder = copy(saved_models["bart"], tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    out = tmp_path / "out"
    args = {"pseudolabel": ["pseudolabel", folder, docs_jsonl],
            "distill": ["distill", docs_jsonl, "--teacher", folder, "--decoder-layers", "1", "--max-steps", "1"],
            "eval": ["eval", folder, docs_jsonl],
            "export": ["export", folder],
            "quantize": ["quantize", folder, "--method", "direct"]}[step]
    one_line_error(invoke(*args, "-o", out), "model.safetensors is damaged or incomplete")
    assert not out.exists() and not staging_path(out).exists()


def test_a_damaged_quantized_artifact_is_named(saved_models, docs_jsonl, tmp_path):
    quantized = tmp_path / "q"
    assert invoke("quantize", saved_models["bart"], "-o", quantized, "--method", "direct").exit_code == 0
    weights = quantized / WEIGHTS_NAME
    weights.write_bytes(weights.read_bytes()[:-100])
    one_line_error(invoke("eval", quantized, docs_jsonl, "-o", tmp_path / "ev"), f"cannot load model from {quantized}",
                   f"{WEIGHTS_NAME} is damaged")


def test_quantizing_twice_writes_the_same_bytes(saved_models, tmp_path):
    # safetensors wrote several metadata keys in a random order, so equal runs differed in sha256
    digests = []
    for name in ("a", "b"):
        assert invoke("quantize", saved_models["bart"], "-o", tmp_path / name, "--method", "direct").exit_code == 0
        digests.append((tmp_path / name / WEIGHTS_NAME).read_bytes())
    assert digests[0] == digests[1]


# --- pickles ---------------------------------------------------------------------------------------

def pickled(model: Path, tmp_path: Path, name: str = "pickled") -> Path:
    """The model of `model` with its weights as pytorch_model.bin only (an old-style checkpoint)."""
    from safetensors.torch import load_file

    folder = copy(model, tmp_path, name)
    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    return folder


def test_pickle_weights_are_refused_with_the_way_to_opt_in(saved_models, docs_jsonl, tmp_path):
    folder = pickled(saved_models["bart"], tmp_path)
    result = invoke("pseudolabel", folder, docs_jsonl, "-o", tmp_path / "pl")
    one_line_error(result, "pytorch_model.bin", "pickles can run code", "--allow-pickle")
    assert not (tmp_path / "pl").exists()
    for step in (["eval", folder, docs_jsonl], ["export", folder], ["quantize", folder, "--method", "direct"],
                 ["distill", docs_jsonl, "--teacher", folder, "--decoder-layers", "1", "--max-steps", "1"]):
        one_line_error(invoke(*step, "-o", tmp_path / "out"), "--allow-pickle")


def test_allow_pickle_loads_the_same_model(saved_models, docs_jsonl, tmp_path):
    folder = pickled(saved_models["bart"], tmp_path)
    common = ["--limit", "4", "--device", "cpu"]
    safe = invoke("pseudolabel", saved_models["bart"], docs_jsonl, "-o", tmp_path / "safe", *common)
    loaded = invoke("pseudolabel", folder, docs_jsonl, "-o", tmp_path / "pickle", "--allow-pickle", *common)
    assert safe.exit_code == 0 and loaded.exit_code == 0, loaded.stderr
    assert (tmp_path / "safe" / "data.jsonl").read_text() == (tmp_path / "pickle" / "data.jsonl").read_text()


def test_a_classifier_follows_the_same_policy(classifier_path, tmp_path):
    folder = pickled(classifier_path, tmp_path)
    with pytest.raises(UserError, match="--allow-pickle"):
        load_classifier(str(folder))
    model, _ = load_classifier(str(folder), allow_pickle=True)
    reference, _ = load_classifier(str(classifier_path))
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_trainers_leftover_pickles_beside_safetensors_are_not_weights(saved_models, tmp_path):
    folder = copy(saved_models["bart"], tmp_path)
    torch.save({"lr": 1.0}, folder / "training_args.bin")
    load_seq2seq(str(folder))


# --- lengths and positions -------------------------------------------------------------------------

def test_contrastive_default_length_follows_the_models_positions(tmp_path):
    """A classifier with 32 positions whose tokenizer says 512: the paper's 128 would index past them."""
    from transformers import AutoConfig, BertConfig, BertForSequenceClassification

    tok = bert_tokenizer()
    tok.model_max_length = 512
    teacher = tmp_path / "teacher"
    BertForSequenceClassification(BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=2,
                                             num_attention_heads=2, intermediate_size=32,
                                             max_position_embeddings=32)).save_pretrained(teacher)
    tok.save_pretrained(teacher)
    long = " ".join(DOCUMENTS)  # far more tokens than the positions
    data = write_jsonl(tmp_path / "sst.jsonl", [{"sentence": long, "label": i % 2} for i in range(8)])
    out = tmp_path / "student"
    result = invoke("contrastive", data, "--teacher", teacher, "--layers", "1", "--feature-map", "copied", "--max-steps", "2",
                    "--batch-size", "4", "-o", out)
    assert result.exit_code == 0, result.stderr
    resolved = json.loads((out / "modelshrink.json").read_text())["resolved"]
    assert resolved["max_length"] == AutoConfig.from_pretrained(teacher).max_position_embeddings
    too_long = invoke("contrastive", data, "--teacher", teacher, "--layers", "1", "--feature-map", "copied", "--max-steps", "2",
                      "--max-length", "4096", "-o", tmp_path / "x")
    assert too_long.exit_code == 1 and too_long.stderr.strip().splitlines()[-1].startswith(
        "Error: --max-length 4096 is more than the model's 32 positions")
    assert not (tmp_path / "x").exists() and not staging_path(tmp_path / "x").exists()


def test_a_source_length_past_the_positions_is_refused(tmp_path, docs_jsonl):
    model, tok = build("bart")
    model.save_pretrained(tmp_path / "bart")
    tok.save_pretrained(tmp_path / "bart")
    positions = model.config.max_position_embeddings
    result = invoke("pseudolabel", tmp_path / "bart", docs_jsonl, "-o", tmp_path / "pl", "--max-source-length",
                    positions + 1)
    one_line_error(result, f"--max-source-length {positions + 1} is more than the model's {positions} positions")
