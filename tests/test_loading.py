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
from modelshrink.models.loading import load_classifier, load_seq2seq
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

def assert_same_weights(model, reference) -> None:
    """Every tensor of `reference` in `model` under the same name, equal, and nothing else (an empty or short
    state dict fails, which a zip() of the two would let pass)."""
    got, expected = model.state_dict(), reference.state_dict()
    assert expected and list(got) == list(expected)
    for name, value in expected.items():
        assert torch.equal(got[name], value), name


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


@pytest.mark.slow
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
    assert_same_weights(model, reference)


def test_a_trainers_leftover_pickles_beside_safetensors_are_not_weights(saved_models, tmp_path):
    folder = copy(saved_models["bart"], tmp_path)
    torch.save({"lr": 1.0}, folder / "training_args.bin")
    model, _, _ = load_seq2seq(str(folder))  # no --allow-pickle needed: the weights are the safetensors file's
    assert_same_weights(model, load_seq2seq(str(saved_models["bart"]))[0])


# --- lengths and positions -------------------------------------------------------------------------

def short_classifier(path: Path, layers: int = 1) -> Path:
    """A BERT classifier with 32 positions whose tokenizer says 512 (a small model reusing a bigger one's
    tokenizer): anything that truncates at the tokenizer's limit indexes past the position table."""
    from transformers import BertConfig, BertForSequenceClassification

    tok = bert_tokenizer()
    tok.model_max_length = 512
    BertForSequenceClassification(BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=layers,
                                             num_attention_heads=2, intermediate_size=32,
                                             max_position_embeddings=32)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_contrastive_default_length_follows_the_models_positions(tmp_path):
    """A classifier with 32 positions whose tokenizer says 512: the paper's 128 would index past them."""
    from transformers import AutoConfig

    teacher = short_classifier(tmp_path / "teacher", layers=2)
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


def test_damaged_config_and_tokenizer_through_the_cli(saved_models, docs_jsonl, tmp_path):
    folder = copy(saved_models["bart"], tmp_path)
    config = (folder / "config.json").read_text()
    (folder / "config.json").write_text(config[: len(config) // 2])
    result = invoke("eval", folder, docs_jsonl, "-o", tmp_path / "e", "--limit", "2")
    one_line_error(result, f"cannot load model from {folder}: config.json is damaged or incomplete (not valid JSON")
    (folder / "config.json").write_text(config)
    (folder / "tokenizer.json").write_bytes(b"\xff\xfe not a tokenizer")
    one_line_error(invoke("export", folder, "-o", tmp_path / "x"), "tokenizer.json is damaged or incomplete")
    assert not (tmp_path / "e").exists() and not (tmp_path / "x").exists()


def test_a_missing_shard_is_named(saved_models, tmp_path):
    from transformers import AutoModelForSeq2SeqLM

    folder = copy(saved_models["bart"], tmp_path)
    (folder / "model.safetensors").unlink()
    AutoModelForSeq2SeqLM.from_pretrained(saved_models["bart"]).save_pretrained(folder, max_shard_size="100KB")
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 1
    shards[-1].unlink()
    with pytest.raises(UserError, match=f"{shards[-1].name} is missing \\(model.safetensors.index.json lists it\\)"):
        load_seq2seq(str(folder))


def test_a_quantized_artifact_without_its_weights_is_named(saved_models, tmp_path):
    quantized = tmp_path / "q"
    assert invoke("quantize", saved_models["bart"], "-o", quantized, "--method", "direct").exit_code == 0
    (quantized / WEIGHTS_NAME).unlink()
    with pytest.raises(UserError, match=f"{WEIGHTS_NAME} is missing"):
        load_seq2seq(str(quantized))


# --- damaged ONNX export folders: eval and the torch-free run command ------------------------------

@pytest.fixture(scope="module")
def classifier_export(classifier_path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("onnx") / "classifier-onnx"
    result = runner.invoke(app, ["export", str(classifier_path), "-o", str(out), "--no-validate"])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("damage", ["half", "empty", "random bytes"])
def test_a_damaged_graph_is_one_line_for_eval_and_run(classifier_export, tmp_path, damage):
    folder = copy(classifier_export, tmp_path, "export")
    graph = folder / "model.onnx"
    data = graph.read_bytes()
    graph.write_bytes({"half": data[: len(data) // 2], "empty": b"", "random bytes": b"\x07\xff" * 500}[damage])
    rows = write_jsonl(tmp_path / "rows.jsonl", [{"text": d, "label": i % 2} for i, d in enumerate(DOCUMENTS[:2])])
    for args in (["eval", folder, rows, "-o", tmp_path / "e"], ["run", folder, "--input", rows]):
        one_line_error(invoke(*args), f"cannot load export from {folder}: model.onnx is damaged or incomplete")
    assert not (tmp_path / "e").exists() and not staging_path(tmp_path / "e").exists()


# --- the pickle policy beyond a plain folder --------------------------------------------------------

@pytest.mark.parametrize("damage", ["half", "empty"])
def test_a_damaged_pickle_with_allow_pickle_is_one_line(saved_models, docs_jsonl, tmp_path, damage):
    folder = pickled(saved_models["bart"], tmp_path)
    weights = folder / "pytorch_model.bin"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2] if damage == "half" else b"")
    result = invoke("pseudolabel", folder, docs_jsonl, "-o", tmp_path / "pl", "--allow-pickle")
    one_line_error(result, "pytorch_model.bin is damaged or incomplete")


def test_a_pickle_holding_more_than_tensors_is_refused_even_with_allow_pickle(saved_models, tmp_path):
    folder = pickled(saved_models["bart"], tmp_path)
    torch.save({"weights": torch.zeros(2), "code": Path("not a tensor")}, folder / "pytorch_model.bin")
    with pytest.raises(UserError, match="pytorch_model.bin is damaged, or holds more than tensors"):
        load_seq2seq(str(folder), allow_pickle=True)


def test_a_cached_hub_name_follows_the_pickle_policy(saved_models, tmp_path, monkeypatch):
    from huggingface_hub import constants

    snapshot = tmp_path / "hub" / "models--tiny--pickled" / "snapshots" / ("0" * 40)
    pickled(saved_models["bart"], snapshot.parent, snapshot.name)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError, match="pytorch_model.bin.*--allow-pickle"):
        load_seq2seq("tiny/pickled")
    model, _, _ = load_seq2seq("tiny/pickled", allow_pickle=True)
    reference, _, _ = load_seq2seq(str(saved_models["bart"]))
    assert_same_weights(model, reference)


def test_a_warm_start_from_a_pickled_encoder_follows_the_policy(tmp_path):
    from transformers import BertConfig, BertModel

    from modelshrink.models.warmstart import init_encoder_decoder

    tok = bert_tokenizer()
    encoder = tmp_path / "encoder"
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32)).save_pretrained(encoder)
    tok.save_pretrained(encoder)
    folder = pickled(encoder, tmp_path)
    with pytest.raises(UserError, match="--allow-pickle"):
        init_encoder_decoder(str(folder))
    safe, _ = init_encoder_decoder(str(encoder), seed=0)
    loaded, _ = init_encoder_decoder(str(folder), seed=0, allow_pickle=True)
    assert_same_weights(loaded, safe)


def test_eval_of_a_classifier_truncates_to_its_positions(tmp_path):
    """The tokenizer allows 512 tokens, the model has 32 positions: eval used to index past them."""
    model = short_classifier(tmp_path / "short")
    data = write_jsonl(tmp_path / "long.jsonl", [{"text": " ".join(DOCUMENTS), "label": i % 2} for i in range(2)])
    result = invoke("eval", model, data, "-o", tmp_path / "e")
    assert result.exit_code == 0, result.stderr
    assert json.loads((tmp_path / "e" / "modelshrink.json").read_text())["resolved"]["max_length"] == 32


# ---------------------------------------------------------------- a model resolved once (issue 56)

@pytest.fixture
def lookups(monkeypatch):
    """Counts, per model folder, the config reads, the files checks (JSON; weights) and the tokenizer reads."""
    from collections import Counter

    import transformers

    import modelshrink.models.loading as loading

    counts: Counter = Counter()
    check_files, config_read = loading.check_files, transformers.AutoConfig.from_pretrained
    tokenizer_read = transformers.AutoTokenizer.from_pretrained

    def counted_check(folder, what, weights=False, **kwargs):
        counts[("weights" if weights else "json", Path(folder).name)] += 1
        return check_files(folder, what, weights=weights, **kwargs)

    def counted(kind, read):
        def call(spec, *args, **kwargs):
            counts[(kind, Path(str(spec)).name)] += 1
            return read(spec, *args, **kwargs)
        return call

    monkeypatch.setattr(loading, "check_files", counted_check)
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", counted("config", config_read))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", counted("tokenizer", tokenizer_read))
    return counts


