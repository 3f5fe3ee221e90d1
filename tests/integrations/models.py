"""A tiny classifier with an overflowing layer, and its data, for the callback tests."""
from __future__ import annotations

import torch
from torch import nn

from amptrain.models.range_demos import Scale


class Overflowing(nn.Module):
    """``body`` (Linear, Tanh) -> ``scale`` (x factor) -> ``head``; returns the loss as a
    Hugging Face model does when given labels."""

    def __init__(self, factor: float, features: int = 8, classes: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(features, 16), nn.Tanh())
        self.scale = Scale(factor)
        self.head = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None):
        logits = self.head(self.scale(self.body(x)))
        if labels is None:
            return {"logits": logits}
        return {"loss": nn.functional.cross_entropy(logits.float(), labels), "logits": logits}


def dataset(n: int = 64, features: int = 8, classes: int = 3) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=g)
    return torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 1).long())


class Rows(torch.utils.data.Dataset):
    """The dataset as dicts (what a Hugging Face Trainer feeds its model)."""

    def __init__(self, data: torch.utils.data.TensorDataset) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x, y = self.data[i]
        return {"x": x, "labels": y}
