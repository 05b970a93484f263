"""One small adapter per architecture family, reused by every command.

An adapter knows where a family keeps its encoder and decoder layers and, inside each layer, its
attention modules (encoder self, decoder self, decoder cross) with their query projections. It is
a table of attribute paths, not a class hierarchy: adding a family is adding one row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from modelshrink.errors import UserError

if TYPE_CHECKING:
    from torch import nn

ATTENTION_KINDS = ("encoder_self", "decoder_self", "decoder_cross")


@dataclass(frozen=True)
class AttentionModule:
    kind: str  # one of ATTENTION_KINDS
    layer: int
    name: str  # qualified module name inside the model
    module: nn.Module
    query: nn.Linear
    # T5 adds a learned relative position bias to the attention logits; it lives in the first
    # layer of each stack and is shared by the others (None for every other module).
    position_bias: nn.Embedding | None = None


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    encoder_layers: str  # dotted path from the model; "{decoder}" = the decoder's base model prefix
    decoder_layers: str
    encoder_self: str  # dotted path from a layer to its attention module
    decoder_self: str
    decoder_cross: str
    query: str  # dotted path from an attention module to its query projection
    encoder_layers_config: str  # dotted config attribute holding the number of encoder layers
    decoder_layers_config: str
    position_bias: str | None = None
    # warm start (bert2bert): the decoder layer's new cross-attention block and the pretrained self-attention
    # block it starts as a copy of (attention and output projection, both)
    cross_from_self: tuple[str, str] | None = None

    def _resolve(self, model: nn.Module, path: str) -> nn.Module:
        if "{decoder}" in path:
            path = path.format(decoder=model.decoder.base_model_prefix)
        return model.get_submodule(path)

    def encoder_layers_of(self, model: nn.Module) -> nn.ModuleList:
        return self._resolve(model, self.encoder_layers)

    def decoder_layers_of(self, model: nn.Module) -> nn.ModuleList:
        return self._resolve(model, self.decoder_layers)

    def attention_modules(self, model: nn.Module) -> list[AttentionModule]:
        found = []
        sides = [(self.encoder_layers, [("encoder_self", self.encoder_self)]),
                 (self.decoder_layers, [("decoder_self", self.decoder_self), ("decoder_cross", self.decoder_cross)])]
        for layers_path, kinds in sides:
            for index, layer in enumerate(self._resolve(model, layers_path)):
                for kind, attn_path in kinds:
                    attn = layer.get_submodule(attn_path)
                    bias = None
                    if self.position_bias and getattr(attn, "has_relative_attention_bias", False):
                        bias = attn.get_submodule(self.position_bias)
                    name = f"{layers_path.format(decoder='decoder')}.{index}.{attn_path}"
                    found.append(AttentionModule(kind, index, name, attn, attn.get_submodule(self.query), bias))
        return found


FAMILIES = (
    Family("bart", ("bart", "mbart", "pegasus", "marian", "m2m_100"),  # m2m_100: M2M100 and NLLB
           encoder_layers="model.encoder.layers", decoder_layers="model.decoder.layers",
           encoder_self="self_attn", decoder_self="self_attn", decoder_cross="encoder_attn", query="q_proj",
           encoder_layers_config="encoder_layers", decoder_layers_config="decoder_layers"),
    Family("t5", ("t5", "mt5"),
           encoder_layers="encoder.block", decoder_layers="decoder.block",
           encoder_self="layer.0.SelfAttention", decoder_self="layer.0.SelfAttention",
           decoder_cross="layer.1.EncDecAttention", query="q", position_bias="relative_attention_bias",
           encoder_layers_config="num_layers", decoder_layers_config="num_decoder_layers"),
    Family("bert2bert", ("encoder-decoder",),
           encoder_layers="encoder.encoder.layer", decoder_layers="decoder.{decoder}.encoder.layer",
           encoder_self="attention.self", decoder_self="attention.self",
           decoder_cross="crossattention.self", query="query",
           encoder_layers_config="encoder.num_hidden_layers", decoder_layers_config="decoder.num_hidden_layers",
           cross_from_self=("crossattention", "attention")),
)
# The halves an EncoderDecoderModel may have: models whose layers share BERT's module layout.
ENCODER_DECODER_HALVES = ("bert", "roberta")
# Every seq2seq model type a family adapts (the static search, the LM head's bypass and the export read these)
SEQ2SEQ_TYPES = tuple(t for family in FAMILIES for t in family.model_types)
# The BART family's layers that normalise before each block (BART's and Marian's normalise after it)
PRE_NORM_TYPES = ("mbart", "pegasus", "m2m_100")


def family_types(name: str) -> tuple[str, ...]:
    """The model types of the family called `name` (bart, t5, bert2bert)."""
    return next(family.model_types for family in FAMILIES if family.name == name)


def supported_families() -> str:
    return ("BART/mBART/Pegasus/Marian/M2M100 (NLLB), T5/mT5, EncoderDecoderModel with BERT or RoBERTa halves "
            "(bert2bert)")


def family_of(config) -> Family:
    """The adapter for a model config, or a UserError naming the supported families."""
    model_type = getattr(config, "model_type", None)
    if model_type == ENCODER_DECODER_TYPE:
        halves = (config.encoder.model_type, config.decoder.model_type)
        if any(h not in ENCODER_DECODER_HALVES for h in halves):
            raise UserError(f"EncoderDecoderModel with {halves[0]}/{halves[1]} halves is not supported; "
                            f"supported: {supported_families()}")
        for half in (config.encoder, config.decoder):
            if getattr(half, "position_embedding_type", "absolute") not in (None, "absolute"):
                raise UserError(f"{half.model_type} with position_embedding_type="
                                f"{half.position_embedding_type} is not supported (absolute positions only)")
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    raise UserError(f"model type '{model_type}' is not supported; supported: {supported_families()}")


# ---- config facts shared by training and export
# Sequence classifiers the quantization surgery and the export understand (BERT-like encoders).
CLASSIFIER_TYPES = ("bert", "roberta", "distilbert", "electra", "xlm-roberta")
# Classifiers whose graph takes token_type_ids even where the tokenizer leaves them out.
TOKEN_TYPE_CLASSIFIERS = ("bert",)
# Seq2seq model types that only translate (Marian; M2M100 and NLLB); mBART and the others are told apart by their data
# (source/target pairs).
TRANSLATION_TYPES = ("marian", "m2m_100")


def model_kind(config: Any, with_head: bool = True) -> str | None:
    """What the steps make of a config: 'seq2seq' for an encoder-decoder of a supported family (a UserError naming
    the families for any other encoder-decoder), 'classifier' for a BERT-like encoder of CLASSIFIER_TYPES (with
    `with_head`, only one saved with a sequence-classification head), None for anything else. Each step words
    its own refusal of None."""
    if getattr(config, "is_encoder_decoder", False):
        family_of(config)
        return "seq2seq"
    if config.model_type in CLASSIFIER_TYPES and (not with_head or any(
            a.endswith("ForSequenceClassification") for a in (config.architectures or []))):
        return "classifier"
    return None


def decoder_layer_count(config: Any) -> int:
    """Decoder depth of a seq2seq config (an EncoderDecoder config keeps it in its decoder)."""
    for holder in (config, getattr(config, "decoder", None)):
        for name in ("decoder_layers", "num_decoder_layers", "num_hidden_layers"):
            value = getattr(holder, name, None) if holder is not None else None
            if value:
                return int(value)
    raise UserError(f"cannot tell the decoder depth of a {config.model_type} model")


def _encoder_config(config: Any) -> Any:
    return getattr(config, "encoder", None) or config


def hidden_size(config: Any) -> int:
    """Model width of a seq2seq config (an EncoderDecoder config keeps it in its encoder)."""
    inner = _encoder_config(config)
    return int(getattr(inner, "d_model", None) or getattr(inner, "hidden_size"))


def attention_heads(config: Any) -> int:
    """Attention heads of a seq2seq config's encoder."""
    inner = _encoder_config(config)
    return int(getattr(inner, "encoder_attention_heads", None) or getattr(inner, "num_heads", None)
               or getattr(inner, "num_attention_heads"))


