"""Sinusoidal position tables computed in the graph instead of stored in it.

Marian's and Pegasus' position tables are a function of their shape (`create_weight`: row p is sin(p f) then
cos(p f), f_i = 10000^(-2i/d)), so a `quantize` artifact never stores them; traced as they are, each graph would
hold the whole table as a float32 initializer (512 x 256 for the DQ-BART translation teacher: 0.52 MB in the
encoder and again in the decoder, more than a third of what its 2-2-8 export adds to the artifact). Under
`computed_positions` such a module looks its rows up by computing them from the positions (Mul, Sin, Cos, Concat:
a d/2 constant of frequencies), in float32; a table that the formula does not give back to within 1e-4 (an odd
width, a table the model changed) is traced as stored. M2M100's table is no `nn.Embedding` (its positions come
from the ids, with a padding row): it is left as it is.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

TOLERANCE = 1e-4  # float32 arguments up to ~512 rad: about 3e-5 from the float64 table


class _ComputedLookup(nn.Embedding):
    """Mixed in between a sinusoidal table's class and nn.Embedding: its `super().forward(positions)` lands here."""

    def forward(self, positions: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        angles = positions.unsqueeze(-1).to(torch.float32) * self._frequencies
        return torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1).to(self.weight.dtype)


def frequencies(width: int) -> torch.Tensor:
    return torch.pow(10000.0, -2.0 * torch.arange(width // 2, dtype=torch.float64) / width).to(torch.float32)


def computable(module: nn.Module) -> bool:
    """Whether `module` is a sinusoidal nn.Embedding whose table the formula gives back."""
    if not (isinstance(module, nn.Embedding) and callable(getattr(module, "create_weight", None))):
        return False
    rows, width = module.weight.shape
    if width % 2:
        return False
    positions = torch.arange(rows, dtype=torch.float32).unsqueeze(-1) * frequencies(width)
    table = torch.cat([torch.sin(positions), torch.cos(positions)], dim=-1)
    return bool((table - module.weight.detach().float()).abs().max() <= TOLERANCE)


@contextmanager
def computed_positions(model: nn.Module) -> Iterator[int]:
    """Within it, every computable sinusoidal table of `model` computes its rows (yields how many); restored after."""
    changed = []
    for module in model.modules():
        if computable(module):
            cls = type(module)
            module.__class__ = type(f"Computed{cls.__name__}", (cls, _ComputedLookup), {})
            module._frequencies = frequencies(module.weight.shape[1])
            changed.append((module, cls))
    try:
        yield len(changed)
    finally:
        for module, cls in changed:
            module.__class__ = cls
            del module._frequencies
