"""models/shrink.py: layer maps, and students that keep exactly the teacher's chosen layers."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import DOCUMENTS, FAMILIES, SUMMARIES, build

from modelshrink.errors import UserError
from modelshrink.families import family_of
from modelshrink.models.shrink import check_layer_ids, first_layer_ids, layer_counts, shrink, spaced_layer_ids


def _set_dotted(config, dotted: str, value) -> None:
    *parents, name = dotted.split(".")
    for parent in parents:
        config = getattr(config, parent)
    setattr(config, name, value)


def build_deep(family: str, n_layers: int = 4, attn_implementation: str = "sdpa", seed: int = 0):
    """conftest.build's tiny model of `family`, but with `n_layers` encoder and decoder layers."""
    base, tok = build(family, attn_implementation, seed)
    config = copy.deepcopy(base.config)
    fam = family_of(config)
    _set_dotted(config, fam.encoder_layers_config, n_layers)
    _set_dotted(config, fam.decoder_layers_config, n_layers)
    torch.manual_seed(seed)
    model = type(base)(config)
    for cfg in (model.config, *((model.encoder.config, model.decoder.config) if family == "bert2bert" else ())):
        cfg._attn_implementation = attn_implementation
    with torch.no_grad():  # as conftest.build: non-zero biases, so a wrongly copied bias shows
        for name, param in model.named_parameters():
            if name.endswith(".bias") and "norm" not in name.lower():
                param.normal_(0.0, 0.2)
    model.generation_config = copy.deepcopy(base.generation_config)
    model.eval()
    assert layer_counts(model) == (n_layers, n_layers)
    return model, tok


@pytest.fixture(scope="module", params=FAMILIES)
def teacher(request):
    model, tok = build_deep(request.param)
    return request.param, model, tok


def _batch(tok):
    enc = tok(DOCUMENTS[:3], return_tensors="pt", padding=True)
    dec = tok(SUMMARIES[:3], return_tensors="pt", padding=True)
    return dict(input_ids=enc.input_ids, attention_mask=enc.attention_mask,
                decoder_input_ids=dec.input_ids, decoder_attention_mask=dec.attention_mask)


def _logits(model, batch):
    with torch.no_grad():
        return model(**batch).logits


def _loader(family):
    from transformers import AutoModelForSeq2SeqLM, EncoderDecoderModel

    return EncoderDecoderModel if family == "bert2bert" else AutoModelForSeq2SeqLM


def _layers_prefixes(model) -> tuple[str, str]:
    fam = family_of(model.config)
    names = {id(m): n for n, m in model.named_modules()}
    return names[id(fam.encoder_layers_of(model))], names[id(fam.decoder_layers_of(model))]


# --- layer maps ---------------------------------------------------------------------------------

@pytest.mark.parametrize("n, k, expected", [
    (12, 6, [0, 2, 4, 7, 9, 11]),  # distilbart
    (12, 3, [0, 6, 11]),
    (12, 1, [11]),
    (6, 3, [0, 3, 5]),  # DQ-BART Appendix B
    (6, 2, [0, 5]),
    (6, 1, [5]),
    (12, 12, list(range(12))),
    (1, 1, [0]),
])
def test_spaced_layer_ids(n, k, expected):
    assert spaced_layer_ids(n, k) == expected


def test_first_layer_ids():
    assert first_layer_ids(12, 3) == [0, 1, 2]
    assert first_layer_ids(6, 1) == [0]
    assert first_layer_ids(4, 4) == [0, 1, 2, 3]


@pytest.mark.parametrize("select", [spaced_layer_ids, first_layer_ids])
def test_layer_counts_out_of_range(select):
    with pytest.raises(UserError, match=r"^--encoder-layers 13 is above the teacher's 12 encoder layers$"):
        select(12, 13)
    with pytest.raises(UserError, match=r"^--decoder-layers must be >= 1, got 0$"):
        select(12, 0, side="decoder")
    with pytest.raises(UserError, match=r"--decoder-layers must be >= 1, got -2"):
        select(12, -2, side="decoder")


