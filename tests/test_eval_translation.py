"""`eval` on translations: sacreBLEU's corpus BLEU and chrF with intervals and paired tests, source/target and
nested translation rows, a translation model generating, and the one-line refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
import sacrebleu
import torch

from conftest import DOCUMENTS, SUMMARIES, bart_tokenizer, translator, write_jsonl
from modelshrink.artifacts import read_manifest
from modelshrink.errors import UserError
from modelshrink.steps.evaluate import EvalOptions, evaluate
from modelshrink.metrics import translation

# English -> German-like pairs: the "references" are the summaries, so any text pairs will do for scoring
SOURCES = DOCUMENTS[:8] * 5
TARGETS = SUMMARIES[:8] * 5


def _rows(predictions: list[str]) -> list[dict]:
    return [{"id": f"s{i}", "source": s, "target": t, "prediction": p}
            for i, (s, t, p) in enumerate(zip(SOURCES, TARGETS, predictions))]


def _worse(text: str) -> str:
    words = text.split()
    return " ".join(words[::-1][: max(1, len(words) - 2)])


def test_translations_get_sacrebleus_corpus_bleu_and_chrf_with_intervals(tmp_path):
    predictions = [t if i % 3 else _worse(t) for i, t in enumerate(TARGETS)]
    path, metrics = evaluate(EvalOptions(data=str(write_jsonl(tmp_path / "p.jsonl", _rows(predictions))),
                                         resamples=200), tmp_path / "eval")
    assert metrics["task"] == "translation" and metrics["documents"] == len(SOURCES)
    assert metrics["bleu"] == pytest.approx(sacrebleu.corpus_bleu(predictions, [TARGETS]).score, abs=1e-4)
    assert metrics["chrf"] == pytest.approx(sacrebleu.corpus_chrf(predictions, [TARGETS]).score, abs=1e-4)
    for key in ("bleu", "chrf"):
        low, high = metrics["ci95"][key]
        assert low < metrics[key] < high  # a corpus score, resampled: neither end is the score itself
    assert metrics["settings"]["sacrebleu"]["bleu"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    assert "nc:6" in metrics["settings"]["sacrebleu"]["chrf"]
    assert read_manifest(path)["resolved"]["task"] == "translation"
    assert read_manifest(path)["metrics"]["bleu"] == metrics["bleu"]
    rows = [json.loads(line) for line in (path / "predictions.jsonl").read_text().splitlines()]
    assert rows[1]["scores"]["bleu"] == pytest.approx(100.0)  # a perfect sentence
    assert rows[0]["scores"]["chrf"] == pytest.approx(sacrebleu.sentence_chrf(predictions[0], [TARGETS[0]]).score,
                                                      abs=1e-3)
    assert len(rows[0]["statistics"]["bleu"]) == 10 and len(rows[0]["statistics"]["chrf"]) == 18


def test_a_worse_translation_system_loses_significantly_and_a_system_ties_with_itself(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", _rows(TARGETS))
    bad = write_jsonl(tmp_path / "bad.jsonl", _rows([_worse(t) for t in TARGETS]))
    base, base_metrics = evaluate(EvalOptions(data=str(bad), resamples=100), tmp_path / "eval-bad")
    _, metrics = evaluate(EvalOptions(data=str(good), against=str(base), resamples=100,
                                      significance_resamples=500), tmp_path / "eval-good")
    against = metrics["against"]
    assert against["delta"]["bleu"] == pytest.approx(metrics["bleu"] - base_metrics["bleu"], abs=1e-3)
    assert against["p"]["bleu"] < 0.01 and against["p"]["chrf"] < 0.01
    # the same, against the predictions file rather than its evaluation; and a system against itself
    _, again = evaluate(EvalOptions(data=str(good), against=str(bad), resamples=100, significance_resamples=500),
                        tmp_path / "eval-good-2")
    assert again["against"]["p"] == against["p"] and again["against"]["delta"] == against["delta"]
    # a finished evaluation re-tested against another (nothing generated; its rows say "document"): still BLEU
    good_eval = tmp_path / "eval-good"
    retest, again = evaluate(EvalOptions(data=str(good_eval), against=str(base), significance_resamples=500,
                                         resamples=100), tmp_path / "eval-good-vs-bad")
    assert again["task"] == "translation" and again["bleu"] == metrics["bleu"]
    assert again["against"]["p"] == against["p"] and again["against"]["delta"] == against["delta"]
    assert read_manifest(retest)["resolved"]["task"] == "translation"
    _, same = evaluate(EvalOptions(data=str(bad), against=str(base), resamples=100, significance="bootstrap",
                                   significance_resamples=200), tmp_path / "eval-same")
    assert same["against"]["p"] == {"bleu": 1.0, "chrf": 1.0}


def test_the_corpus_paired_test_swaps_sentences():
    stats = translation.sentence_statistics(["a b c d", "e f g h"] * 10, ["a b c d", "e f g x"] * 10)
    worse = translation.sentence_statistics(["a b", "e"] * 10, ["a b c d", "e f g x"] * 10)
    assert translation.paired_test(stats["bleu"], stats["bleu"], "bleu", resamples=100) == 1.0
    assert translation.paired_test(stats["chrf"], worse["chrf"], "chrf", resamples=200) < 0.01
    with pytest.raises(ValueError, match="same sentences"):
        translation.paired_test(stats["bleu"], worse["bleu"][:3], "bleu")


def test_nested_translation_rows_read_with_source_and_target_languages(tmp_path):
    predictions = [_worse(t) for t in TARGETS]
    flat = write_jsonl(tmp_path / "flat.jsonl", _rows(predictions))
    nested = write_jsonl(tmp_path / "nested.jsonl", [
        {"id": f"s{i}", "translation": {"en": s, "de": t, "fr": "x"}, "prediction": p}
        for i, (s, t, p) in enumerate(zip(SOURCES, TARGETS, predictions))])
    _, want = evaluate(EvalOptions(data=str(flat), resamples=100), tmp_path / "a")
    _, got = evaluate(EvalOptions(data=str(nested), source_lang="en", target_lang="de", resamples=100),
                      tmp_path / "b")
    assert (got["bleu"], got["chrf"], got["ci95"]) == (want["bleu"], want["chrf"], want["ci95"])
    with pytest.raises(UserError, match=r"holds translation rows \(en, de, fr\): choose the pair with --source-lang"):
        evaluate(EvalOptions(data=str(nested)), tmp_path / "c")
    with pytest.raises(UserError, match=r"line 1 has no 'ro' in its translation \(languages there: en, de, fr\)"):
        evaluate(EvalOptions(data=str(nested), source_lang="en", target_lang="ro"), tmp_path / "d")
    with pytest.raises(UserError, match="--source-lang and --target-lang go together"):
        evaluate(EvalOptions(data=str(nested), source_lang="en"), tmp_path / "e")
    with pytest.raises(UserError, match="has none; columns found: id, source, target, prediction"):
        evaluate(EvalOptions(data=str(flat), source_lang="en", target_lang="de"), tmp_path / "f")
    assert not any((tmp_path / x).exists() for x in "cdef")


def test_bad_translation_input_is_refused_in_one_line(tmp_path, classifier_path):
    no_target = write_jsonl(tmp_path / "nt.jsonl", [{"id": "a", "source": "x y", "prediction": "x"}])
    with pytest.raises(UserError, match="has no reference column; columns found: id, source, prediction"):
        evaluate(EvalOptions(data=str(no_target), task="translation"), tmp_path / "a")
    pairs = write_jsonl(tmp_path / "p.jsonl", _rows(TARGETS))
    with pytest.raises(UserError, match="--limited-length-recall applies to summarization, but predictions file .* "
                                        "is a translation task"):
        evaluate(EvalOptions(data=str(pairs), limited_length_recall=True), tmp_path / "b")
    sentences = write_jsonl(tmp_path / "s.jsonl", [{"sentence": "good movie", "label": 1}])
    with pytest.raises(UserError, match="--task translation scores generated text, but model .* is a classification"):
        evaluate(EvalOptions(model=str(classifier_path), data=str(sentences), task="translation"), tmp_path / "c")
    assert not any((tmp_path / x).exists() for x in "abc")


def test_a_marian_model_translates_source_rows_and_is_scored(tmp_path):
    from transformers import MarianConfig, MarianMTModel

    tok = bart_tokenizer()
    torch.manual_seed(0)
    config = MarianConfig(vocab_size=len(tok), d_model=32, encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                          decoder_ffn_dim=64, max_position_embeddings=80, pad_token_id=tok.pad_token_id,
                          eos_token_id=tok.eos_token_id, decoder_start_token_id=tok.pad_token_id,
                          forced_eos_token_id=None)
    model = MarianMTModel(config)
    model.generation_config.num_beams, model.generation_config.max_length = 2, 12
    model.save_pretrained(tmp_path / "marian")
    tok.save_pretrained(tmp_path / "marian")
    data = write_jsonl(tmp_path / "ende.jsonl", [{"id": f"s{i}", "source": s, "target": t}
                                                 for i, (s, t) in enumerate(zip(SOURCES[:6], TARGETS[:6]))])
    path, metrics = evaluate(EvalOptions(model=str(tmp_path / "marian"), data=str(data), latency_docs=0,
                                         resamples=100, device="cpu"), tmp_path / "eval")
    rows = [json.loads(line) for line in (path / "predictions.jsonl").read_text().splitlines()]
    assert metrics["task"] == "translation" and metrics["documents"] == 6
    assert metrics["bleu"] == pytest.approx(sacrebleu.corpus_bleu([r["prediction"] for r in rows],
                                                                  [TARGETS[:6]]).score, abs=1e-4)
    assert [r["reference"] for r in rows] == TARGETS[:6] and [r["document"] for r in rows] == SOURCES[:6]
    assert metrics["settings"]["generation"]["num_beams"] == 2 and "efficiency" in metrics
    assert np.isfinite(metrics["chrf"])


def _many_to_many(folder, forced: str | None = None):
    """A tiny mBART whose tokenizer has three language codes and whose config forces `forced` (or none)."""
    from transformers import MBartConfig, MBartForConditionalGeneration

    tok = bart_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["de_DE", "en_XX", "fr_XX"]})
    torch.manual_seed(0)
    model = MBartForConditionalGeneration(MBartConfig(
        vocab_size=len(tok), d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=80,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        decoder_start_token_id=tok.eos_token_id, forced_eos_token_id=None))
    model.generation_config.num_beams, model.generation_config.max_length = 1, 8
    model.generation_config.forced_bos_token_id = tok.convert_tokens_to_ids(forced) if forced else None
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_a_many_to_many_translator_writes_the_language_asked_for(tmp_path):
    """--target-lang de finds de_DE, forces it first (the output is what a model configured for de_DE writes),
    and is recorded; pseudolabel takes it the same way."""
    from modelshrink.steps.pseudolabel import PseudolabelOptions, pseudolabel

    data = write_jsonl(tmp_path / "ende.jsonl", [{"id": f"s{i}", "source": s, "target": t}
                                                 for i, (s, t) in enumerate(zip(SOURCES[:4], TARGETS[:4]))])
    free, fixed = _many_to_many(tmp_path / "m2m"), _many_to_many(tmp_path / "m2m-de", forced="de_DE")
    common = dict(data=str(data), latency_docs=0, resamples=100, device="cpu")
    path, _ = evaluate(EvalOptions(model=str(free), target_lang="de", **common), tmp_path / "eval-de")
    reference, _ = evaluate(EvalOptions(model=str(fixed), **common), tmp_path / "eval-fixed")
    predictions = [json.loads(line)["prediction"] for line in (path / "predictions.jsonl").read_text().splitlines()]
    assert predictions == [json.loads(line)["prediction"]
                           for line in (reference / "predictions.jsonl").read_text().splitlines()]
    assert read_manifest(path)["resolved"]["generation"]["target_language"] == "de_DE"
    assert read_manifest(reference)["resolved"]["generation"]["target_language"] == "de_DE"  # the config's own
    _, other = evaluate(EvalOptions(model=str(free), target_lang="fr_XX", **common), tmp_path / "eval-fr")
    assert other["settings"]["generation"]["target_language"] == "fr_XX"
    labels = pseudolabel(PseudolabelOptions(teacher=str(free), data=str(data), target_lang="de", device="cpu"),
                         tmp_path / "labels")
    assert [json.loads(line)["summary"] for line in (labels / "data.jsonl").read_text().splitlines()] == predictions


def test_a_translator_without_its_language_or_with_an_unknown_one_is_one_line(tmp_path):
    from modelshrink.steps.pseudolabel import PseudolabelOptions, pseudolabel

    data = write_jsonl(tmp_path / "ende.jsonl", [{"id": "s0", "source": SOURCES[0], "target": TARGETS[0]}])
    free = _many_to_many(tmp_path / "m2m")
    with pytest.raises(UserError, match=r"model .*m2m translates into 3 languages and its generation config names "
                                        r"none: pass --target-lang \(one of de_DE, en_XX, fr_XX\)"):
        evaluate(EvalOptions(model=str(free), data=str(data), device="cpu"), tmp_path / "a")
    with pytest.raises(UserError, match=r"--target-lang xx is not a language of teacher .*m2m's tokenizer; its "
                                        r"codes: de_DE, en_XX, fr_XX"):
        pseudolabel(PseudolabelOptions(teacher=str(free), data=str(data), target_lang="xx", device="cpu"),
                    tmp_path / "b")
    marian = tmp_path / "marian"
    from conftest import translator

    translator("marian", marian)
    with pytest.raises(UserError, match="--target-lang de: teacher .*marian has no language codes"):
        pseudolabel(PseudolabelOptions(teacher=str(marian), data=str(data), target_lang="de", device="cpu"),
                    tmp_path / "c")
    assert not any((tmp_path / x).exists() for x in "abc")


def _mbart_with_src_lang(folder, src_lang: str):
    """A tiny mBART whose tokenizer (MBartTokenizer, its 52 FAIRSEQ codes) was saved marking sources as `src_lang`;
    weights drawn wide (init_std 1), so that the source code changes what it writes."""
    from transformers import MBartConfig, MBartForConditionalGeneration, MBartTokenizer

    words = sorted({w for text in SOURCES for w in text.lower().split()})
    pieces = [(f"▁{w}", -1.0 - i / 100) for i, w in enumerate(words)] + [(c, -9.0) for c in "abcdefghijklmnopqrstuvwxyz▁"]
    tok = MBartTokenizer(vocab=[("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + pieces,
                         src_lang=src_lang, tgt_lang="de_DE")
    torch.manual_seed(0)
    model = MBartForConditionalGeneration(MBartConfig(
        vocab_size=len(tok), d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=80,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        decoder_start_token_id=tok.convert_tokens_to_ids("de_DE"), forced_eos_token_id=None, init_std=1.0))
    model.generation_config.num_beams, model.generation_config.max_length = 1, 8
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_the_source_language_marks_the_sources_and_is_recorded(tmp_path):
    """--source-lang fr makes the tokenizer mark the sources fr_XX: the output is what the same model whose tokenizer
    was saved with fr_XX writes; recorded in the generation settings, the saved one when not given."""
    from modelshrink.steps.pseudolabel import PseudolabelOptions, pseudolabel

    data = write_jsonl(tmp_path / "ende.jsonl", [{"id": f"s{i}", "source": s, "target": t}
                                                 for i, (s, t) in enumerate(zip(SOURCES[:4], TARGETS[:4]))])
    saved_en, saved_fr = _mbart_with_src_lang(tmp_path / "en", "en_XX"), _mbart_with_src_lang(tmp_path / "fr", "fr_XX")
    common = dict(data=str(data), latency_docs=0, resamples=100, device="cpu")
    path, _ = evaluate(EvalOptions(model=str(saved_en), **common), tmp_path / "eval-en")
    assert read_manifest(path)["resolved"]["generation"]["source_language"] == "en_XX"

    def labels(teacher, out, **more):
        done = pseudolabel(PseudolabelOptions(teacher=str(teacher), data=str(data), device="cpu", **more), out)
        return [json.loads(line)["summary"] for line in (done / "data.jsonl").read_text().splitlines()], done

    asked, done = labels(saved_en, tmp_path / "labels-fr", source_lang="fr")
    assert read_manifest(done)["resolved"]["generation"]["source_language"] == "fr_XX"
    assert asked == labels(saved_fr, tmp_path / "labels-saved-fr")[0]
    assert asked != labels(saved_en, tmp_path / "labels-en")[0]  # the code is read: en_XX sources are translated otherwise
    with pytest.raises(UserError, match=r"--source-lang xx is not a language of teacher .*en's tokenizer; its codes: "
                                        r"ar_AR, cs_CZ, de_DE"):
        labels(saved_en, tmp_path / "a", source_lang="xx")
    with pytest.raises(UserError, match=r"--source-lang en: teacher .*m2m's tokenizer \(\w+\) has language codes but "
                                        r"no source language to set"):
        labels(_many_to_many(tmp_path / "m2m", forced="de_DE"), tmp_path / "b", source_lang="en")
    from conftest import translator

    with pytest.raises(UserError, match="--source-lang en: teacher .*marian has no language codes"):
        labels(translator("marian", tmp_path / "marian"), tmp_path / "c", source_lang="en")
    assert not any((tmp_path / x).exists() for x in "abc")


def _export(model, out):
    from typer.testing import CliRunner

    from modelshrink.cli import app

    result = CliRunner().invoke(app, ["export", str(model), "-o", str(out), "--no-validate"])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.slow
def test_an_export_folder_takes_the_languages_its_pytorch_model_takes(tmp_path):
    """eval on an export folder follows the PyTorch model's language rule (issue 57): --target-lang forces the code
    the same way, an unknown code or one on a single-language export is refused, a many-to-many export without
    --target-lang is refused instead of writing empty outputs; a model's all-empty outputs are refused too."""
    data = write_jsonl(tmp_path / "ende.jsonl", [{"id": f"s{i}", "source": s, "target": t}
                                                 for i, (s, t) in enumerate(zip(SOURCES[:4], TARGETS[:4]))])
    free = _many_to_many(tmp_path / "m2m")
    exported = _export(free, tmp_path / "m2m-onnx")
    common = dict(data=str(data), latency_docs=0, resamples=100, device="cpu")
    _, torch_de = evaluate(EvalOptions(model=str(free), target_lang="de", **common), tmp_path / "pt-de")
    path, onnx_de = evaluate(EvalOptions(model=str(exported), target_lang="de", **common), tmp_path / "onnx-de")
    assert onnx_de["bleu"] == pytest.approx(torch_de["bleu"])
    with pytest.raises(UserError, match=r"export .*m2m-onnx translates into 3 languages and its generation config "
                                        r"names none: pass --target-lang"):
        evaluate(EvalOptions(model=str(exported), **common), tmp_path / "a")
    with pytest.raises(UserError, match=r"--target-lang xx is not a language of export .*m2m-onnx's tokenizer"):
        evaluate(EvalOptions(model=str(exported), target_lang="xx", **common), tmp_path / "b")
    marian = _export(translator("marian", tmp_path / "marian"), tmp_path / "marian-onnx")
    with pytest.raises(UserError, match=r"--target-lang de: export .*marian-onnx has no language codes"):
        evaluate(EvalOptions(model=str(marian), target_lang="de", **common), tmp_path / "c")
    assert not any((tmp_path / x).exists() for x in "abc")


