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


@pytest.mark.slow
def test_a_new_family_is_one_row(monkeypatch, tmp_path):
    """PLBart keeps BART's module layout but is not in the table: refused, then with one row added it shrinks,
    trains, quantizes (distillation-aware: the attention modules through the adapter) and exports, the
    export's generated tokens equal to PyTorch's. Nothing else in the package knows a family."""
    import dataclasses

    import torch
    from transformers import PLBartConfig, PLBartForConditionalGeneration

    from conftest import DOCUMENTS, SUMMARIES, bart_tokenizer, write_jsonl
    from modelshrink import families
    from modelshrink.steps.distill import DistillOptions, distill
    from modelshrink.steps.export import ExportOptions, export_model
    from modelshrink.steps.quantize import QuantizeOptions, quantize

    tok = bart_tokenizer()
    torch.manual_seed(0)
    config = PLBartConfig(vocab_size=len(tok), d_model=32, encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                          decoder_ffn_dim=64, max_position_embeddings=80, bos_token_id=tok.bos_token_id,
                          eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                          decoder_start_token_id=tok.eos_token_id, forced_eos_token_id=None)
    teacher = PLBartForConditionalGeneration(config)
    teacher.generation_config.num_beams, teacher.generation_config.max_length = 2, 10
    teacher.save_pretrained(tmp_path / "teacher")
    tok.save_pretrained(tmp_path / "teacher")
    data = write_jsonl(tmp_path / "pairs.jsonl", [{"document": d, "summary": s} for d, s in zip(DOCUMENTS, SUMMARIES)])
    student = DistillOptions(data=str(data), teacher=str(tmp_path / "teacher"), decoder_layers=1, max_steps=2,
                             batch_size=2, device="cpu")
    with pytest.raises(UserError, match="'plbart' is not supported"):
        distill(student, tmp_path / "refused")

    row = dataclasses.replace(next(f for f in families.FAMILIES if f.name == "bart"), name="plbart",
                              model_types=("plbart",))
    monkeypatch.setattr(families, "FAMILIES", (*families.FAMILIES, row))
    distill(student, tmp_path / "student")
    assert PLBartConfig.from_pretrained(tmp_path / "student").decoder_layers == 1
    quantize(QuantizeOptions(model=str(tmp_path / "student"), bits="8-8-8", method="distill", data=str(data),
                             max_steps=1, batch_size=2, kd_attention=1.0, device="cpu"), tmp_path / "q")
    _, report = export_model(ExportOptions(model=str(tmp_path / "q"), data=str(data), samples=2, generation_docs=2),
                             tmp_path / "onnx")
    assert report["validation"]["generation"]["equal"], report["validation"]["generation"]