def test_check_layer_ids():
    assert check_layer_ids([5, 0, 3], 6, "encoder") == [5, 0, 3]  # order kept
    with pytest.raises(UserError, match=r"--decoder-layer-ids is empty"):
        check_layer_ids([], 6, "decoder")
    with pytest.raises(UserError, match=r"--encoder-layer-ids: layer 6 is out of range.*0\.\.5"):
        check_layer_ids([0, 6], 6, "encoder")
    with pytest.raises(UserError, match=r"--encoder-layer-ids: layer -1 is out of range.*0\.\.5"):
        check_layer_ids([-1], 6, "encoder")
    with pytest.raises(UserError, match=r"--decoder-layer-ids: layer 2 repeats"):
        check_layer_ids([2, 4, 2], 6, "decoder")


def test_shrink_refuses_bad_ids():
    model, _ = build("bart")
    with pytest.raises(UserError, match=r"--encoder-layer-ids: layer 2 is out of range"):
        shrink(model, [0, 2], [0])
    with pytest.raises(UserError, match=r"--decoder-layer-ids: layer 1 repeats"):
        shrink(model, [0], [1, 1])


# --- students -----------------------------------------------------------------------------------

def test_student_keeps_chosen_layers(teacher, tmp_path):
    family, model, tok = teacher
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config_before = model.config.to_dict()
    enc_ids, dec_ids = [0, 3], [3]

    student = shrink(model, enc_ids, dec_ids)

    fam = family_of(student.config)
    assert layer_counts(student) == (2, 1)
    for t_layers, s_layers, ids in ((fam.encoder_layers_of(model), fam.encoder_layers_of(student), enc_ids),
                                    (fam.decoder_layers_of(model), fam.decoder_layers_of(student), dec_ids)):
        for j, i in enumerate(ids):
            t_params = dict(t_layers[i].named_parameters())
            s_params = dict(s_layers[j].named_parameters())
            extra = set(s_params) - set(t_params)
            # only T5's relative position bias may move into a new first block
            assert all(n.endswith("relative_attention_bias.weight") for n in extra) and (not extra or j == 0)
            for name, param in t_params.items():
                assert torch.equal(s_params[name], param), (family, i, j, name)
                assert s_params[name].data_ptr() != param.data_ptr()  # a copy, not the teacher's tensor
            for module in s_layers[j].modules():
                if hasattr(module, "layer_idx"):
                    assert module.layer_idx == j

    # everything outside the layer stacks (embeddings, positions, final norms, LM head) is the teacher's
    t_prefixes = tuple(p + "." for p in _layers_prefixes(model))
    s_state = student.state_dict()
    outside = [k for k in before if not k.startswith(t_prefixes)]
    assert outside
    for key in outside:
        assert torch.equal(s_state[key], before[key]), key
    assert student.get_input_embeddings().weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()

    # the teacher is unchanged
    assert layer_counts(model) == (4, 4)
    assert model.config.to_dict() == config_before
    assert not hasattr(model.config, "modelshrink_layer_map")
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    for index, layer in enumerate(fam.decoder_layers_of(model)):
        assert all(m.layer_idx == index for m in layer.modules() if hasattr(m, "layer_idx"))

    # save_pretrained + from_pretrained rebuilds the same student, every weight accounted for
    student.save_pretrained(tmp_path)
    reloaded, info = _loader(family).from_pretrained(tmp_path, output_loading_info=True)
    reloaded.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert layer_counts(reloaded) == (2, 1)
    assert reloaded.config.modelshrink_layer_map == {"encoder": enc_ids, "decoder": dec_ids}
    batch = _batch(tok)
    torch.testing.assert_close(_logits(reloaded, batch), _logits(student, batch), rtol=0, atol=0)

    if family == "t5":
        t_bias = model.decoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight
        r_attn = reloaded.decoder.block[0].layer[0].SelfAttention
        assert r_attn.has_relative_attention_bias
        assert torch.equal(r_attn.relative_attention_bias.weight, t_bias)


