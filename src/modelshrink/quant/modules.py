"""Quantization surgery (DQ-BART section 2.1): which tensors are quantized, and how.

- Weights of every linear layer: W bits (symmetric linear for 3-8 bits, TWN ternary for 2), per
  tensor or per output row (`granularity`).
- Word embeddings: E bits, per row (one scale per token, as the DQ-BART reference code does). The
  LM head is the output embedding: tied to the word embeddings in BART, T5 v1.0 and bert2bert, so
  it is quantized with the same E bits, per row, and stored once.
- Activations: A bits (8 unless the user opts in to less), symmetric per tensor with a dynamic
  max-abs scale, at the input of every linear layer, at the outputs of the query, key and value
  projections, and on the attention probabilities; with `activation_clip` c, each is clamped to
  [-c, c] first, as the DQ-BART authors' code does (c = 2.5 there).
- Not quantized, as in the paper: positional embeddings (BART's learned positions, T5's relative
  position bias, BERT's position and token-type embeddings) and layer norms.

Weights get a parametrization (`torch.nn.utils.parametrize`): the module keeps its class and its
full-precision latent weight, and every forward pass sees the fake-quantized weight with a
straight-through gradient, which is what distillation-aware quantization trains. Activations get
forward hooks; attention probabilities go through a registered attention function.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from modelshrink.errors import UserError
from modelshrink.families import CLASSIFIER_TYPES, KEY_VALUE, is_attention_projection
from modelshrink.quant.groups import check_rules, quantized_groups
from modelshrink.quant.quantizers import fake_quantize, fake_quantize_activation
from modelshrink.quant.spec import QuantSpec

ATTENTION_IMPLEMENTATION = "modelshrink_quant"


# Inside `weights_once()`: each latent weight's fake-quantized value, by the latent tensor's identity.
_step_weights: dict[tuple[int, int, bool], torch.Tensor] | None = None


class FakeQuant(nn.Module):
    """A parametrization: the weight as the forward pass sees it, quantized, with STE gradients."""

    def __init__(self, bits: int, per_row: bool):
        super().__init__()
        self.bits = bits
        self.per_row = per_row

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        if _step_weights is None:
            return fake_quantize(weight, self.bits, self.per_row)
        key = (id(weight), self.bits, self.per_row)
        if key not in _step_weights:
            _step_weights[key] = fake_quantize(weight, self.bits, self.per_row)
        return _step_weights[key]


@contextmanager
def weights_once() -> Iterator[None]:
    """Around an optimizer step's forward and backward passes: each fake-quantized weight computed once, however
    many micro-batches and however many modules use it (`parametrize.cached` caches per module, so a word
    embedding tied to the LM head, or shared by encoder and decoder, would be quantized once per module)."""
    global _step_weights
    outer, _step_weights = _step_weights, {} if _step_weights is None else _step_weights
    try:
        with parametrize.cached():
            yield
    finally:
        _step_weights = outer


def _looked_up_rows(self: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    """The forward of a per-row fake-quantized word embedding that no other module shares (bert2bert's encoder
    embedding, a classifier's, T5 v1.1's untied table): only the rows `ids` look up are quantized. Rows are
    quantized independently, so the output, and the gradient the latent table receives, are those of quantizing the
    whole table (a test checks them bit for bit) at a fraction of the cost on a CPU, where ternarizing a 30k-row
    table each step is a sizable share of the step. Elsewhere (a GPU, where the whole table takes microseconds and
    `unique` would split a compiled graph; tracing for export; max_norm, which renormalises rows in place) it is the
    plain forward."""
    latent = self.parametrizations.weight.original
    if (latent.device.type != "cpu" or self.max_norm is not None or torch.jit.is_tracing()
            or torch.compiler.is_compiling()):
        return type(self).forward(self, ids)
    quant = self.parametrizations.weight[0]
    rows, inverse = torch.unique(ids, return_inverse=True)
    padding = None
    if self.padding_idx is not None:
        at = (rows == self.padding_idx).nonzero()
        padding = int(at[0, 0]) if len(at) else None
    return nn.functional.embedding(inverse, fake_quantize(latent[rows], quant.bits, quant.per_row), padding,
                                   None, self.norm_type, self.scale_grad_by_freq, self.sparse)


def _quantize_input(bits: int, clip: float | None):
    def hook(module, args):
        return (fake_quantize_activation(args[0], bits, clip),) + tuple(args[1:])

    return hook


def _quantize_output(bits: int, clip: float | None):
    def hook(module, args, output):
        return fake_quantize_activation(output, bits, clip)

    return hook


def quantized_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                        position_bias: torch.Tensor | None = None, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention whose probabilities are fake-quantized to the module's activation bits; returns the output
    (computed with attention dropout in training) and the probabilities before dropout."""
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if position_bias is not None:
        scores = scores + position_bias
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = torch.softmax(scores.float(), dim=-1).type_as(scores)
    probs = fake_quantize_activation(probs, getattr(module, "modelshrink_activation_bits", 8),
                                     getattr(module, "modelshrink_activation_clip", None))
    dropped = nn.functional.dropout(probs, p=dropout, training=module.training)
    out = torch.matmul(dropped, value).transpose(1, 2).contiguous()
    # the maps before dropout: DQ-BART's attention loss compares them to the teacher's (eval-mode) maps, and
    # dropped maps (zeros, the rest scaled by 1/(1-p)) would add noise and a bias to that loss
    return out, probs


