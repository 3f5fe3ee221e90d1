"""tasks/frechet.py: the feature network of the GAN's val_fd says before it trains."""
from __future__ import annotations

import logging

import torch

from amptrain.data import TensorData
from amptrain.tasks import frechet


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_training_the_feature_network_is_announced_in_one_line(monkeypatch):
    monkeypatch.setattr(frechet, "FEATURE_STEPS", 2)  # the line, not the training, is tested
    g = torch.Generator().manual_seed(0)
    real = frechet.RealImages(TensorData(torch.rand(40, 1, 8, 8, generator=g),
                                         torch.arange(40) % 4))
    lines = Lines()
    logger = logging.getLogger("amptrain")
    logger.addHandler(lines)
    monkeypatch.setattr(logger, "level", logging.INFO)
    try:
        net, trained = frechet.train_feature_net(real, torch.device("cpu"))
    finally:
        logger.removeHandler(lines)
    assert trained and not net.training
    assert lines.lines == ["val_fd: first training its feature network (a small CNN, 2 steps "
                           "on 40 real training images; once per run)"]