def test_a_model_source_reads_config_files_and_tokenizer_once(saved_models, lookups):
    from modelshrink.models.loading import resolve

    source = resolve(str(saved_models["bart"]), "teacher")
    assert source.quantized is False and source.family.name and source.task == "summarization"
    assert str(source) == str(saved_models["bart"]) and source.local and source.folder == saved_models["bart"]
    load_seq2seq(source)
    load_seq2seq(source)  # a second copy (quantize's teacher and student from one model) reads nothing again
    assert dict(lookups) == {("json", "bart"): 1, ("config", "bart"): 1, ("weights", "bart"): 1,
                             ("tokenizer", "bart"): 1}


@pytest.mark.parametrize("args", [["quantize", "{model}", "--method", "direct"],
                                  ["quantize", "{model}", "--data", "{data}", "--max-steps", "0"],
                                  ["quantize", "{model}", "--data", "{data}", "--max-steps", "0", "--teacher",
                                   "{model}"],
                                  ["export", "{model}"],
                                  ["eval", "{model}", "{data}", "--limit", "2", "--max-length", "4",
                                   "--num-beams", "1"],
                                  ["pseudolabel", "{model}", "{data}", "--limit", "2", "--max-length", "4",
                                   "--num-beams", "1"],
                                  ["distill", "{data}", "--teacher", "{model}", "--max-steps", "0"]],
                         ids=["quantize-direct", "quantize", "quantize-teacher", "export", "eval", "pseudolabel",
                              "distill"])
def test_each_step_resolves_its_model_once(args, saved_models, docs_jsonl, tmp_path, lookups):
    model = str(saved_models["bart"])
    argv = [a.format(model=model, data=docs_jsonl) for a in args]
    result = CliRunner().invoke(app, [*argv, "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    mine = {key: n for key, n in lookups.items() if key[1] == "bart"}
    # quantize's --teacher names the same folder as a second model: resolved once more, as any second model is
    twice = 2 if args[0] == "quantize" and "--teacher" in args else 1
    assert mine == {("json", "bart"): twice, ("config", "bart"): twice, ("weights", "bart"): twice,
                    ("tokenizer", "bart"): twice}, mine
