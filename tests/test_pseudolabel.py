"""`pseudolabel` as a library: order, exactness at λ = 1, random λ, resume, atomic output."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import DOCUMENTS, FAMILIES, interrupt_after, read_rows
from modelshrink.artifacts import read_manifest, staging_path, verify_files
from modelshrink.errors import UserError
from modelshrink.generation.plate import row_lambda
from modelshrink.steps.pseudolabel import PseudolabelOptions, pseudolabel


def _options(teacher, data, **kw):
    return PseudolabelOptions(teacher=str(teacher), data=str(data), **{"batch_size": 4, "device": "cpu", **kw})


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_in_input_order_with_references_and_lambda(family, saved_models, docs_jsonl, tmp_path):
    out = pseudolabel(_options(saved_models[family], docs_jsonl, lam=2.0), tmp_path / "pl")
    rows = read_rows(out)
    assert [r["id"] for r in rows] == [f"doc-{i}" for i in range(len(DOCUMENTS))]
    assert [r["document"] for r in rows] == DOCUMENTS
    assert all(r["lambda"] == 2.0 and r["reference"] and isinstance(r["summary"], str) for r in rows)
    assert set(rows[0]) == {"id", "document", "summary", "reference", "lambda"}
    manifest = read_manifest(out)
    assert manifest["step"] == "pseudolabel" and manifest["kind"] == "dataset"
    assert manifest["options"]["lambda"] == 2.0
    assert manifest["resolved"]["lambda_by_kind"]["decoder_cross"] == 2.0
    assert manifest["resolved"]["generation"]["num_beams"] == 2  # from the teacher's config
    assert {p["role"] for p in manifest["parents"]} == {"teacher", "data"}
    assert manifest["metrics"]["documents"] == len(DOCUMENTS)
    assert verify_files(out) == []


@pytest.mark.parametrize("family", FAMILIES)
def test_lambda_one_equals_plain_generation(family, saved_models, docs_jsonl, tmp_path):
    """λ = 1 is the untouched teacher: each summary equals plain `generate` on that document."""
    from modelshrink.models.loading import load_seq2seq

    out = pseudolabel(_options(saved_models[family], docs_jsonl, lam=1.0, batch_size=1, limit=5), tmp_path / "pl")
    model, tok, _ = load_seq2seq(str(saved_models[family]))
    expected = []
    for doc in DOCUMENTS[:5]:
        enc = tok(doc, return_tensors="pt")
        with torch.no_grad():
            ids = model.generate(**enc, num_beams=2, max_length=10)
        expected.append(tok.decode(ids[0], skip_special_tokens=True).strip())
    assert [r["summary"] for r in read_rows(out)] == expected


def test_temperature_changes_the_summaries(saved_models, docs_jsonl, tmp_path):
    """λ = 3 labels are what `generate` writes with every attention at λ = 3 (PLATE's temperature), one
    document at a time, and they are not λ = 1's."""
    from modelshrink.models.loading import load_seq2seq
    from modelshrink.generation.plate import attention_temperature, lambdas_by_kind

    one = read_rows(pseudolabel(_options(saved_models["bart"], docs_jsonl, limit=5), tmp_path / "a"))
    three = read_rows(pseudolabel(_options(saved_models["bart"], docs_jsonl, lam=3.0, limit=5), tmp_path / "b"))
    model, tok, family = load_seq2seq(str(saved_models["bart"]))
    expected = []
    with attention_temperature(family.attention_modules(model), lambdas_by_kind(3.0)), torch.no_grad():
        for doc in DOCUMENTS[:5]:
            ids = model.generate(**tok(doc, return_tensors="pt"), num_beams=2, max_length=10)
            expected.append(tok.decode(ids[0], skip_special_tokens=True).strip())
    assert [r["summary"] for r in three] == expected
    assert [r["summary"] for r in one] != expected


def test_random_lambda_is_seeded_recorded_and_independent_of_batching(saved_models, docs_jsonl, tmp_path):
    teacher = saved_models["t5"]
    a = read_rows(pseudolabel(_options(teacher, docs_jsonl, lambda_range=(1.0, 2.0), seed=7), tmp_path / "a"))
    b = read_rows(pseudolabel(_options(teacher, docs_jsonl, lambda_range=(1.0, 2.0), seed=7, batch_size=5),
                              tmp_path / "b"))
    c = read_rows(pseudolabel(_options(teacher, docs_jsonl, lambda_range=(1.0, 2.0), seed=8), tmp_path / "c"))
    lambdas = [r["lambda"] for r in a]
    assert lambdas == [r["lambda"] for r in b] == [row_lambda(7, i, 1.0, 2.0) for i in range(len(a))]
    assert all(1.0 <= x <= 2.0 for x in lambdas) and len(set(lambdas)) == len(lambdas)
    assert lambdas != [r["lambda"] for r in c]
    assert [r["summary"] for r in a] == [r["summary"] for r in b]


def test_random_lambda_row_equals_fixed_lambda_run(saved_models, docs_jsonl, tmp_path):
    """A document drawn λ gets the summary a fixed-λ run gives it (batch of one: same padding)."""
    teacher = saved_models["bart"]
    drawn = read_rows(pseudolabel(_options(teacher, docs_jsonl, lambda_range=(1.0, 3.0), batch_size=1, limit=3),
                                  tmp_path / "rnd"))
    for i, row in enumerate(drawn):
        fixed = read_rows(pseudolabel(_options(teacher, docs_jsonl, lam=row["lambda"], batch_size=1, limit=3),
                                      tmp_path / f"fixed{i}"))
        assert fixed[i]["summary"] == row["summary"]


def test_per_kind_lambda_recorded_per_row(saved_models, docs_jsonl, tmp_path):
    out = pseudolabel(_options(saved_models["bart"], docs_jsonl, lambda_range=(1.0, 2.0), lambda_enc=1.0, limit=3),
                      tmp_path / "pl")
    for row in read_rows(out):
        assert row["lambda_by_kind"] == {"encoder_self": 1.0, "decoder_self": row["lambda"],
                                         "decoder_cross": row["lambda"]}


class Interrupt(Exception):
    pass



@pytest.mark.parametrize("mode", [dict(lam=2.0), dict(lambda_range=(1.0, 2.0)), dict(do_sample=True)])
def test_resume_after_interruption_gives_the_same_rows(mode, saved_models, docs_jsonl, tmp_path):
    teacher = saved_models["bart"]
    whole = read_rows(pseudolabel(_options(teacher, docs_jsonl, **mode), tmp_path / "whole"))
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        pseudolabel(_options(teacher, docs_jsonl, **mode), out, progress=interrupt_after(1))  # 1 batch written
    assert not out.exists() and staging_path(out).is_dir()
    part = staging_path(out) / "parts" / "part-00000-of-00001.jsonl"
    assert len(part.read_text().splitlines()) == 4
    with open(part, "a") as f:
        f.write('{"_index": 9, "id": "torn')  # the process died mid-line
    resumed = read_rows(pseudolabel(_options(teacher, docs_jsonl, **mode), out, resume=True))
    assert resumed == whole
    assert not staging_path(out).exists()


def test_resume_refuses_other_options_and_unfinished_run_needs_a_choice(saved_models, docs_jsonl, tmp_path):
    teacher, out = saved_models["bart"], tmp_path / "pl"
    with pytest.raises(KeyboardInterrupt):
        pseudolabel(_options(teacher, docs_jsonl, lam=2.0), out, progress=interrupt_after(1))
    with pytest.raises(UserError, match="other options or inputs .*lambda"):
        pseudolabel(_options(teacher, docs_jsonl, lam=1.5), out, resume=True)
    docs_jsonl.write_text(docs_jsonl.read_text().replace("quick brown fox", "slow brown fox"))
    with pytest.raises(UserError, match="data content"):
        pseudolabel(_options(teacher, docs_jsonl, lam=2.0), out, resume=True)
    with pytest.raises(UserError, match="--resume"):
        pseudolabel(_options(teacher, docs_jsonl, lam=2.0), out)
    fresh = pseudolabel(_options(teacher, docs_jsonl, lam=1.5), out, overwrite=True)
    assert read_rows(fresh)[0]["lambda"] == 1.5


def test_resume_of_a_finished_output_changes_nothing(saved_models, docs_jsonl, tmp_path):
    out = pseudolabel(_options(saved_models["bart"], docs_jsonl), tmp_path / "pl")
    before = (out / "modelshrink.json").read_text()
    assert pseudolabel(_options(saved_models["bart"], docs_jsonl), out, resume=True) == out
    assert (out / "modelshrink.json").read_text() == before


def test_failure_never_leaves_a_finished_looking_output(saved_models, docs_jsonl, tmp_path):
    def boom(done, total):
        if done:
            raise RuntimeError("disk full")

    out = tmp_path / "pl"
    with pytest.raises(RuntimeError):
        pseudolabel(_options(saved_models["bart"], docs_jsonl), out, progress=boom)
    assert not out.exists()
    assert not (staging_path(out) / "modelshrink.json").exists()


def test_overwrite_replaces_an_existing_artifact(saved_models, docs_jsonl, tmp_path):
    out = pseudolabel(_options(saved_models["bart"], docs_jsonl, limit=2), tmp_path / "pl")
    with pytest.raises(UserError, match="--overwrite"):
        pseudolabel(_options(saved_models["bart"], docs_jsonl, limit=3), out)
    pseudolabel(_options(saved_models["bart"], docs_jsonl, limit=3), out, overwrite=True)
    assert len(read_rows(out)) == 3


def test_baselines_output_temperature_and_sampling(saved_models, docs_jsonl, tmp_path):
    teacher = saved_models["bart"]
    regular = read_rows(pseudolabel(_options(teacher, docs_jsonl), tmp_path / "reg"))
    tempered = read_rows(pseudolabel(_options(saved_models["t5"], docs_jsonl, output_temperature=0.5), tmp_path / "t"))
    regular_t5 = read_rows(pseudolabel(_options(saved_models["t5"], docs_jsonl), tmp_path / "reg5"))
    sampled = read_rows(pseudolabel(_options(teacher, docs_jsonl, do_sample=True, top_p=0.9, seed=3), tmp_path / "s"))
    again = read_rows(pseudolabel(_options(teacher, docs_jsonl, do_sample=True, top_p=0.9, seed=3), tmp_path / "s2"))
    assert [r["summary"] for r in tempered] != [r["summary"] for r in regular_t5]
    assert [r["summary"] for r in sampled] == [r["summary"] for r in again]
    assert [r["summary"] for r in sampled] != [r["summary"] for r in regular]
    manifest = json.loads((tmp_path / "s" / "modelshrink.json").read_text())
    assert manifest["resolved"]["generation"]["num_beams"] == 1
    assert manifest["resolved"]["generation"]["top_p"] == 0.9


def test_output_temperature_one_is_regular_beam_search(saved_models, docs_jsonl, tmp_path):
    teacher = saved_models["t5"]
    regular = read_rows(pseudolabel(_options(teacher, docs_jsonl), tmp_path / "reg"))
    same = read_rows(pseudolabel(_options(teacher, docs_jsonl, output_temperature=1.0), tmp_path / "t1"))
    assert [r["summary"] for r in regular] == [r["summary"] for r in same]


@pytest.mark.parametrize("kwargs, message", [
    (dict(lam=0.0), "--lambda must be > 0"),
    (dict(lam=-1.0), "--lambda must be > 0"),
    (dict(lambda_cross=0.0), "--lambda-cross must be > 0"),
    (dict(lambda_range=(2.0, 1.0)), "A <= B"),
    (dict(lambda_range=(0.0, 1.0)), "must be > 0"),
    (dict(lam=2.0, lambda_range=(1.0, 2.0)), "exclude each other"),
    (dict(batch_size=0), "--batch-size must be >= 1"),
    (dict(top_p=0.5), "add --do-sample"),
    (dict(lambda_range=(1.0, 2.0), lambda_enc=1.0, lambda_dec=1.5, lambda_cross=2.0), "fix all three"),
    (dict(lam=float("inf")), "finite"),
    (dict(output_temperature=0.0), "--output-temperature must be > 0"),
    (dict(min_length=9, max_length=3), "--min-length 9 is above --max-length 3"),
])
def test_option_checks(kwargs, message):
    with pytest.raises(UserError, match=message):
        PseudolabelOptions(teacher="t", data="d", **kwargs)


def test_default_source_length_is_the_smaller_of_tokenizer_and_positions(tmp_path):
    """A small model reusing a bigger model's tokenizer (512 tokens) with 24 positions: a long
    document is truncated to the positions instead of indexing past the position table."""
    from conftest import build, write_jsonl
    from modelshrink.models.loading import default_source_length

    from transformers import BartForConditionalGeneration

    model, tok = build("bart")
    model.config.max_position_embeddings = 24
    model = BartForConditionalGeneration(model.config)
    tok.model_max_length = 512
    assert default_source_length(tok, model.config) == 24
    model.save_pretrained(tmp_path / "small")
    tok.save_pretrained(tmp_path / "small")
    docs = write_jsonl(tmp_path / "long.jsonl", [{"id": "long", "document": " ".join(DOCUMENTS)}])
    out = pseudolabel(PseudolabelOptions(teacher=str(tmp_path / "small"), data=str(docs), device="cpu",
                                         max_length=5), tmp_path / "pl")
    assert read_manifest(out)["resolved"]["max_source_length"] == 24