def test_all_empty_outputs_are_refused_unless_asked_for(tmp_path):
    rows = [{"id": f"s{i}", "prediction": "", "reference": t} for i, t in enumerate(TARGETS[:4])]
    data = write_jsonl(tmp_path / "empty.jsonl", rows)
    with pytest.raises(UserError, match=r"every one of the 4 outputs of predictions file .*empty.jsonl is empty.*"
                                        r"--allow-empty"):
        evaluate(EvalOptions(data=str(data), resamples=100), tmp_path / "a")
    _, metrics = evaluate(EvalOptions(data=str(data), resamples=100, allow_empty=True), tmp_path / "b")
    assert metrics["rouge1"] == 0.0


def test_translation_evals_compare_side_by_side(tmp_path):
    """`eval --compare` of translation evaluations: corpus BLEU and chrF side by side, each tested against the first
    with the corpus paired test (it once failed on a missing table entry)."""
    from modelshrink.evaluation.compare import compare

    good = write_jsonl(tmp_path / "good.jsonl", _rows(TARGETS))
    bad = write_jsonl(tmp_path / "bad.jsonl", _rows([_worse(t) for t in TARGETS]))
    first, _ = evaluate(EvalOptions(data=str(bad), resamples=100), tmp_path / "eval-bad")
    second, metrics = evaluate(EvalOptions(data=str(good), resamples=100), tmp_path / "eval-good")
    _, result = compare([str(first), str(second)], tmp_path / "compared", resamples=500)
    assert result["task"] == "translation"
    bad_row, good_row = result["systems"]
    assert good_row["bleu"] == metrics["bleu"] and good_row["bleu"] > bad_row["bleu"]
    assert good_row["p_vs_first"]["bleu"] < 0.01 and good_row["p_vs_first"]["chrf"] < 0.01
