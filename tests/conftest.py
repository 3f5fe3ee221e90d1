"""Shared fixtures: small real datasets and models, CPU-only, seeded."""
from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from amptrain.data import DataOptions, TensorData, build_data


@pytest.fixture(autouse=True)
def _threads():
    # Two cores on CI: keep intra-op threads from oversubscribing when pytest forks.
    torch.set_num_threads(2)
    yield


@pytest.fixture(autouse=True)
def _fresh_amptrain_logger():
    # cli.main() installs a stderr handler and stops propagation; a test that ran it must
    # not hide later tests' notices from caplog.
    logger = logging.getLogger("amptrain")
    saved = logger.handlers[:], logger.propagate, logger.level, logger.disabled
    yield
    logger.handlers[:], logger.propagate, logger.level, logger.disabled = saved


@pytest.fixture(scope="session")
def digits():
    return build_data("digits", DataOptions())


def tiny_classification(n: int = 200, features: int = 8, classes: int = 3, seed: int = 0
                        ) -> TensorData:
    """A linearly separable-ish problem, small enough for exact comparisons."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, classes, generator=g)
    y = (x @ w).argmax(dim=1)
    return TensorData(x, y)


def tiny_mlp(features: int = 8, classes: int = 3, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential()
    model.add_module("body", nn.Sequential(nn.Linear(features, 16), nn.Tanh()))
    model.add_module("head", nn.Linear(16, classes))
    return model