def test_student_with_every_layer_is_the_teacher(teacher):
    family, model, tok = teacher
    student = shrink(model, [0, 1, 2, 3], [0, 1, 2, 3])
    batch = _batch(tok)
    assert torch.equal(_logits(student, batch), _logits(model, batch))


@pytest.mark.slow
def test_student_generates_as_without_cache(teacher):
    """A stale teacher layer_idx breaks the KV cache; with the right one the cache changes nothing."""
    family, model, tok = teacher
    student = shrink(model, [3, 0], [3])
    enc = tok(DOCUMENTS[:2], return_tensors="pt", padding=True)
    with torch.no_grad():
        cached = student.generate(**enc, num_beams=2, max_length=8)
        uncached = student.generate(**enc, num_beams=2, max_length=8, use_cache=False)
    assert cached.shape[0] == 2
    assert torch.equal(cached, uncached)


def test_t5_position_bias_follows_the_first_block(tmp_path):
    model, tok = build_deep("t5")
    student = shrink(model, [3, 0], [2, 0, 1])
    for t_stack, s_stack in ((model.encoder, student.encoder), (model.decoder, student.decoder)):
        t_bias = t_stack.block[0].layer[0].SelfAttention.relative_attention_bias.weight
        first = s_stack.block[0].layer[0].SelfAttention
        assert first.has_relative_attention_bias and torch.equal(first.relative_attention_bias.weight, t_bias)
        for block in s_stack.block[1:]:  # as a fresh T5 would have it: the bias in block 0 only
            assert not block.layer[0].SelfAttention.has_relative_attention_bias
            assert not hasattr(block.layer[0].SelfAttention, "relative_attention_bias")
    # the teacher's block 0 keeps its own bias
    assert model.encoder.block[0].layer[0].SelfAttention.has_relative_attention_bias
    assert student.encoder.config.num_layers == 2 and student.decoder.config.num_layers == 3

    student.save_pretrained(tmp_path)
    reloaded, info = _loader("t5").from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    batch = _batch(tok)
    torch.testing.assert_close(_logits(reloaded.eval(), batch), _logits(student, batch), rtol=0, atol=0)


def test_shrink_encoder_keeps_the_chosen_layers_of_a_classifier():
    from transformers import BertConfig, BertForSequenceClassification, DistilBertConfig, \
        DistilBertForSequenceClassification

    from modelshrink.models.shrink import shrink_encoder

    torch.manual_seed(0)
    teacher = BertForSequenceClassification(BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=4,
                                                       num_attention_heads=2, intermediate_size=32)).eval()
    same = shrink_encoder(teacher, [0, 1, 2, 3]).eval()
    ids = torch.randint(0, 40, (2, 6))
    assert torch.equal(same(ids).logits, teacher(ids).logits)
    student = shrink_encoder(teacher, [1, 3])
    assert student.config.num_hidden_layers == 2 and student.config.modelshrink_layer_map == {"encoder": [1, 3]}
    assert torch.equal(student.bert.encoder.layer[1].output.dense.weight, teacher.bert.encoder.layer[3].output.dense.weight)
    assert torch.equal(student.classifier.weight, teacher.classifier.weight)
    assert teacher.config.num_hidden_layers == 4 and len(teacher.bert.encoder.layer) == 4
    distil = DistilBertForSequenceClassification(DistilBertConfig(vocab_size=40, dim=16, n_layers=3, n_heads=2,
                                                                  hidden_dim=32))
    assert shrink_encoder(distil, [2]).config.num_hidden_layers == 1
    with pytest.raises(UserError, match="--layer-ids: layer 4 is out of range"):
        shrink_encoder(teacher, [4])