def register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(ATTENTION_IMPLEMENTATION, quantized_attention)
    AttentionMaskInterface.register(ATTENTION_IMPLEMENTATION, eager_mask)  # additive float masks, as eager


def check_quantizable(config: Any) -> str:
    """'seq2seq' or 'classifier'; a UserError for a family without a quantization map."""
    from modelshrink.families import model_kind, supported_families

    kind = model_kind(config, with_head=False)  # a bare encoder is refused where it is loaded, naming the head
    if kind is not None:
        return kind
    raise UserError(f"no quantization map for model type '{config.model_type}'; supported: {supported_families()}, "
                    f"and classifiers of type {', '.join(CLASSIFIER_TYPES)}")


def quantize_model(model: nn.Module, spec: QuantSpec, weights: bool = True) -> dict[str, int]:
    """Apply the surgery in place; returns how many modules of each kind were changed.

    Each weight takes its group's bits (`QuantSpec.bits_of`: W for linears, E for word embeddings and the LM
    head, unless a rule says otherwise; position tables only where a rule names them); linears per
    `spec.granularity`, embeddings, position tables and the LM head per row.
    With `weights=False` only activations and attention are quantized: for a model whose stored
    weights are already quantized values (loading an artifact), fake-quantizing them again would
    give the same numbers at a cost."""
    check_quantizable(model.config)
    check_rules(model, spec)
    register_attention()
    head = model.get_output_embeddings()
    counts = {"linear": 0, "embedding": 0, "lm_head": 0, "qkv_outputs": 0, "attention": 0}
    for group, modules in quantized_groups(model, spec).items():
        bits = spec.bits_of(group)
        for name, module in modules:
            is_linear = isinstance(module, nn.Linear)
            per_row = not is_linear or module is head or spec.granularity == "row"
            if weights:
                parametrize.register_parametrization(module, "weight", FakeQuant(bits, per_row))
            counts["lm_head" if module is head else "linear" if is_linear else "embedding"] += 1
            if not is_linear:
                continue
            module.register_forward_pre_hook(_quantize_input(spec.activation_bits, spec.activation_clip))
            if is_attention_projection(name):
                module.register_forward_hook(_quantize_output(spec.activation_bits, spec.activation_clip))
                counts["qkv_outputs"] += 1
    if weights:
        _lookup_unshared_embeddings(model)
    for module in model.modules():
        if any(isinstance(getattr(module, n, None), nn.Linear) for n in KEY_VALUE):
            module.modelshrink_activation_bits = spec.activation_bits
            module.modelshrink_activation_clip = spec.activation_clip
            counts["attention"] += 1
    model.set_attn_implementation(ATTENTION_IMPLEMENTATION)
    if counts["linear"] == 0:
        raise UserError("quantization found no linear layer to quantize in this model")
    return counts


def per_tensor_widths(model: nn.Module) -> tuple[int, ...]:
    """The 3- and 4-bit widths that `model`'s quantized weights took under one scale a tensor, read from the modules
    themselves (so a map whose rules move every layer of a 4-bit base elsewhere has none): the widths where a trained
    BERT's outliers round worse than ternary (benchmarks/weight_rounding.py)."""
    widths = {quantizer.bits for module in model.modules() if parametrize.is_parametrized(module, "weight")
              for quantizer in module.parametrizations.weight
              if isinstance(quantizer, FakeQuant) and not quantizer.per_row}
    return tuple(sorted(widths & {3, 4}))


def _lookup_unshared_embeddings(model: nn.Module) -> None:
    """Give each fake-quantized embedding whose latent table no other module uses the forward that quantizes only
    the rows it looks up (`_looked_up_rows`); a table tied to the LM head, or shared by two modules, is quantized
    whole (once a step, `weights_once`)."""
    users: dict[int, list[nn.Module]] = {}
    for module in model.modules():  # each module once, shared ones too
        if parametrize.is_parametrized(module, "weight"):
            users.setdefault(id(module.parametrizations.weight.original), []).append(module)
    for modules in users.values():
        module = modules[0]
        plain = type(module).forward is nn.Embedding.forward  # not a position table's forward, a scaled table's
        if len(modules) == 1 and isinstance(module, nn.Embedding) and plain and module.parametrizations.weight[0].per_row:
            module.forward = types.MethodType(_looked_up_rows, module)


def latent_weights(model: nn.Module) -> dict[str, tuple[torch.Tensor, int, bool]]:
    """Canonical parameter name → (latent full-precision weight, bits, per_row) of every quantized
    weight, each tensor once (tied weights share one entry)."""
    seen: dict[int, str] = {}
    found = {}
    for name, module in model.named_modules():
        if not parametrize.is_parametrized(module, "weight"):
            continue
        latent = module.parametrizations.weight.original
        quant = module.parametrizations.weight[0]
        if id(latent) in seen:
            continue
        seen[id(latent)] = name
        found[f"{name}.weight" if name else "weight"] = (latent, quant.bits, quant.per_row)
    return found
