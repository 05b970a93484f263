"""A seq2seq decoder run one token at a time over caches allocated once: what the static search replays.

transformers' decoders grow their caches by concatenation and reorder them by reassignment, so no step
has a fixed shape and none can be captured in a CUDA graph. Here the self-attention keys and values of
every layer live in one preallocated tensor each ([rows, heads, max_length, head_dim]) written in place
at the step's position (a device tensor, not a Python int), and the cross-attention keys and values are
computed once per document, not per beam: a document's beams are folded into the query axis
([documents, heads, beams, head_dim] against [documents, heads, source, head_dim]).

The step reads the model's own modules and weights (no copy): PLATE's fixed λ, folded into the query
weights for the duration of a run, is seen as it is; a per-document λ is a row scale the caller passes
as a device tensor (the forward hooks that apply it in transformers' path are not called here).

Three layouts are written here: BART-style layers (BART, mBART, Pegasus, Marian and M2M100/NLLB, which differ
in where the layer norms sit and how positions and embeddings are scaled; those differences are read off
the model — `positions_of` runs the model's own position module once — not tabled by hand), T5's (T5
v1.0 and v1.1, mT5: RMS norms before each block, unscaled attention with a relative position bias that the
first layer computes and every layer adds, a plain or gated feed-forward), and BERT's as the decoder of an
EncoderDecoderModel (bert2bert, and RoBERTa halves: embeddings summed with a token type and normalised, layer
norms after each block, a transform before the tied LM head).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from modelshrink.families import (ENCODER_DECODER_HALVES, ENCODER_DECODER_TYPE, PRE_NORM_TYPES, SEQ2SEQ_TYPES,
                                  family_types)

T5_TYPES = family_types("t5")  # the family table's (modelshrink.families), read by each layout below


def unsupported(model: Any) -> str | None:
    """Why this model's decoder cannot run here (None: it can)."""
    model_type = model.config.model_type
    if model_type not in SEQ2SEQ_TYPES:
        return (f"{model_type} models are not written for it (BART, mBART, Pegasus, Marian, M2M100, T5, mT5 and "
                "bert2bert are)")
    decoder = model.get_decoder()
    if model_type == ENCODER_DECODER_TYPE:
        half = decoder.config.model_type
        if half not in ENCODER_DECODER_HALVES:
            return f"an EncoderDecoderModel with a {half} decoder is not written for it (BERT and RoBERTa are)"
        if getattr(decoder.config, "position_embedding_type", "absolute") != "absolute":
            return "its decoder's relative position embeddings are not written for it"
    layers = decoder.block if model_type in T5_TYPES else \
        _bert_body(decoder).encoder.layer if model_type == ENCODER_DECODER_TYPE else decoder.layers
    linears = [m for layer in layers for m in layer.modules() if isinstance(m, nn.Linear)]
    if any(type(m) is not nn.Linear or parametrized(m) for m in linears):
        return "its linear layers are quantized or replaced"
    return None


def decoder_for(model: Any, max_length: int, pad_token: int) -> "BartDecoder | T5Decoder | BertDecoder":
    if model.config.model_type in T5_TYPES:
        return T5Decoder(model, max_length)
    if model.config.model_type == ENCODER_DECODER_TYPE:
        return BertDecoder(model, max_length, pad_token)
    return BartDecoder(model, max_length, pad_token)


def _bert_body(decoder: nn.Module) -> nn.Module:
    """The BertModel (RobertaModel) inside a BertLMHeadModel (RobertaForCausalLM)."""
    return getattr(decoder, decoder.base_model_prefix)


def parametrized(module: nn.Module) -> bool:
    return bool(getattr(module, "parametrizations", None))


def positions_of(decoder: nn.Module, length: int, token: int, device: Any) -> torch.Tensor:
    """The decoder's position embeddings for positions 0..length-1 ([length, d_model]), as its own position
    module computes them during generation (learned with an offset, sinusoidal, or counted from the first
    non-padding token), taken from one forward pass of the decoder over `length` copies of `token`."""
    seen: dict[str, torch.Tensor] = {}

    def keep(module, args, output):
        seen["positions"] = output

    handle = decoder.embed_positions.register_forward_hook(keep)
    try:
        ids = torch.full((1, length), token, dtype=torch.long, device=device)
        d_model = decoder.embed_tokens.weight.shape[1]
        memory = torch.zeros(1, 1, d_model, dtype=decoder.embed_tokens.weight.dtype, device=device)
        with torch.inference_mode():
            decoder(input_ids=ids, encoder_hidden_states=memory, use_cache=False)
    finally:
        handle.remove()
    return seen["positions"].reshape(length, -1).clone()


