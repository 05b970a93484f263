"""`distill`: training works, resumes exactly, stops on NaN, runs under accelerate, refuses bad input."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from conftest import (DOCUMENTS, SUMMARIES, assert_same_scalars, bert_tokenizer, launch_command, tensorboard_scalars,
                      train_log_lines, train_log_scalars, write_jsonl)
from modelshrink.artifacts import read_manifest, staging_path, verify_files
from modelshrink.cli import app
from modelshrink.steps.distill import DistillOptions, distill
from modelshrink.errors import UserError
from modelshrink.training.loop import TrainingDiverged

runner = CliRunner()


@pytest.fixture
def pairs(tmp_path):
    rows = [{"id": i, "document": d, "summary": s} for i, (d, s) in enumerate(zip(DOCUMENTS, SUMMARIES))]
    rows += [{"id": 100 + i, "document": d, "summary": s} for i, (d, s) in enumerate(zip(DOCUMENTS[:4], SUMMARIES[:4]))]
    return write_jsonl(tmp_path / "pairs.jsonl", rows)  # 16 pairs


def _opts(data, **kw):
    return DistillOptions(data=str(data), **{"batch_size": 4, "device": "cpu", "log_every": 1, **kw})


def _log(path):
    return [json.loads(line) for line in (path / "train_log.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_tiny_model_overfits_16_pairs(pairs, tmp_path):
    from transformers import BartConfig, BartForConditionalGeneration

    from conftest import bart_tokenizer

    tok = bart_tokenizer()
    torch.manual_seed(0)  # d_model 64 without dropout memorises 16 pairs in ~150 steps; 32 needs many more
    model = BartForConditionalGeneration(BartConfig(
        vocab_size=len(tok), d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=80,
        dropout=0.0, bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2))
    model.save_pretrained(tmp_path / "bart")
    tok.save_pretrained(tmp_path / "bart")
    out = distill(_opts(pairs, student=str(tmp_path / "bart"), max_steps=150, lr=3e-3, label_smoothing=0.0,
                        warmup_steps=10), tmp_path / "s")
    log = [e for e in _log(out) if "ce" in e]
    assert log[0]["ce"] > 3.0 and log[-1]["ce"] < 0.3, (log[0]["ce"], log[-1]["ce"])
    m = read_manifest(out)
    assert m["step"] == "distill" and m["metrics"]["steps"] == 150 and verify_files(out) == []
    assert m["metrics"]["train_tokens"] == sum(e["tokens"] for e in log)  # log_every=1: one entry per step
    card = (out / "README.md").read_text()
    assert card.startswith("---\n") and card.split("\n---\n", 1)[1].startswith("# s")  # the Hub's metadata, then


def test_max_steps_zero_writes_the_shrunk_student(saved_models, pairs, tmp_path):
    from transformers import AutoModelForSeq2SeqLM

    out = distill(_opts(pairs, teacher=str(saved_models["t5"]), decoder_layers=1, max_steps=0), tmp_path / "s")
    student = AutoModelForSeq2SeqLM.from_pretrained(out)  # plain transformers
    teacher = AutoModelForSeq2SeqLM.from_pretrained(saved_models["t5"])
    assert student.config.num_decoder_layers == 1 and student.config.modelshrink_layer_map["decoder"] == [1]
    assert torch.equal(student.decoder.block[0].layer[1].EncDecAttention.q.weight,
                       teacher.decoder.block[1].layer[1].EncDecAttention.q.weight)
    assert not (out / "train_log.jsonl").exists() and "Not trained" in (out / "README.md").read_text()
    assert read_manifest(out)["resolved"]["layer_map"] == {"encoder": [0, 1], "decoder": [1]}


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bart", "t5", "bert2bert"])
def test_word_level_losses_train_every_family(family, saved_models, pairs, tmp_path):
    out = distill(_opts(pairs, teacher=str(saved_models[family]), decoder_layers=1, max_steps=3, kd_logits="mse",
                        kd_hidden=1.0, kd_attention=1.0, validation=str(pairs), eval_limit=4), tmp_path / "s")
    last = [e for e in _log(out) if "kd_logits" in e][-1]
    assert last["kd_logits"] > 0 and last["kd_hidden"] > 0 and last["kd_attention"] > 0
    assert last["loss"] == pytest.approx(last["ce"] + last["kd_logits"] + last["kd_hidden"] + last["kd_attention"],
                                         rel=1e-4)
    assert set(json.loads((out / "validation.json").read_text())) >= {"rouge1", "rouge2", "rougeL", "step"}


@pytest.mark.slow
def test_resume_gives_the_same_weights_as_an_uninterrupted_run(saved_models, pairs, tmp_path):
    kw = dict(teacher=str(saved_models["bart"]), decoder_layers=1, max_steps=12, save_every=5, lr=1e-3,
              kd_logits="kl")
    whole = distill(_opts(pairs, **kw), tmp_path / "whole")

    def stop_at_7(entry):
        if entry["step"] == 7:
            raise KeyboardInterrupt

    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        distill(_opts(pairs, **kw), out, progress=stop_at_7)
    assert not out.exists() and (staging_path(out) / "checkpoints" / "step-5").is_dir()
    resumed = distill(_opts(pairs, **kw), out, resume=True)
    a, b = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    steps = [e["step"] for e in _log(resumed) if "loss" in e]
    assert steps == list(range(1, 13))  # no step lost or logged twice
    with pytest.raises(UserError, match="--overwrite"):
        distill(_opts(pairs, **kw), out)
    before = (out / "modelshrink.json").read_text()
    assert distill(_opts(pairs, **kw), out, resume=True) == out  # finished: nothing to resume
    assert (out / "modelshrink.json").read_text() == before


@pytest.mark.slow
def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(saved_models, pairs, tmp_path, monkeypatch):
    from modelshrink.training import losses

    calls = {"n": 0}

    def poisoned(original):
        def loss(*args, **kwargs):
            calls["n"] += 1
            value = original(*args, **kwargs)
            return value * float("nan") if calls["n"] == 7 else value

        return loss

    for name in ("label_smoothed_cross_entropy", "linear_cross_entropy"):  # the fused CE or not: one a micro-batch
        monkeypatch.setattr(losses, name, poisoned(getattr(losses, name)))
    out = tmp_path / "s"
    with pytest.raises(TrainingDiverged, match=r"NaN or inf at step 7.*step-5"):
        distill(_opts(pairs, teacher=str(saved_models["bart"]), max_steps=10, save_every=5), out)
    assert not out.exists() and (staging_path(out) / "checkpoints" / "step-5" / "model.safetensors").is_file()
    calls["n"] = 0
    result = runner.invoke(app, ["distill", str(pairs), "-o", str(tmp_path / "cli"), "--teacher",
                                 str(saved_models["bart"]), "--max-steps", "10", "--save-every", "5"])
    assert result.exit_code == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: the loss became NaN or inf at step 7") and "--resume" in last


def test_warm_start_from_a_pretrained_encoder(pairs, tmp_path):
    from transformers import BertConfig, BertModel, EncoderDecoderModel

    tok = bert_tokenizer()
    encoder = tmp_path / "tiny-bert"
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=80)).save_pretrained(encoder)
    tok.save_pretrained(encoder)
    out = distill(_opts(pairs, init_encoder_decoder=str(encoder), max_steps=2), tmp_path / "teacher")
    model = EncoderDecoderModel.from_pretrained(out)
    assert model.generation_config.decoder_start_token_id == tok.cls_token_id
    assert "Warm-started" in (out / "README.md").read_text()


@pytest.mark.parametrize("args, message", [
    (["--decoder-layers", "3"], "--decoder-layers 3 is above the teacher's 2 decoder layers"),
    (["--encoder-layers", "0"], "must be >= 1"),
    (["--encoder-layer-ids", "0,5"], "0..1"),
    (["--decoder-layer-ids", "1,1"], "repeat"),
    (["--encoder-layers", "1", "--encoder-layer-ids", "0"], "exclude each other"),
    (["--kd-logits", "softmax"], "--kd-logits must be kl or mse"),
])
def test_bad_layer_and_loss_options(args, message, saved_models, pairs, tmp_path):
    out = tmp_path / "out"
    result = runner.invoke(app, ["distill", str(pairs), "-o", str(out), "--teacher", str(saved_models["bart"]),
                                 "--max-steps", "1", *args])
    assert result.exit_code == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("Error: ") and message in result.stderr, result.stderr
    assert not out.exists() and not staging_path(out).exists()


def test_bad_models_and_tokenizers(saved_models, classifier_path, pairs, tmp_path):
    out = tmp_path / "out"

    def bad(*args):
        result = runner.invoke(app, ["distill", str(pairs), "-o", str(out), "--max-steps", "1", *map(str, args)])
        assert result.exit_code == 1, result.stderr
        assert not out.exists() and not staging_path(out).exists()
        return result.stderr.strip().splitlines()[-1]

    assert "not an encoder-decoder" in bad("--teacher", classifier_path)
    assert "not an encoder-decoder" in bad("--student", classifier_path)
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2)).save_pretrained(tmp_path / "gpt2")
    bert_tokenizer().save_pretrained(tmp_path / "gpt2")
    assert "is a gpt2 model (GPT2LMHeadModel)" in bad("--teacher", tmp_path / "gpt2")
    assert "tokenizers differ" in bad("--teacher", saved_models["bart"], "--student", saved_models["t5"],
                                      "--kd-logits", "kl")
    assert "need --teacher" in bad("--student", saved_models["bart"], "--kd-hidden", "1")
    assert "give a budget" in runner.invoke(app, ["distill", str(pairs), "-o", str(out), "--student",
                                                  str(saved_models["bart"])]).stderr
    assert "give a starting point" in bad()


@pytest.mark.slow
def test_two_process_accelerate_launch_writes_one_artifact(saved_models, pairs, tmp_path):
    out = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = launch_command(2, "distill", pairs, "-o", out, "--teacher", saved_models["bart"], "--decoder-layers", 1,
                         "--max-steps", 4, "--batch-size", 2, "--kd-logits", "kl", "--device", "cpu",
                         "--report-to", "tensorboard")
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines() == [str(out)]  # one process prints the path
    manifest = read_manifest(out)
    assert manifest["resolved"]["processes"] == 2 and manifest["metrics"]["steps"] == 4
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".ddp", "ddp"))) == ["ddp"]
    # only the main process reports: one run folder, its scalars those of the one train_log.jsonl
    runs = {p.relative_to(out / "runs").parts[0] for p in (out / "runs").rglob("events.out.tfevents.*")}
    assert runs == {"ddp"}
    assert_same_scalars(tensorboard_scalars(out / "runs" / "ddp"), train_log_scalars(train_log_lines(out)))


def test_token_budget_batches_respect_the_budget_and_cover_every_example():
    from modelshrink.training.batches import make_batches
    from modelshrink.training.loop import TrainOptions

    lengths = [5, 40, 12, 33, 7, 21, 64, 3, 18, 50] * 7
    options = TrainOptions(max_steps=1, batch_size=4, max_tokens=100, seed=3)
    batches = make_batches(lengths, options, epoch=0)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert all(max(lengths[i] for i in b) * len(b) <= 100 or len(b) == 1 for b in batches)
    assert batches == make_batches(lengths, options, epoch=0) != make_batches(lengths, options, epoch=1)
    fixed = make_batches(lengths, TrainOptions(max_steps=1, batch_size=4, seed=3), epoch=0)
    assert [len(b) for b in fixed[:-1]] == [4] * (len(fixed) - 1)


def test_early_stopping_and_best_checkpoint(saved_models, pairs, tmp_path, monkeypatch):
    import modelshrink.training.seq2seq as d

    scores = iter([5.0, 7.0, 6.0, 6.5, 9.0, 9.0])

    def fake_validate(*args, **kwargs):
        def validate(model):
            value = next(scores)
            return {"rouge1": value, "rouge2": value, "rougeL": value, "rougeLsum": value}
        return validate

    monkeypatch.setattr(d, "make_validate", fake_validate)
    out = distill(_opts(pairs, teacher=str(saved_models["bart"]), max_steps=10, validation=str(pairs),
                        eval_every=1, early_stopping=2), tmp_path / "s")
    events = [e for e in _log(out) if e.get("event") == "validation"]
    # 5 → 7 (best, step 2) → 6 → 6.5: two validations without gain stop the run at step 4
    assert [e["step"] for e in events] == [1, 2, 3, 4] and events[-1]["best_step"] == 2
    assert json.loads((out / "validation.json").read_text())["step"] == 2
    assert read_manifest(out)["metrics"]["steps"] == 4
