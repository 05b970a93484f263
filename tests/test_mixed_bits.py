"""Issue 55: bits where they matter. `--bits W-E-A,RULES` gives parts of the model their own bits, recorded and
replayed; `--budget-mb` chooses each layer group's bits from measured sensitivity, never over the budget; the
artifact's size is the plan's prediction; export keeps each layer's own codes; bad input is one line."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from conftest import DOCUMENTS, SUMMARIES, build, translator, write_jsonl
from modelshrink.artifacts import read_manifest
from modelshrink.cli import app
from modelshrink.errors import UserError
from modelshrink.quant.budget import PLAN_NAME, Plan, allocate
from modelshrink.quant.groups import weight_groups
from modelshrink.quant.model import WEIGHTS_NAME, format_of, load_quantized, predicted_bytes, save_quantized
from modelshrink.quant.modules import latent_weights, per_tensor_widths, quantize_model
from modelshrink.quant.spec import Group, parse_bits, parse_candidates
from modelshrink.steps.quantize import QuantizeOptions, quantize

runner = CliRunner()


def _pairs(tmp_path: Path, count: int = len(DOCUMENTS)) -> Path:
    rows = [{"id": i, "document": d, "summary": s} for i, (d, s) in enumerate(zip(DOCUMENTS, SUMMARIES))]
    return write_jsonl(tmp_path / "pairs.jsonl", rows[:count])


# ---------------------------------------------------------------- the rules

def test_rules_parse_and_the_last_rule_that_selects_a_group_wins():
    spec = parse_bits("2-2-8, cross_attention=8, decoder.ffn=4, decoder.1=3, lm_head=4")
    assert spec.base_label == "2-2-8" and spec.mixed
    assert spec.label == "2-2-8,cross_attention=8,decoder.ffn=4,decoder.1=3,lm_head=4"
    assert spec.bits_of(Group("encoder", 0, "attention")) == 2  # W
    assert spec.bits_of(Group("decoder", 0, "cross_attention")) == 8
    assert spec.bits_of(Group("decoder", 0, "ffn")) == 4
    assert spec.bits_of(Group("decoder", 1, "cross_attention")) == 3  # decoder.1 comes after cross_attention
    assert spec.bits_of(Group(kind="embeddings")) == 2 and spec.bits_of(Group(kind="lm_head")) == 4
    assert parse_bits(spec.label) == spec  # the label is what the manifest replays
    assert not parse_bits("8-8-8").mixed and parse_bits("8-8-8").label == "8-8-8"


@pytest.mark.parametrize("bits, message", [
    ("2-2-8,cross_attention", "is not a rule"),
    ("2-2-8,ffn=9", "asks for 9 bits; weights take 2 (ternary) to 8"),
    ("2-2-8,ffn=1", "asks for 1 bits"),
    ("2-2-8,3.ffn=4", "a layer number follows a stack"),
    ("2-2-8,decoder.lm_head=4", "lm_head is outside the layers"),
    ("2-2-8,decoder.1.embeddings=4", "or decoder.embeddings=BITS for the decoder's own table"),
    ("2-2-8,mlp=4", "a selector is [encoder|decoder][.LAYER][.KIND]"),
    ("2-2-8,decoder.ffn.x=4", "a selector is"),
    ("2-2-8,decoder.ffn=\u00b2", "is not a rule"),  # a superscript two is a digit to isdigit(), not to int()
    ("2-\u00b2-8", "--bits takes W-E-A"),
    ("2-2-8,decoder.\u00b9.ffn=4", "a selector is"),
])
def test_bad_rules_are_one_line(bits, message):
    with pytest.raises(UserError) as error:
        parse_bits(bits)
    assert message in str(error.value) and "\n" not in str(error.value)


def _translator_model(family: str, tmp_path: Path):
    from transformers import AutoModelForSeq2SeqLM

    return AutoModelForSeq2SeqLM.from_pretrained(translator(family, tmp_path / family))


@pytest.mark.parametrize("family", ["bart", "t5", "bert2bert", "marian", "mbart", "m2m_100", "bert", "distilbert"])
def test_every_family_groups_its_weights_by_layer_and_kind(family, tmp_path):
    from transformers import (BertConfig, BertForSequenceClassification, DistilBertConfig,
                              DistilBertForSequenceClassification)

    if family in ("bart", "t5", "bert2bert"):
        model, _ = build(family)
    elif family == "bert":
        model = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                                         num_attention_heads=2, intermediate_size=32))
    elif family == "distilbert":
        model = DistilBertForSequenceClassification(DistilBertConfig(vocab_size=50, dim=16, n_layers=2, n_heads=2,
                                                                     hidden_dim=32))
    else:
        model = _translator_model(family, tmp_path)
    groups = {g.name: modules for g, modules in weight_groups(model).items()}
    seq2seq = family not in ("bert", "distilbert")
    # bert2bert's encoder and decoder each have a table of their own (the decoder's tied to the LM head)
    tables = {"encoder.embeddings", "decoder.embeddings"} if family == "bert2bert" else {"embeddings"}
    expected = {f"encoder.{i}.{k}" for i in range(2) for k in ("attention", "ffn")} | tables
    if seq2seq:
        expected |= {f"decoder.{i}.{k}" for i in range(2) for k in ("attention", "cross_attention", "ffn")}
    assert expected <= set(groups)
    # a classifier's head; bert2bert's LM transform; learned position tables, a stack's own where it has one
    assert set(groups) - expected <= {"head", "decoder.other", "positions", "encoder.positions", "decoder.positions"}
    if family in ("bart", "bert2bert", "mbart"):
        assert {"encoder.positions", "decoder.positions"} <= set(groups)
    if family in ("bert", "distilbert"):
        assert "positions" in groups
    if family in ("t5", "marian", "m2m_100"):  # relative biases; sinusoids computed from their shape
        assert not any(g.endswith("positions") for g in groups)
    # every linear and word embedding is in exactly one group; attention groups hold q, k, v and the output
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    grouped = [n for modules in groups.values() for n, m in modules if isinstance(m, torch.nn.Linear)]
    assert sorted(linears) == sorted(grouped)
    assert all(len(groups[f"encoder.{i}.attention"]) == 4 for i in range(2))
    if seq2seq:
        assert all(len(groups[f"decoder.{i}.cross_attention"]) == 4 for i in range(2))
    head = model.get_output_embeddings()
    if head is not None:  # a tied LM head is in its table's group
        assert any(m is head for table in tables for _, m in groups[table])


def test_a_table_of_each_stack_takes_its_own_bits_and_embeddings_sets_both(tmp_path):
    """bert2bert's two word-embedding tables are two groups: `encoder.embeddings=2` sets the encoder's alone (a
    format-3 artifact, reloaded exactly), `embeddings=` both, and a stack alone selects layers, not its table."""
    model, tok = build("bert2bert")
    encoder_table = "encoder.embeddings.word_embeddings.weight"
    decoder_table = "decoder.bert.embeddings.word_embeddings.weight"
    spec = parse_bits("4-4-8,encoder.embeddings=2,decoder=8")
    assert spec.bits_of(Group("encoder", -1, "embeddings")) == 2 and spec.bits_of(Group("decoder", -1, "embeddings")) == 4
    assert parse_bits("4-4-8,embeddings=3").bits_of(Group("decoder", -1, "embeddings")) == 3
    quantize_model(model, spec)
    widths = {name: bits for name, (_, bits, _) in latent_weights(model).items()}
    assert widths[encoder_table] == 2 and widths[decoder_table] == 4  # decoder=8 leaves the decoder's table at E
    assert widths["decoder.bert.encoder.layer.0.attention.self.query.weight"] == 8
    save_quantized(model, tok, tmp_path / "q", spec)
    config = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    assert config["format_version"] == 3  # a format-2 reader could not parse encoder.embeddings: refused, not misread
    assert config["groups"]["encoder.embeddings"] == 2 and config["groups"]["decoder.embeddings"] == 4
    reloaded = load_quantized(tmp_path / "q")
    batch = tok(["the quick brown fox"], return_tensors="pt")
    target = tok(["a fox"], return_tensors="pt").input_ids
    with torch.no_grad():
        expected = model.eval()(**batch, decoder_input_ids=target).logits
        assert torch.equal(reloaded(**batch, decoder_input_ids=target).logits, expected)
    # the lowest format that holds it: rules without a stack's table stay format 2, uniform bits 1
    assert format_of(parse_bits("4-4-8,embeddings=2,decoder.0=8")) == 2 and format_of(parse_bits("4-4-8")) == 1


def test_a_marian_with_a_vocabulary_per_side_has_a_table_group_per_stack(tmp_path):
    """A Marian without shared embeddings keeps its decoder's table under `model.model.decoder` (no `.decoder` on
    the outer model, as bert2bert has): it is `decoder.embeddings`, with the LM head tied to it, and quantized
    like the head, so what trains is what is stored (the decoder once looked its tokens up in the float latent
    table and a reloaded artifact computed other logits)."""
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(0)
    model = MarianMTModel(MarianConfig(
        vocab_size=60, decoder_vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        max_position_embeddings=20, pad_token_id=0, decoder_start_token_id=0, share_encoder_decoder_embeddings=False))
    tables = {g.name: sorted(name for name, _ in modules) for g, modules in weight_groups(model).items()
              if g.kind == "embeddings"}
    assert tables == {"encoder.embeddings": ["model.encoder.embed_tokens"],
                      "decoder.embeddings": ["lm_head", "model.decoder.embed_tokens"]}
    spec = parse_bits("2-4-8,decoder.embeddings=8")
    quantize_model(model, spec)
    widths = {name: bits for name, (_, bits, _) in latent_weights(model).items()}
    assert widths["model.encoder.embed_tokens.weight"] == 4 and widths["model.decoder.embed_tokens.weight"] == 8
    save_quantized(model, None, tmp_path / "q", spec)
    reloaded = load_quantized(tmp_path / "q")
    ids = torch.tensor([[3, 4, 5, 1]])
    with torch.no_grad():
        expected = model.eval()(input_ids=ids, decoder_input_ids=ids[:, :3]).logits
        assert torch.equal(reloaded.eval()(input_ids=ids, decoder_input_ids=ids[:, :3]).logits, expected)


def test_position_tables_are_float_unless_a_rule_quantizes_them(saved_models, tmp_path):
    """`positions=8` stores learned position tables as 8-bit codes a row (a quarter of their float bytes), per stack
    where each has one; a format-3 artifact that reloads exactly. Uniform bits leave them float, as DQ-BART does."""
    model, tok = build("bert2bert")
    tables = ("encoder.embeddings.position_embeddings.weight", "decoder.bert.embeddings.position_embeddings.weight")
    quantize_model(model, parse_bits("4-4-8"))
    assert not set(tables) & set(latent_weights(model))
    uniform = predicted_bytes(model)
    model, tok = build("bert2bert")
    quantize_model(model, parse_bits("4-4-8,positions=8"))
    stored = latent_weights(model)
    assert all(stored[t][1:] == (8, True) for t in tables)  # 8 bits, a scale a row
    saved = sum(stored[t][0].numel() * 3 - stored[t][0].shape[0] * 4 for t in tables)  # 4 bytes -> 1, plus scales
    assert uniform - predicted_bytes(model) == pytest.approx(saved, abs=200)  # (the header's names)
    save_quantized(model, tok, tmp_path / "q", parse_bits("4-4-8,positions=8"))
    config = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    assert config["format_version"] == 3 and config["groups"]["decoder.positions"] == 8
    batch, target = tok(["the quick brown fox"], return_tensors="pt"), tok(["a fox"], return_tensors="pt").input_ids
    with torch.no_grad():
        assert torch.equal(load_quantized(tmp_path / "q")(**batch, decoder_input_ids=target).logits,
                           model.eval()(**batch, decoder_input_ids=target).logits)
    one, _ = build("bart")  # BART's learned positions, per stack too
    quantize_model(one, parse_bits("4-4-8,encoder.positions=8"))
    assert {n for n in latent_weights(one) if "positions" in n} == {"model.encoder.embed_positions.weight"}


def test_a_budget_keeps_pinned_position_tables_at_their_bits(saved_models, tmp_path):
    out = quantize(QuantizeOptions(model=str(saved_models["bart"]), data=str(_pairs(tmp_path)), method="direct",
                                   bits="8-8-8,positions=8", device="cpu", budget_mb=0.06, calibration_examples=4),
                   tmp_path / "b")
    plan = json.loads((out / PLAN_NAME).read_text())
    assert plan["groups"]["encoder.positions"]["bits"] == plan["groups"]["decoder.positions"]["bits"] == 8
    assert plan["groups"]["decoder.positions"]["pinned"] and plan["predicted_bytes"] <= 60_000
    assert json.loads((out / "config.json").read_text())["quantization_config"]["format_version"] == 3


def test_a_plan_made_with_one_embeddings_group_sets_both_tables():
    """A budget run planned before the tables were two groups resumes: its `embeddings` bits go to both."""
    from modelshrink.quant.budget import Plan, apply_plan

    model, _ = build("bert2bert")
    quantize_model(model, parse_bits("8-8-8"))
    groups = {g.name: {"bits": 2 if g.kind == "ffn" else 4} for g in weight_groups(model)
              if g.kind not in ("embeddings", "positions")}  # position tables are float, hence in no plan
    apply_plan(model, Plan(1, 1, 1, [2, 4, 8], 1, 0.0, 0.0, {**groups, "embeddings": {"bits": 3}}))
    widths = {name: bits for name, (_, bits, _) in latent_weights(model).items()}
    assert widths["encoder.embeddings.word_embeddings.weight"] == widths[
        "decoder.bert.embeddings.word_embeddings.weight"] == 3
    assert widths["encoder.encoder.layer.0.intermediate.dense.weight"] == 2
    with pytest.raises(UserError, match="is for another model"):  # a group of the plan's missing
        apply_plan(model, Plan(1, 1, 1, [2, 4, 8], 1, 0.0, 0.0, groups))


def test_a_mixed_map_is_stored_reloaded_exactly_and_recorded(saved_models, tmp_path):
    bits = "2-2-8,cross_attention=8,decoder.1.ffn=4,encoder.0=3"
    out = quantize(QuantizeOptions(model=str(saved_models["bart"]), bits=bits, method="direct", device="cpu"),
                   tmp_path / "q")
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["format_version"] == 2 and config["bits"] == bits
    assert config["groups"]["decoder.0.cross_attention"] == 8 and config["groups"]["decoder.1.ffn"] == 4
    assert config["groups"]["decoder.0.ffn"] == 2 and config["groups"]["encoder.0.attention"] == 3
    for name, info in config["tensors"].items():  # each tensor's own width, as its group's
        expected = (8 if "encoder_attn" in name else 4 if "decoder.layers.1.fc" in name
                    else 3 if "encoder.layers.0." in name else 2)
        assert info["bits"] == expected, name
    # the reloaded model computes exactly what the quantized model computed
    reference, tok = build("bart")
    reference = type(reference).from_pretrained(saved_models["bart"]).eval()
    quantize_model(reference, parse_bits(bits))
    model = load_quantized(out)
    enc = tok(["the quick brown fox", "a small library of things"], padding=True, return_tensors="pt")
    with torch.no_grad():
        args = dict(**enc, decoder_input_ids=torch.tensor([[3, 4, 5], [3, 6, 7]]))
        assert torch.equal(model(**args).logits, reference.eval()(**args).logits)
    assert read_manifest(out)["options"]["bits"] == bits  # replayed by --config / the manifest
    # a uniform artifact stays format 1 (readers from before per-layer bits read it as ever)
    uniform = quantize(QuantizeOptions(model=str(saved_models["bart"]), bits="2-2-8", method="direct", device="cpu"),
                       tmp_path / "u")
    assert "format_version" not in json.loads((uniform / "config.json").read_text())["quantization_config"]


def test_a_newer_format_is_refused_in_one_line_not_misread(saved_models, tmp_path):
    out = quantize(QuantizeOptions(model=str(saved_models["t5"]), bits="4-4-8,decoder=8", method="direct",
                                   device="cpu"), tmp_path / "q")
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"]["format_version"] = 4
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="format 4, written by a newer modelshrink; this one reads formats up to 3"):
        load_quantized(out)
    result = runner.invoke(app, ["eval", str(out), str(_pairs(tmp_path)), "-o", str(tmp_path / "e")])
    assert result.exit_code == 1 and "written by a newer modelshrink" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("family, bits, message", [
    ("bart", "2-2-8,decoder.5=4", "selects nothing: this model has encoder layers 0-1; decoder layers 0-1"),
    ("bart", "2-2-8,lm_head=4", "ties its LM head to the word embeddings"),
    ("bart", "2-2-8,head=4", "selects nothing"),
    ("bart", "2-2-8,encoder.embeddings=4", "encoder and decoder share one word-embedding table: set embeddings=BITS"),
    ("bert2bert", "2-2-8,lm_head=4", "ties its LM head to the word embeddings (one tensor): set decoder.embeddings="),
    ("t5", "2-2-8,positions=8", "selects nothing: this model has no learned position table"),
])
def test_rules_the_model_cannot_take_are_one_line(saved_models, tmp_path, family, bits, message):
    result = runner.invoke(app, ["quantize", str(saved_models[family]), "--bits", bits, "--method", "direct",
                                 "--device", "cpu", "-o", str(tmp_path / "q")])
    assert result.exit_code == 1 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "q").exists()


@pytest.mark.slow
def test_export_keeps_each_layer_in_its_own_bits(plain_models, tmp_path):
    bits = "2-2-8,cross_attention=8,decoder.ffn=4"
    quantized = quantize(QuantizeOptions(model=str(plain_models["bart"]), bits=bits, method="direct", device="cpu"),
                         tmp_path / "q")
    out = tmp_path / "onnx"
    result = runner.invoke(app, ["export", str(quantized), "-o", str(out), "--kernel", "nbits", "--samples", "3",
                                 "--generation-docs", "2"])
    assert result.exit_code == 0, result.output
    manifest = read_manifest(out)
    assert manifest["metrics"]["passed"] is True and manifest["resolved"]["quantized_artifact"] == bits
    assert manifest["resolved"]["weights"]["kind"] == "quantized" and manifest["resolved"]["weights"]["widths"] == [2, 4, 8]
    report = json.loads((out / "export_report.json").read_text())
    decoder = next(v for k, v in report["storage"].items() if k.startswith("decoder"))
    assert sorted(decoder["low_bit_widths"]) == [2, 4, 8]


# ---------------------------------------------------------------- the budget

def test_allocation_is_the_optimum_of_the_knapsack():
    """Against brute force on random small problems: the least summed sensitivity within the capacity."""
    rng = random.Random(0)
    for _ in range(40):
        groups = [Group("encoder", i, "ffn") for i in range(rng.randint(1, 5))]
        extra = {g: {2: 0, 4: rng.randint(1, 50), 8: 0} for g in groups}
        for g in groups:
            extra[g][8] = extra[g][4] + rng.randint(1, 80)
        sensitivity = {g: {8: 0.0, 4: rng.random(), 2: 0.0} for g in groups}
        for g in groups:
            sensitivity[g][2] = sensitivity[g][4] + rng.random() * 3
        capacity = rng.randint(0, sum(e[8] for e in extra.values()))
        chosen = allocate(extra, sensitivity, capacity)
        assert sum(extra[g][b] for g, b in chosen.items()) <= capacity
        best = min(sum(sensitivity[g][b] for g, b in zip(groups, combo))
                   for combo in itertools.product((2, 4, 8), repeat=len(groups))
                   if sum(extra[g][b] for g, b in zip(groups, combo)) <= capacity)
        assert sum(sensitivity[g][b] for g, b in chosen.items()) == pytest.approx(best)


def test_candidate_bits_parse():
    assert parse_candidates("8,2,4") == (2, 4, 8)
    for bad in ("8", "2,9", "a,b", ""):
        with pytest.raises(UserError, match="--candidate-bits takes two or more widths"):
            parse_candidates(bad)


def test_the_predicted_size_is_the_written_size_for_every_map(saved_models, tmp_path):
    model, tok = build("t5")
    quantize_model(model, parse_bits("2-2-8,decoder.0=8,encoder.ffn=4,embeddings=3"))
    predicted = predicted_bytes(model)
    save_quantized(model, tok, tmp_path / "q", parse_bits("2-2-8,decoder.0=8,encoder.ffn=4,embeddings=3"))
    assert (tmp_path / "q" / WEIGHTS_NAME).stat().st_size == predicted
    assert {info[1] for info in latent_weights(model).values()} == {2, 3, 4, 8}


@pytest.mark.slow
def test_a_budget_plans_measures_and_never_exceeds(saved_models, tmp_path):
    pairs = _pairs(tmp_path)
    common = dict(model=str(saved_models["bart"]), data=str(pairs), device="cpu", max_steps=2, batch_size=4,
                  calibration_examples=8, budget_mb=0.065)
    lines: list[str] = []
    out = quantize(QuantizeOptions(**common), tmp_path / "b", log=lines.append)
    manifest = read_manifest(out)
    plan = manifest["metrics"]["bit_plan"]
    written = (out / WEIGHTS_NAME).stat().st_size
    assert written == plan["written_bytes"] == plan["predicted_bytes"] <= 65_000 == plan["budget_bytes"]
    assert plan["smallest_bytes"] < written and "sensitivity_share_of_training" in plan
    # a budget's default scale is a row's (unset in the record, which replays to it)
    assert json.loads((out / "config.json").read_text())["quantization_config"]["granularity"] == "row"
    assert len(set(plan["bits"].values())) > 1  # a real mix at this budget
    saved = json.loads((out / PLAN_NAME).read_text())  # beside the artifact: bits, bytes, sensitivity per group
    assert {k: v["bits"] for k, v in saved["groups"].items()} == plan["bits"]
    assert all(v["sensitivity"]["2"] >= v["sensitivity"]["4"] >= v["sensitivity"]["8"] == 0
               for v in saved["groups"].values())
    # the plan is printed before training, and is in the card
    assert any(line.startswith("bit plan: ") for line in lines) and any("decoder.1.cross_attention" in line
                                                                        for line in lines)
    assert "## Bits by layer group (--budget-mb)" in (out / "README.md").read_text()
    # each tensor is stored at its group's bits
    stored = json.loads((out / "config.json").read_text())["quantization_config"]
    assert stored["groups"] == plan["bits"]
    # a larger budget buys more bits, never fewer (the same measurement: no training needed to see it)
    larger = quantize(QuantizeOptions(**{**common, "budget_mb": 0.08, "max_steps": 0}), tmp_path / "b3")
    more = read_manifest(larger)["metrics"]["bit_plan"]
    assert more["predicted_bytes"] > written and sum(more["bits"].values()) >= sum(plan["bits"].values())



def test_a_budget_holds_when_the_header_grows_more_than_its_slack(saved_models, tmp_path, monkeypatch):
    """The file's header grows with the data (offsets gain digits); where it grows by more than the allocation's
    slack, the bits are allocated again under that much less, so the plan still fits and keeps a mix."""
    from modelshrink.quant import budget

    real, sizes = budget.predicted_bytes, []

    def bigger_header(model):  # 1,500 bytes more whenever any group is above the narrowest bits
        sizes.append(real(model))
        return sizes[-1] + (1500 if sizes[-1] > min(sizes) else 0)

    monkeypatch.setattr(budget, "predicted_bytes", bigger_header)
    options = QuantizeOptions(model=str(saved_models["bart"]), data=str(_pairs(tmp_path)), device="cpu", max_steps=0,
                              batch_size=4, calibration_examples=8, budget_mb=0.065)
    plan = read_manifest(quantize(options, tmp_path / "b"))["metrics"]["bit_plan"]
    assert plan["predicted_bytes"] <= 65_000 and len(set(plan["bits"].values())) > 1
    assert max(sizes) + 1500 > 65_000  # the first allocation's header did go over: the budget was allocated again

def test_a_budget_for_a_classifier_and_for_direct_quantization(classifier_path, saved_models, tmp_path):
    rows = [{"text": d, "label": i % 2} for i, d in enumerate(DOCUMENTS)]
    data = write_jsonl(tmp_path / "labels.jsonl", rows)
    sizes = [(quantize(QuantizeOptions(model=str(classifier_path), bits=bits, method="direct", device="cpu"),
                       tmp_path / bits) / WEIGHTS_NAME).stat().st_size for bits in ("2-2-8", "8-8-8")]
    budget = sum(sizes) / 2 / 1e6  # between the smallest and the widest
    out = quantize(QuantizeOptions(model=str(classifier_path), data=str(data), device="cpu", max_steps=1,
                                   batch_size=4, budget_mb=budget, calibration_examples=8), tmp_path / "c")
    plan = read_manifest(out)["metrics"]["bit_plan"]
    assert plan["written_bytes"] == plan["predicted_bytes"] <= budget * 1e6
    assert "head" in plan["bits"] and "encoder.0.ffn" in plan["bits"]
    direct = quantize(QuantizeOptions(model=str(saved_models["t5"]), data=str(_pairs(tmp_path)), method="direct",
                                      device="cpu", budget_mb=0.07, calibration_examples=4), tmp_path / "d")
    plan = read_manifest(direct)["metrics"]["bit_plan"]
    assert plan["written_bytes"] == plan["predicted_bytes"] <= 70_000
    assert (direct / PLAN_NAME).is_file()


@pytest.mark.slow
def test_a_resumed_budget_run_reads_its_plan_back(saved_models, tmp_path):
    calls = []

    def interrupt(entry):  # Ctrl-C after the first logged step: the checkpoint of step 2 is on disk
        calls.append(entry)
        if len(calls) > 2:
            raise KeyboardInterrupt

    pairs = _pairs(tmp_path)
    options = QuantizeOptions(model=str(saved_models["bart"]), data=str(pairs), device="cpu", max_steps=4,
                              batch_size=4, save_every=2, log_every=1, calibration_examples=8, budget_mb=0.065)
    with pytest.raises(KeyboardInterrupt):
        quantize(options, tmp_path / "r", progress=interrupt)
    lines: list[str] = []
    out = quantize(options, tmp_path / "r", resume=True, log=lines.append)
    assert any("bit plan read back" in line for line in lines)
    assert not any("measuring the sensitivity" in line for line in lines)
    # deterministic for a seed: measured again from scratch, the same plan
    fresh = quantize(dataclasses.replace(options, max_steps=0), tmp_path / "fresh")
    assert read_manifest(out)["metrics"]["bit_plan"]["bits"] == read_manifest(fresh)["metrics"]["bit_plan"]["bits"]


@pytest.mark.parametrize("args, message", [
    (["--budget-mb", "0.01"], "is below the smallest this model can be stored: 0.0"),
    (["--budget-mb", "0.07", "--bits", "2-2-8"], "--bits 2-2-8 sets every weight's bits, and --budget-mb chooses"),
    (["--budget-mb", "0"], "--budget-mb must be > 0"),
    (["--budget-mb", "0.07", "--candidate-bits", "4"], "--candidate-bits takes two or more widths"),
    (["--candidate-bits", "2,4"], "--candidate-bits goes with --budget-mb"),
    (["--budget-of", "export"], "--budget-of goes with --budget-mb"),
    (["--budget-mb", "0.07", "--bits", "8-8-8,encoder=4,decoder=2,embeddings=8"],
     "pins every weight group, so --budget-mb has nothing to choose: drop --budget-mb (the pins alone store 0.0"),
])
def test_bad_budgets_are_one_line(saved_models, tmp_path, args, message):
    pairs = _pairs(tmp_path)
    result = runner.invoke(app, ["quantize", str(saved_models["bart"]), "--data", str(pairs), "--max-steps", "1",
                                 "--device", "cpu", "-o", str(tmp_path / "q"), *args])
    assert result.exit_code == 1 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_budget_scales_weights_per_row_unless_told():
    """Per tensor, 4 bits can round outlier-heavy weights worse than ternary (benchmarks/weight_rounding.py), which
    leaves a budget's 4-bit candidate nothing to buy: with --budget-mb the default scale is a row's."""
    base = dict(model="m", data="d.jsonl", max_steps=1)
    assert QuantizeOptions(**base).spec.granularity == "tensor"  # DQ-BART's, for uniform bits
    assert QuantizeOptions(**base, budget_mb=20).spec.granularity == "row"
    assert QuantizeOptions(**base, budget_mb=20, granularity="tensor").spec.granularity == "tensor"


def test_per_tensor_scales_at_3_or_4_bits_get_a_note_unless_asked_for(saved_models, tmp_path):
    """At 3 or 4 bits one scale a tensor rounds a trained MiniLM's FFNs worse than ternary: a run that got per-tensor
    scales by default says so once; one that asked for them, or scales per row, or ternary / 8 bits, does not."""
    def widths(bits: str, granularity: str = "tensor") -> tuple[int, ...]:  # read from the quantized model
        model, _ = build("bart")
        quantize_model(model, parse_bits(bits, granularity=granularity))
        return per_tensor_widths(model)

    assert widths("4-4-8") == (4,)
    assert widths("2-2-8,decoder.ffn=3,cross_attention=4") == (3, 4)
    assert widths("8-8-8,embeddings=4") == ()  # embeddings and the (tied) LM head: per row anyway
    assert widths("4-4-8,encoder=8,decoder=8") == ()  # every layer moved off the base's 4 bits
    assert widths("4-4-8", granularity="row") == () == widths("2-2-8")
    notes = {}
    for name, extra in (("default", {}), ("asked", {"granularity": "tensor"}), ("row", {"granularity": "row"})):
        lines: list[str] = []
        quantize(QuantizeOptions(model=str(saved_models["bart"]), bits="4-4-8", method="direct", device="cpu",
                                 **extra), tmp_path / name, log=lines.append)
        notes[name] = [line for line in lines if "--granularity row is usually better" in line]
    assert len(notes["default"]) == 1 and "4-bit weights with one scale a tensor" in notes["default"][0]
    assert notes["asked"] == [] and notes["row"] == []
    lines = []
    quantize(QuantizeOptions(model=str(saved_models["bart"]), bits="2-2-8", method="direct", device="cpu"),
             tmp_path / "ternary", log=lines.append)
    assert not any("granularity row" in line for line in lines)


def test_a_budget_needs_data(saved_models, tmp_path):
    result = runner.invoke(app, ["quantize", str(saved_models["bart"]), "--method", "direct", "--budget-mb", "1",
                                 "--device", "cpu", "-o", str(tmp_path / "q")])
    assert result.exit_code == 1 and "--budget-mb measures each layer's sensitivity on examples: give --data" \
        in result.stderr


def test_the_budget_recipe_is_a_valid_config(tmp_path, monkeypatch):
    """recipes/budget-20mb.toml parses into the QuantizeOptions it says (through the command line's --config)."""
    import modelshrink.steps.quantize as step

    seen = []
    monkeypatch.setattr(step, "quantize", lambda options, output, **kwargs: seen.append(options) or Path(output))
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "budget-20mb.toml"
    result = runner.invoke(app, ["quantize", "teacher", "-o", str(tmp_path / "q"), "--data", "train.jsonl",
                                 "--config", str(recipe)])
    assert result.exit_code == 0, result.output
    options, = seen
    assert options.budget_mb == 20.0 and options.spec.rules == (("embeddings", 8),) and options.epochs == 3


def test_a_plan_replays_each_groups_bits_when_one_name_selects_another():
    """A bert2bert whose encoder and decoder widths differ has a linear outside both stacks (enc_to_dec_proj,
    group `other`); the selector `other` also selects `decoder.other` (its LM transform), so the plan's rules put
    the broader name first and every group replays the bits the plan gave it (the config's `groups` once recorded
    decoder.other at `other`'s bits)."""
    from transformers import BertConfig, EncoderDecoderConfig, EncoderDecoderModel

    shape = dict(vocab_size=50, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                 max_position_embeddings=20)
    model = EncoderDecoderModel(EncoderDecoderConfig.from_encoder_decoder_configs(
        BertConfig(hidden_size=32, **shape), BertConfig(hidden_size=16, is_decoder=True, add_cross_attention=True,
                                                        **shape)))
    groups = list(weight_groups(model))
    assert {"other", "decoder.other"} <= {g.name for g in groups}
    for planned in itertools.product((2, 8), repeat=2):
        bits = {g.name: 4 for g in groups} | dict(zip(("other", "decoder.other"), planned))
        plan = Plan(budget_bytes=1, predicted_bytes=1, smallest_bytes=1, candidates=[2, 4, 8], calibration_examples=1,
                    baseline_loss=0.0, seconds=0.0, groups={name: {"bits": b} for name, b in bits.items()})
        spec = parse_bits("8-8-8").with_rules(plan.rules)
        assert {g.name: spec.bits_of(g) for g in groups} == bits


def test_a_budget_of_the_export_counts_the_shared_table_twice(tmp_path):
    """--budget-of export: a Marian's one word-embedding table is in the export's encoder graph and again in its
    decoder's, so the budget bounds the artifact plus a second copy of that table at the plan's bits; a budget that
    the artifact alone could meet but not with that copy is refused, saying so."""
    from modelshrink.quant.budget import copy_bytes, stored_twice

    teacher = translator("marian", tmp_path / "marian")
    rows = [{"id": i, "source": d, "target": s} for i, (d, s) in enumerate(zip(DOCUMENTS, SUMMARIES))]
    pairs = write_jsonl(tmp_path / "pairs.jsonl", rows)
    common = dict(model=str(teacher), device="cpu", method="direct")
    low, high = (read_manifest(quantize(QuantizeOptions(**common, bits=bits, granularity="row"), tmp_path / bits)
                               )["metrics"]["bytes_on_disk"] for bits in ("2-2-8", "8-8-8"))
    common.update(data=str(pairs), calibration_examples=8, batch_size=4)
    model = _translator_model("marian", tmp_path)
    quantize_model(model, parse_bits("8-8-8"))
    (table,) = stored_twice(model, weight_groups(model)).values()
    budget = (low + high) // 2
    plans = {of: read_manifest(quantize(QuantizeOptions(**common, budget_mb=budget / 1e6, budget_of=of),
                                        tmp_path / of))["metrics"]["bit_plan"] for of in ("artifact", "export")}
    assert "counted_twice" not in plans["artifact"] and plans["export"]["counted_twice"] == ["embeddings"]
    export = plans["export"]
    assert export["bounded_bytes"] == export["written_bytes"] + copy_bytes(table, export["bits"]["embeddings"])
    assert export["bounded_bytes"] <= budget and plans["artifact"]["written_bytes"] <= budget
    # room for the artifact at its smallest, not for the table's second copy as well
    tight = dict(common, budget_mb=(low + copy_bytes(table, 2) // 2) / 1e6)
    quantize(QuantizeOptions(**tight), tmp_path / "tight-artifact")
    with pytest.raises(UserError, match="second copy of the shared word-embedding table"):
        quantize(QuantizeOptions(**tight, budget_of="export"), tmp_path / "tight-export")