class Caches:
    """The buffers of one shape (documents × beams rows) and the cache reorder both layouts share; a subclass
    sets layers, heads, head_dim, max_length, embed and dtype."""

    layers: list
    heads: int
    head_dim: int
    max_length: int
    embed: nn.Module
    dtype: torch.dtype

    def allocate(self, rows: int, documents: int, source: int, device: Any = None) -> dict[str, torch.Tensor]:
        """Self-attention caches for `rows`, cross-attention keys/values and mask for `documents` of `source`
        tokens (on the model's device; `device="meta"` sizes them without memory: `buffer_bytes`)."""
        device, dtype = device or self.embed.weight.device, self.dtype
        self_shape = (len(self.layers), rows, self.heads, self.max_length, self.head_dim)
        cross_shape = (len(self.layers), documents, self.heads, source, self.head_dim)
        return {
            "self_k": torch.zeros(self_shape, device=device, dtype=dtype),
            "self_v": torch.zeros(self_shape, device=device, dtype=dtype),
            "cross_k": torch.zeros(cross_shape, device=device, dtype=dtype),
            "cross_v": torch.zeros(cross_shape, device=device, dtype=dtype),
            "source_mask": torch.zeros(documents, 1, 1, source, device=device, dtype=torch.bool),
        }

    def buffer_bytes(self, rows: int, documents: int, source: int) -> int:
        """The bytes `allocate` takes for these sizes, computed before allocating."""
        return sum(t.numel() * t.element_size() for t in self.allocate(rows, documents, source, "meta").values())

    def _fill_source(self, buffers: dict[str, torch.Tensor], memory: torch.Tensor, mask: torch.Tensor,
                     projections: list[tuple[nn.Linear, nn.Linear]]) -> None:
        """Every layer's cross-attention keys and values from the encoder's output [documents, source, d_model]
        (`projections`: each layer's key and value projections), the source mask, and empty self-attention caches."""
        documents, source = memory.shape[:2]
        for i, pair in enumerate(projections):
            for name, projection in zip(("cross_k", "cross_v"), pair):
                value = F.linear(memory, projection.weight, projection.bias)
                buffers[name][i].copy_(value.view(documents, source, self.heads, self.head_dim).transpose(1, 2))
        buffers["source_mask"].copy_(mask.bool()[:, None, None, :])
        buffers["self_k"].zero_()
        buffers["self_v"].zero_()

    def caches(self, buffers: dict[str, torch.Tensor], i: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's self-attention keys and values, their first `length` positions (views: a write reaches the
        cache)."""
        return buffers["self_k"][i][:, :, :length], buffers["self_v"][i][:, :, :length]

    def reorder(self, buffers: dict[str, torch.Tensor], rows: torch.Tensor, written: int | None = None) -> None:
        """The self-attention caches follow their beams: row r takes row `rows[r]`'s keys and values. `written`:
        only the first `written` positions move (what the step read: those written, or its length bucket), so the
        traffic follows the summary's length, not max_length; None moves the whole cache."""
        for name in ("self_k", "self_v"):
            cache = buffers[name] if written is None else buffers[name][:, :, :, :written]
            cache.copy_(cache.index_select(1, rows))

    def _read_source(self, query_proj: nn.Linear, out_proj: nn.Linear, x: torch.Tensor,
                     buffers: dict[str, torch.Tensor], i: int, documents: int, beams: int, scale: torch.Tensor | None,
                     scaling: float) -> torch.Tensor:
        """Cross attention of layer i: each document's beams, folded into the query axis, read its source's keys and
        values (computed once per document)."""
        rows = x.shape[0]
        query = self._query(_linear(query_proj, x), scale).view(documents, beams, self.heads, self.head_dim)
        out = F.scaled_dot_product_attention(query.transpose(1, 2), buffers["cross_k"][i], buffers["cross_v"][i],
                                             attn_mask=buffers["source_mask"], scale=scaling)
        return _linear(out_proj, out.transpose(1, 2).reshape(rows, 1, -1))

    def _query(self, query: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
        if scale is not None:  # as plate's row hook: scaled in float32, then cast
            wide = torch.promote_types(query.dtype, torch.float32)
            query = (query.to(wide) * scale.view(-1, 1, 1).to(wide)).to(query.dtype)
        return query


class BartDecoder(Caches):
    """One step of a BART-style decoder over the caches it holds for a shape (documents × beams rows)."""

    def __init__(self, model: Any, max_length: int, pad_token: int):
        self.model = model
        decoder = model.get_decoder()
        self.layers = list(decoder.layers)
        self.pre_norm = model.config.model_type in PRE_NORM_TYPES
        self.embed = decoder.embed_tokens
        # Pegasus and Marian scale the embeddings in the decoder's forward, the others inside the embedding module
        self.embed_scale = float(getattr(decoder, "embed_scale", 1.0) or 1.0) \
            if not hasattr(decoder.embed_tokens, "embed_scale") else 1.0
        self.norm_embedding = getattr(decoder, "layernorm_embedding", None)
        self.norm_final = getattr(decoder, "layer_norm", None)
        self.head = model.get_output_embeddings()
        self.logits_bias = getattr(model, "final_logits_bias", None)
        attention = self.layers[0].self_attn
        self.heads, self.head_dim, self.scaling = attention.num_heads, attention.head_dim, attention.scaling
        device = self.embed.weight.device
        # any token but padding: M2M100 counts positions from the first non-padding token
        token = 0 if pad_token != 0 else 1
        self.positions = positions_of(decoder, max_length, token, device)
        self.max_length = max_length
        self.dtype = self.embed.weight.dtype

    def start(self, buffers: dict[str, torch.Tensor], memory: torch.Tensor, mask: torch.Tensor) -> None:
        """Fill the cross-attention keys and values from the encoder's output [documents, source, d_model]."""
        self._fill_source(buffers, memory, mask, [(layer.encoder_attn.k_proj, layer.encoder_attn.v_proj)
                                                  for layer in self.layers])

    def step(self, buffers: dict[str, torch.Tensor], tokens: torch.Tensor, position: torch.Tensor,
             self_scale: torch.Tensor | None = None, cross_scale: torch.Tensor | None = None,
             length: int | None = None) -> torch.Tensor:
        """Logits [rows, vocab] of the next token after `tokens` [rows] at `position` (a 1-element device tensor);
        writes the step's keys and values into the caches. `*_scale`: per-row query scales (per-document λ).
        `length`: the cache positions the step reads (more than `position`; all of them by default): the written
        ones, or a bucket above them, so that attention costs what was written, not the longest summary."""
        rows = tokens.shape[0]
        documents = buffers["cross_k"].shape[1]
        beams = rows // documents
        hidden = self.embed(tokens)[:, None, :]
        if self.embed_scale != 1.0:
            hidden = hidden * self.embed_scale
        hidden = hidden + self.positions.index_select(0, position)[None]
        if self.norm_embedding is not None:
            hidden = self.norm_embedding(hidden)
        length = length or self.max_length
        filled = (torch.arange(length, device=tokens.device) <= position)[None, None, None, :]
        for i, layer in enumerate(self.layers):
            hidden = self._block(layer.self_attn_layer_norm, hidden,
                                 lambda x: self._self_attention(layer.self_attn, x, buffers, i, position, filled,
                                                                self_scale, length))
            hidden = self._block(layer.encoder_attn_layer_norm, hidden,
                                 lambda x: self._cross_attention(layer.encoder_attn, x, buffers, i, documents, beams,
                                                                 cross_scale))
            hidden = self._block(layer.final_layer_norm, hidden,
                                 lambda x: _linear(layer.fc2, layer.activation_fn(_linear(layer.fc1, x))))
        if self.norm_final is not None:
            hidden = self.norm_final(hidden)
        logits = F.linear(hidden[:, 0], self.head.weight, getattr(self.head, "bias", None))
        if self.logits_bias is not None:
            logits = logits + self.logits_bias
        return logits

    def _block(self, norm: nn.Module, hidden: torch.Tensor, inner: Any) -> torch.Tensor:
        if self.pre_norm:
            return hidden + inner(norm(hidden))
        return norm(hidden + inner(hidden))

    def _self_attention(self, attention: nn.Module, x: torch.Tensor, buffers: dict[str, torch.Tensor], i: int,
                        position: torch.Tensor, filled: torch.Tensor, scale: torch.Tensor | None,
                        length: int) -> torch.Tensor:
        rows = x.shape[0]
        split = (rows, 1, self.heads, self.head_dim)
        query = self._query(_linear(attention.q_proj, x), scale).view(split).transpose(1, 2)
        key = _linear(attention.k_proj, x).view(split).transpose(1, 2)
        value = _linear(attention.v_proj, x).view(split).transpose(1, 2)
        keys, values = self.caches(buffers, i, length)
        keys.index_copy_(2, position, key)
        values.index_copy_(2, position, value)
        out = F.scaled_dot_product_attention(query, keys, values, attn_mask=filled, scale=self.scaling)
        return _linear(attention.out_proj, out.transpose(1, 2).reshape(rows, 1, -1))

    def _cross_attention(self, attention: nn.Module, x: torch.Tensor, buffers: dict[str, torch.Tensor], i: int,
                         documents: int, beams: int, scale: torch.Tensor | None) -> torch.Tensor:
        return self._read_source(attention.q_proj, attention.out_proj, x, buffers, i, documents, beams, scale,
                                 self.scaling)

class T5Decoder(Caches):
    """One step of a T5 decoder over the caches it holds for a shape (the same interface as BartDecoder)."""

    def __init__(self, model: Any, max_length: int):
        self.model = model
        decoder = model.get_decoder()
        self.blocks = list(decoder.block)
        self.embed = decoder.embed_tokens
        self.norm_final = decoder.final_layer_norm
        self.head = model.get_output_embeddings()
        config = model.config
        scaled = getattr(config, "scale_decoder_outputs", None)
        self.output_scale = config.d_model ** -0.5 if (config.tie_word_embeddings if scaled is None else scaled) \
            else None
        attention = self.blocks[0].layer[0].SelfAttention
        self.relative = attention  # computes the relative position bias, from live weights (PLATE folds λ into it)
        self.heads, self.head_dim = attention.n_heads, attention.key_value_proj_dim
        self.max_length = max_length
        self.dtype = self.embed.weight.dtype
        self.layers = self.blocks  # the caches' depth

    def allocate(self, rows: int, documents: int, source: int, device: Any = None) -> dict[str, torch.Tensor]:
        buffers = super().allocate(rows, documents, source, device)
        buffers["bias"] = torch.zeros(1, self.heads, self.max_length, self.max_length,
                                      device=device or self.embed.weight.device,
                                      dtype=self.dtype)
        return buffers

    def start(self, buffers: dict[str, torch.Tensor], memory: torch.Tensor, mask: torch.Tensor) -> None:
        self._fill_source(buffers, memory, mask, [(block.layer[1].EncDecAttention.k, block.layer[1].EncDecAttention.v)
                                                  for block in self.blocks])
        # the class's compute_bias: under a per-document λ plate patches the instance's to scale rows; here the
        # step scales them (fixed λ is folded into the bias weights, which this reads)
        bias = type(self.relative).compute_bias(self.relative, self.max_length, self.max_length)
        buffers["bias"].copy_(bias)

    def step(self, buffers: dict[str, torch.Tensor], tokens: torch.Tensor, position: torch.Tensor,
             self_scale: torch.Tensor | None = None, cross_scale: torch.Tensor | None = None,
             length: int | None = None) -> torch.Tensor:
        rows = tokens.shape[0]
        documents = buffers["cross_k"].shape[1]
        beams = rows // documents
        hidden = self.embed(tokens)[:, None, :]
        length = length or self.max_length
        filled = (torch.arange(length, device=tokens.device) <= position)[None, None, None, :]
        bias = buffers["bias"].index_select(2, position)[..., :length]  # [1, heads, 1, length]
        if self_scale is not None:  # per-document λ scales the bias with the query (plate's row-scaled bias)
            bias = (bias.float() * self_scale.view(-1, 1, 1, 1)).to(bias.dtype)
        bias = bias.masked_fill(~filled, torch.finfo(bias.dtype).min)
        for i, block in enumerate(self.blocks):
            self_attention, cross_attention, feed_forward = block.layer[0], block.layer[1], block.layer[2]
            hidden = self._clamp(hidden + self._self_attention(self_attention.SelfAttention,
                                                               self_attention.layer_norm(hidden), buffers, i, position,
                                                               bias, self_scale, length))
            hidden = self._clamp(hidden + self._cross_attention(cross_attention.EncDecAttention,
                                                                cross_attention.layer_norm(hidden), buffers, i,
                                                                documents, beams, cross_scale))
            hidden = self._clamp(hidden + self._feed_forward(feed_forward.DenseReluDense,
                                                             feed_forward.layer_norm(hidden)))
        hidden = self.norm_final(hidden)
        if self.output_scale is not None:
            hidden = hidden * self.output_scale
        return F.linear(hidden[:, 0], self.head.weight, getattr(self.head, "bias", None))

    def _clamp(self, hidden: torch.Tensor) -> torch.Tensor:
        """T5's guard against fp16 overflow, as its blocks apply it (a device-side choice, no host branch)."""
        if hidden.dtype != torch.float16:
            return hidden
        top = torch.finfo(hidden.dtype).max
        limit = torch.where(torch.isinf(hidden).any(), top - 1000, top)
        return torch.clamp(hidden, min=-limit, max=limit)

    def _self_attention(self, attention: nn.Module, x: torch.Tensor, buffers: dict[str, torch.Tensor], i: int,
                        position: torch.Tensor, bias: torch.Tensor, scale: torch.Tensor | None,
                        length: int) -> torch.Tensor:
        rows = x.shape[0]
        split = (rows, 1, self.heads, self.head_dim)
        query = self._query(_linear(attention.q, x), scale).view(split).transpose(1, 2)
        keys, values = self.caches(buffers, i, length)
        keys.index_copy_(2, position, _linear(attention.k, x).view(split).transpose(1, 2))
        values.index_copy_(2, position, _linear(attention.v, x).view(split).transpose(1, 2))
        out = F.scaled_dot_product_attention(query, keys, values, attn_mask=bias.to(query.dtype), scale=1.0)
        return _linear(attention.o, out.transpose(1, 2).reshape(rows, 1, -1))

    def _cross_attention(self, attention: nn.Module, x: torch.Tensor, buffers: dict[str, torch.Tensor], i: int,
                         documents: int, beams: int, scale: torch.Tensor | None) -> torch.Tensor:
        return self._read_source(attention.q, attention.o, x, buffers, i, documents, beams, scale, 1.0)

    def _feed_forward(self, ff: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if hasattr(ff, "wi_0"):
            x = ff.act(_linear(ff.wi_0, x)) * _linear(ff.wi_1, x)
        else:
            x = ff.act(_linear(ff.wi, x))
        return _linear(ff.wo, x.to(ff.wo.weight.dtype))


class BertDecoder(Caches):
    """One step of a BERT-layout decoder (an EncoderDecoderModel's, with cross attention) over the caches it holds
    for a shape (the same interface as BartDecoder)."""

    def __init__(self, model: Any, max_length: int, pad_token: int):
        self.model = model
        decoder = model.get_decoder()
        body = _bert_body(decoder)
        self.layers = list(body.encoder.layer)
        embeddings = body.embeddings
        self.embed, self.norm_embedding = embeddings.word_embeddings, embeddings.LayerNorm
        # the positions and token type 0 the embeddings add to a token at each step, as its own forward adds them;
        # RoBERTa's count from its padding index, which a padding token itself gets as its position
        padding = getattr(embeddings, "padding_idx", None) if decoder.config.model_type == "roberta" else None
        token = next(t for t in range(3) if t not in (pad_token, padding))  # read off a token that is not padding
        self.positions = self._positions(embeddings, max_length, token)
        self.pad_token = padding
        self.pad_position = None if padding is None else \
            (embeddings.position_embeddings.weight[padding] + embeddings.token_type_embeddings.weight[0]).detach()
        # the transform (dense, activation, layer norm) before the tied head: BERT's module, RoBERTa's inline
        head = decoder.cls.predictions.transform if hasattr(decoder, "cls") else decoder.lm_head
        self.transform = head if hasattr(decoder, "cls") else \
            (lambda x: head.layer_norm(F.gelu(_linear(head.dense, x))))
        self.head = model.get_output_embeddings()
        # EncoderDecoderModel projects the encoder's states where the halves' widths differ
        self.project = getattr(model, "enc_to_dec_proj", None)
        attention = self.layers[0].attention.self
        self.heads, self.head_dim = attention.num_attention_heads, attention.attention_head_size
        self.scaling = self.head_dim ** -0.5
        self.max_length = max_length
        self.dtype = self.embed.weight.dtype

    @staticmethod
    def _positions(embeddings: nn.Module, length: int, token: int) -> torch.Tensor:
        """Position plus token-type embeddings [length, hidden] of steps 0..length-1: the embeddings' forward over
        `length` copies of `token` (not padding), less the word embeddings, before its layer norm."""
        seen: dict[str, torch.Tensor] = {}
        handle = embeddings.LayerNorm.register_forward_pre_hook(lambda module, args: seen.update(summed=args[0]))
        try:
            ids = torch.full((1, length), token, dtype=torch.long, device=embeddings.word_embeddings.weight.device)
            with torch.inference_mode():
                embeddings(input_ids=ids)
        finally:
            handle.remove()
        return (seen["summed"] - embeddings.word_embeddings(ids)).reshape(length, -1).clone()

    def start(self, buffers: dict[str, torch.Tensor], memory: torch.Tensor, mask: torch.Tensor) -> None:
        if self.project is not None:
            memory = self.project(memory)
        self._fill_source(buffers, memory, mask, [(layer.crossattention.self.key, layer.crossattention.self.value)
                                                  for layer in self.layers])

    def step(self, buffers: dict[str, torch.Tensor], tokens: torch.Tensor, position: torch.Tensor,
             self_scale: torch.Tensor | None = None, cross_scale: torch.Tensor | None = None,
             length: int | None = None) -> torch.Tensor:
        rows = tokens.shape[0]
        documents = buffers["cross_k"].shape[1]
        beams = rows // documents
        positions = self.positions.index_select(0, position)[None]
        if self.pad_position is not None:
            positions = torch.where((tokens == self.pad_token)[:, None, None], self.pad_position, positions)
        hidden = self.norm_embedding(self.embed(tokens)[:, None, :] + positions)
        length = length or self.max_length
        filled = (torch.arange(length, device=tokens.device) <= position)[None, None, None, :]
        split = (rows, 1, self.heads, self.head_dim)
        for i, layer in enumerate(self.layers):
            attention, out = layer.attention.self, layer.attention.output
            query = self._query(_linear(attention.query, hidden), self_scale).view(split).transpose(1, 2)
            keys, values = self.caches(buffers, i, length)
            keys.index_copy_(2, position, _linear(attention.key, hidden).view(split).transpose(1, 2))
            values.index_copy_(2, position, _linear(attention.value, hidden).view(split).transpose(1, 2))
            read = F.scaled_dot_product_attention(query, keys, values, attn_mask=filled, scale=self.scaling)
            hidden = out.LayerNorm(_linear(out.dense, read.transpose(1, 2).reshape(rows, 1, -1)) + hidden)
            cross, out = layer.crossattention.self, layer.crossattention.output
            read = self._read_source(cross.query, out.dense, hidden, buffers, i, documents, beams, cross_scale,
                                     self.scaling)
            hidden = out.LayerNorm(read + hidden)
            inner = layer.intermediate.intermediate_act_fn(_linear(layer.intermediate.dense, hidden))
            hidden = layer.output.LayerNorm(_linear(layer.output.dense, inner) + hidden)
        return F.linear(self.transform(hidden[:, 0]), self.head.weight, self.head.bias)


def _linear(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, module.weight, module.bias)
