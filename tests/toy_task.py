"""The toy task that the training-loop tests share: a small MLP regressing 8 fixed examples."""

from __future__ import annotations

import torch
from torch import nn


def toy_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.Tanh(), nn.Linear(8, 1))


EXAMPLES = [{"x": [float(i), float(i % 3), 1.0, -float(i) / 4], "y": float(i % 2), "length": 1} for i in range(8)]


def collate(batch):
    return {"x": torch.tensor([b["x"] for b in batch]), "y": torch.tensor([b["y"] for b in batch]),
            "tokens": len(batch)}


def loss(model, batch):
    loss = nn.functional.mse_loss(model(batch["x"]).squeeze(-1), batch["y"])
    return loss, {"loss": loss.detach()}
