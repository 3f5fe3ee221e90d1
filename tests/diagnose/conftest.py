"""Helpers shared by the diagnose tests: a model whose activations are scaled on purpose."""
from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from amptrain.config import TrainConfig
from amptrain.data import DataBundle
from amptrain.models.range_demos import Scale
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification


def scaled_model(factor: float, seed: int = 0) -> nn.Module:
    """Linear + Tanh, then a layer that multiplies activations by ``factor``, then a head."""
    torch.manual_seed(seed)
    return nn.Sequential(OrderedDict(
        body=nn.Sequential(nn.Linear(8, 32), nn.Tanh()),
        amplify=Scale(factor),
        head=nn.Linear(32, 3)))


def bundle(n: int = 256) -> DataBundle:
    return DataBundle(tiny_classification(n=n), None, 3, (8,), "features")


def config(**options) -> TrainConfig:
    base = {"device": "cpu", "batch_size": 32, "no_progress": True, "scheduler": "none"}
    return TrainConfig.from_options(**{**base, **options})


def train_16_mixed(factor: float, steps: int, **options) -> Trainer:
    trainer = Trainer(precision="16-mixed", device="cpu", batch_size=32, max_steps=steps,
                      epochs=steps, log_every=1, no_progress=True, scheduler="none", **options)
    trainer.fit(scaled_model(factor), bundle().train)
    return trainer
