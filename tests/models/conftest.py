"""Helpers shared by the model tests: data shapes and a batch for them (the checks every
built-in model passes are tests/models/test_conformance.py)."""
from __future__ import annotations

import torch

from amptrain.models import ModelInputs

IMAGES = ModelInputs(num_classes=5, input_shape=(3, 16, 16), kind="image")
SEQUENCES = ModelInputs(num_classes=3, input_shape=(12,), kind="sequence", vocab_size=50)
FEATURES = ModelInputs(num_classes=4, input_shape=(10,), kind="features")


def batch_for(inputs: ModelInputs, n: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, inputs.num_classes, (n,), generator=g)
    if inputs.kind == "sequence":
        x = torch.randint(1, inputs.vocab_size, (n, *inputs.input_shape), generator=g)
        x[:, -3:] = 0  # padding at the end, as the loaders write it
        return x, y
    return torch.randn(n, *inputs.input_shape, generator=g), y
