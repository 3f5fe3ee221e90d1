"""Users' own Datasets that misbehave after their first sample (``--data
module:tests.data.hostile_datasets.NAME``): issue 36's class 2, for the CLI's hostile table
and tests/data/test_module.py. Each factory returns ``(train, val)`` as a user's would."""
from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset


class Blobs(Dataset):
    """64 samples of 8 features, two classes; ``broken`` says what goes wrong at ``at``."""

    classes = ["left", "right"]

    def __init__(self, broken: str = "", at: int = 40, length: int = 64) -> None:
        generator = torch.Generator().manual_seed(0)
        self.y = torch.arange(64) % 2
        self.x = torch.randn(64, 8, generator=generator) + 2.0 * self.y[:, None]
        self.broken, self.at, self.length = broken, at, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int):
        x, y = self.x[i % 64], int(self.y[i % 64])
        if i != self.at:
            return x, y
        if self.broken == "raises":
            raise KeyError(f"row {i} is missing from the user's table")
        if self.broken == "label":
            return x, -1
        if self.broken == "label-too-large":
            return x, 7
        if self.broken == "shape":
            return x[:5], y
        if self.broken == "nan":
            return torch.full_like(x, math.nan), y
        if self.broken == "inf":
            return torch.full_like(x, math.inf), y
        if self.broken == "not-a-pair":
            return x
        if self.broken == "float-label":
            return x, 0.5
        if self.broken == "text":
            return "a string", y
        return x, y


def raises_at_40():
    return Blobs("raises"), None


def label_minus_one():
    return Blobs("label"), None


def label_too_large():
    return Blobs("label-too-large"), None


def shape_changes():
    return Blobs("shape"), None


def nan_input():
    return Blobs("nan"), None


def inf_input():
    return Blobs("inf"), None


def not_a_pair():
    return Blobs("not-a-pair"), None


def float_label_later():
    return Blobs("float-label"), None


def text_input_later():
    return Blobs("text"), None


def val_label_minus_one():
    return Blobs(), Blobs("label", at=3, length=16)


def huge_length():
    return Blobs(length=10**12), None


def len_raises():
    class NoLength(Blobs):
        def __len__(self) -> int:
            raise RuntimeError("the index file is gone")

    return NoLength(), None


def val_huge_length():
    return Blobs(), Blobs(length=10**12)
