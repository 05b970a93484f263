"""A seq2seq model's LM head, taken out of its forward so that a loss can start from what the head reads.

In every supported family the logits are `head(x) (+ a constant bias)`, with head the model's
`get_output_embeddings()`, a plain nn.Linear, and x what the model's forward hands it:

- BART, mBART, Pegasus, Marian: the decoder's last hidden state; constant bias `final_logits_bias`;
- M2M100 (NLLB): the same, no constant bias;
- T5, mT5: the decoder's output, times d_model**-0.5 where the config scales it (tied embeddings);
- bert2bert (BERT or RoBERTa halves): the decoder's hidden state after the prediction head's transform
  (dense, activation, LayerNorm); the linear has its own bias.

`bypassed` stands an identity in for the head (and a zero for the constant bias) during one forward, so
the model returns x as its `logits`: exact for each family without copying its code (T5's scale, BERT's
transform), and the call still goes through DDP and accelerate's autocast wrapper as the loop prepared them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn

from modelshrink.families import SEQ2SEQ_TYPES  # the model types whose forward is read above


@dataclass(frozen=True)
class Head:
    model: nn.Module
    owner: nn.Module  # the module holding the head as attribute `name`
    name: str
    linear: nn.Linear

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    def bias(self) -> torch.Tensor | None:
        """The linear's bias plus the model's constant one, read now (model.to() replaces buffers)."""
        constant = getattr(self.model, "final_logits_bias", None)
        if constant is None:
            return self.linear.bias
        constant = constant.reshape(-1)
        return constant if self.linear.bias is None else self.linear.bias + constant


def find(model: nn.Module) -> Head | None:
    """The model's LM head, or None where logits = head(x) (+ constant) is not known to hold: a model type
    not read above, or a head that is not a plain nn.Linear or has hooks (a quantized student's, whose
    weight is parametrized and whose input is fake-quantized by a pre-hook)."""
    if getattr(model.config, "model_type", None) not in SEQ2SEQ_TYPES:
        return None
    linear = model.get_output_embeddings()
    if type(linear) is not nn.Linear or linear._forward_hooks or linear._forward_pre_hooks:
        return None
    name = next(n for n, m in model.named_modules() if m is linear)
    owner_name, _, leaf = name.rpartition(".")
    return Head(model, model.get_submodule(owner_name), leaf, linear)


class _Through(torch.autograd.Function):
    """x unchanged, with the head's parameters as inputs: DDP's find_unused_parameters walks the graph from
    the forward's outputs, and an untied head (or BERT's head bias) must be found there, since its gradient
    comes from the loss, after the forward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        ctx.count = len(params)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return (grad,) + (None,) * ctx.count


class _Bypass(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.params = tuple(linear.parameters())  # a tuple, so not registered as this module's own

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Through.apply(x, *self.params)


@contextlib.contextmanager
def bypassed(head: Head | None) -> Iterator[Any]:
    """Inside, the model's forward returns the head's input as `logits`; nothing changes with None."""
    if head is None:
        yield
        return
    constant = getattr(head.model, "final_logits_bias", None)
    setattr(head.owner, head.name, _Bypass(head.linear))
    if constant is not None:  # the forward adds it to the head's output: a zero of no shape leaves x as it is
        head.model.final_logits_bias = constant.new_zeros(())
    try:
        yield
    finally:
        setattr(head.owner, head.name, head.linear)
        if constant is not None:
            head.model.final_logits_bias = constant