def encoder_layer_count(config: Any) -> int:
    """Depth of an encoder-only model (a classifier); DistilBERT's config maps it to n_layers."""
    return int(config.num_hidden_layers)


# ---- encoder-only models and the quantization surgery
# Where encoder-only models keep their transformer layers, from the base model (BERT, RoBERTa,
# ELECTRA, MiniLM: encoder.layer; DistilBERT: transformer.layer).
ENCODER_ONLY_LAYERS = ("encoder.layer", "transformer.layer", "encoder.layers", "layers")
# Each family's query projection name → its key and value projections (the surgery quantizes the
# outputs of all three, as DQ-BART does).
KEY_VALUE = {"q_proj": ("k_proj", "v_proj"), "q": ("k", "v"), "query": ("key", "value")}
# Module names inside a layer that say what a linear layer belongs to, every family's (quantize's bit groups):
# cross-attention is looked for first (bert2bert's `crossattention`, T5's `EncDecAttention`), then self-attention
# (BERT's `attention` holds its own output projection), then the feed-forward block (BERT's `intermediate` and the
# layer's `output`, T5's `DenseReluDense`, DistilBERT's `ffn`).
CROSS_ATTENTION_NAMES = frozenset({"encoder_attn", "EncDecAttention", "crossattention"})
SELF_ATTENTION_NAMES = frozenset({"self_attn", "SelfAttention", "attention"})
FEED_FORWARD_NAMES = frozenset({"fc1", "fc2", "DenseReluDense", "intermediate", "output", "ffn", "mlp"})
# A classifier's head outside its layers: BERT's pooler and classifier, DistilBERT's pre_classifier, ELECTRA's.
CLASSIFIER_HEAD_NAMES = frozenset({"pooler", "classifier", "pre_classifier"})
# Model type of an EncoderDecoderModel config (its halves keep their own configs).
ENCODER_DECODER_TYPE = "encoder-decoder"


def is_attention_projection(name: str) -> bool:
    """Whether a linear layer's own name is a query, key or value projection of some family."""
    leaf = name.rsplit(".", 1)[-1]
    return leaf in KEY_VALUE or any(leaf in kv for kv in KEY_VALUE.values())


def encoder_layer_list(model: "nn.Module") -> "nn.ModuleList":
    """The transformer layers of an encoder-only model, found as the ModuleList whose length is the
    configured depth."""
    from torch import nn

    depth = encoder_layer_count(model.config)
    base = getattr(model, "base_model", model)
    for path in ENCODER_ONLY_LAYERS:
        try:
            found = base.get_submodule(path)
        except AttributeError:
            continue
        if isinstance(found, nn.ModuleList) and len(found) == depth:
            return found
    raise UserError(f"cannot find the {depth} transformer layers of this {model.config.model_type} model; "
                    "copying layers supports BERT-style encoders (BERT, RoBERTa, ELECTRA, DistilBERT)")
