"""Family adapters: layers and attention modules of each supported family; clear refusals."""

from __future__ import annotations

import pytest
from torch import nn

from conftest import FAMILIES, build
from modelshrink.errors import UserError
from modelshrink.families import family_of


@pytest.mark.parametrize("family", FAMILIES)
def test_layers_and_attention_modules(family):
    model, _ = build(family)
    adapter = family_of(model.config)
    assert adapter.name == family
    assert len(adapter.encoder_layers_of(model)) == 2 and len(adapter.decoder_layers_of(model)) == 2
    modules = adapter.attention_modules(model)
    kinds = [(m.kind, m.layer) for m in modules]
    assert kinds == [("encoder_self", 0), ("encoder_self", 1), ("decoder_self", 0), ("decoder_cross", 0),
                     ("decoder_self", 1), ("decoder_cross", 1)]
    assert all(isinstance(m.query, nn.Linear) for m in modules)
    assert len({id(m.query) for m in modules}) == 6
    with_bias = [(m.kind, m.layer) for m in modules if m.position_bias is not None]
    assert with_bias == ([("encoder_self", 0), ("decoder_self", 0)] if family == "t5" else [])


def test_other_bart_like_families_share_the_adapter():
    from transformers import MarianConfig, MBartConfig, PegasusConfig

    for config in (MBartConfig(), PegasusConfig(), MarianConfig()):
        assert family_of(config).name == "bart"


def test_unsupported_architectures_name_the_supported_ones():
    from transformers import BertConfig, EncoderDecoderConfig, GPT2Config, ProphetNetConfig

    with pytest.raises(UserError, match="'prophetnet' is not supported; supported: BART"):
        family_of(ProphetNetConfig())
    mixed = EncoderDecoderConfig.from_encoder_decoder_configs(BertConfig(), GPT2Config(add_cross_attention=True))
    with pytest.raises(UserError, match="bert/gpt2 halves is not supported"):
        family_of(mixed)
