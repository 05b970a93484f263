"""The attention temperature folded into query projections against a direct computation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import FAMILIES, build
from modelshrink.families import ATTENTION_KINDS, family_of
from modelshrink.generation.settings import GenerationSettings, generate
from modelshrink.generation.plate import RowScale, attention_temperature, lambdas_by_kind

UNIT = {k: 1.0 for k in ATTENTION_KINDS}


def _inputs(tok, n=3):
    enc = tok(["the quick brown fox jumps over the lazy dog", "a small library for parsing json files",
               "fonts designed for programming"][:n], padding=True, return_tensors="pt")
    dec = torch.tensor([[3, 5, 7, 9, 11]] * n)
    return dict(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], decoder_input_ids=dec)


def _reference_logits(model, modules, kind, lam, inputs):
    """Logits with the attention scores of `kind` modules divided by sqrt(λ) right before their
    softmax (eager attention), the paper's definition, computed without touching any weight."""
    state = {"lam": None, "calls": 0}
    original = F.softmax

    def softmax(x, *args, **kwargs):
        if state["lam"] is not None:
            state["calls"] += 1
            x = x / math.sqrt(state["lam"])
        return original(x, *args, **kwargs)

    handles = []
    for m in modules:
        if m.kind == kind:
            handles.append(m.module.register_forward_pre_hook(lambda *a: state.update(lam=lam)))
            handles.append(m.module.register_forward_hook(lambda *a: state.update(lam=None)))
    torch.nn.functional.softmax = softmax
    try:
        with torch.no_grad():
            logits = model(**inputs).logits
    finally:
        torch.nn.functional.softmax = original
        for h in handles:
            h.remove()
    assert state["calls"] > 0, "the reference never reached an attention softmax"
    return logits


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_folded_temperature_matches_divided_scores(family, kind):
    # float64: the two computations are the same algebra; in float32 T5's large logits (~20) let
    # rounding of (W/sqrt(λ))·x versus (W·x)/sqrt(λ) reach 3e-4, which would hide nothing but noise.
    model, tok = build(family, attn_implementation="eager")
    model.double()
    modules = family_of(model.config).attention_modules(model)
    inputs = _inputs(tok)
    with torch.no_grad():
        untouched = model(**inputs).logits
    reference = _reference_logits(model, modules, kind, 2.0, inputs)
    with attention_temperature(modules, {**UNIT, kind: 2.0}), torch.no_grad():
        folded = model(**inputs).logits
    assert (folded - reference).abs().max().item() < 1e-5
    assert (folded - untouched).abs().max().item() > 1e-3, "λ=2 should change the logits of this model"


@pytest.mark.parametrize("family", FAMILIES)
def test_fold_is_exact_for_sdpa_kernel_too(family):
    eager, tok = build(family, attn_implementation="eager", seed=1)
    sdpa, _ = build(family, attn_implementation="sdpa", seed=1)
    inputs = _inputs(tok)
    outs = []
    for model in (eager, sdpa):
        model.double()  # compare kernels without float32 rounding (see above)
        modules = family_of(model.config).attention_modules(model)
        with attention_temperature(modules, lambdas_by_kind(1.5)), torch.no_grad():
            outs.append(model(**inputs).logits)
    assert (outs[0] - outs[1]).abs().max().item() < 1e-8


@pytest.mark.parametrize("family", FAMILIES)
def test_lambda_one_is_the_untouched_model_and_weights_are_restored(family):
    model, tok = build(family)
    modules = family_of(model.config).attention_modules(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    inputs = _inputs(tok)
    with torch.no_grad():
        untouched = model(**inputs).logits
        with attention_temperature(modules, lambdas_by_kind(1.0)):
            same = model(**inputs).logits
        with attention_temperature(modules, lambdas_by_kind(2.0)):
            model(**inputs)
    assert torch.equal(untouched, same)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_per_kind_lambda_changes_only_that_kind(family, kind):
    model, _ = build(family)
    modules = family_of(model.config).attention_modules(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with attention_temperature(modules, {**UNIT, kind: 2.0}):
        changed = {k for k, v in model.state_dict().items() if not torch.equal(before[k], v)}
    expected = set()
    names = {id(p): n for n, p in model.named_parameters()}
    for m in modules:
        if m.kind == kind:
            expected |= {names[id(p)] for p in m.query.parameters()}
            if m.position_bias is not None:
                expected.add(names[id(m.position_bias.weight)])
    assert changed == expected and changed


@pytest.mark.parametrize("family", FAMILIES)
def test_row_scales_match_fixed_lambda_per_row(family):
    model, tok = build(family)
    model.double()  # folded vs per-row scaling differ only by float32 rounding (T5: ~1e-4 on logits ~15)
    modules = family_of(model.config).attention_modules(model)
    inputs = _inputs(tok)
    with torch.no_grad():
        with attention_temperature(modules, lambdas_by_kind(2.0)):
            fixed2 = model(**inputs).logits
        with attention_temperature(modules, lambdas_by_kind(per_row=True)) as rows:
            rows.set([2.0, 1.0, 2.0])
            mixed = model(**inputs).logits
        untouched = model(**inputs).logits
    assert (mixed[0] - fixed2[0]).abs().max() < 1e-5
    assert (mixed[2] - fixed2[2]).abs().max() < 1e-5
    assert (mixed[1] - untouched[1]).abs().max() < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_row_scales_follow_rows_through_beam_search(family):
    model, tok = build(family)
    modules = family_of(model.config).attention_modules(model)
    inputs = _inputs(tok)
    settings = GenerationSettings(num_beams=3, length_penalty=1.0, min_length=0, max_length=10,
                                  no_repeat_ngram_size=0, early_stopping=True)
    args = (inputs["input_ids"], inputs["attention_mask"], settings)
    with attention_temperature(modules, lambdas_by_kind(2.0)):
        fixed2 = generate(model, tok, *args)
    fixed1 = generate(model, tok, *args)
    with attention_temperature(modules, lambdas_by_kind(per_row=True)) as rows:
        rows.set([2.0, 1.0, 2.0])
        mixed = generate(model, tok, *args)
    assert mixed == [fixed2[0], fixed1[1], fixed2[2]]
    assert fixed1 != fixed2, "this tiny model should generate differently at λ=2"


def test_row_scale_rejects_mismatched_batch_and_bad_lambda():
    rows = RowScale()
    rows.set([1.0, 2.0])
    assert rows.for_batch(6, torch.zeros(1)).tolist() == pytest.approx([1, 1, 1, 2 ** -0.5, 2 ** -0.5, 2 ** -0.5])
    with pytest.raises(RuntimeError):
        rows.for_batch(3, torch.zeros(1))
    with pytest.raises(ValueError):
        rows.set([0.0])


def test_lambdas_by_kind_resolution():
    assert lambdas_by_kind() == UNIT
    assert lambdas_by_kind(2.0, cross=1.0) == {"encoder_self": 2.0, "decoder_self": 2.0, "decoder_cross": 1.0}
    assert lambdas_by_kind(per_row=True, enc=1.0) == {"encoder_self": 1.0, "decoder_self": None,
                                                      "decoder_cross": None}
