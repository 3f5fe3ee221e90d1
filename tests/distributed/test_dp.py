"""DataParallel: one process, autocast inside every replica's forward."""
from __future__ import annotations

import threading

import torch
from torch import nn

from amptrain.distributed import DataParallelStrategy
from amptrain.precision import Precision
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification


class _AutocastProbe(nn.Module):
    """Records the autocast state its forward runs under."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 3)
        self.seen: list[tuple[bool, torch.dtype]] = []

    def forward(self, x):
        self.seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return self.linear(x)


def test_dp_applies_autocast_inside_the_replica_forward(caplog):
    probe = _AutocastProbe()
    with caplog.at_level("WARNING", logger="amptrain"):
        strategy = DataParallelStrategy(torch.device("cpu"))
    assert "DDP is faster" in caplog.text
    precision = Precision("bf16-mixed", device="cpu")
    strategy.wrap_model(probe, precision)
    wrapped = strategy.wrap(probe)
    assert isinstance(wrapped, nn.DataParallel)
    # DataParallel calls replicas from worker threads, where autocast state is not
    # inherited: run the wrapped module the same way, outside any autocast.
    outputs = []
    thread = threading.Thread(target=lambda: outputs.append(wrapped(torch.randn(4, 8))))
    thread.start()
    thread.join()
    assert probe.seen == [(True, torch.bfloat16)]
    assert outputs[0].dtype == torch.bfloat16
    # Control: an outer autocast does not reach a module called from another thread.
    with precision.autocast():
        thread = threading.Thread(target=lambda: probe(torch.randn(4, 8)))
        thread.start()
        thread.join()
    assert probe.seen[-1][0] is False


def test_dp_strategy_trains_through_the_trainer():
    probe = _AutocastProbe()
    trainer = Trainer(precision="bf16-mixed", device="cpu", strategy=DataParallelStrategy(
        torch.device("cpu")), no_progress=True, batch_size=32, epochs=1, max_steps=3)
    trainer.fit(probe, tiny_classification(n=96))
    assert isinstance(trainer.train_model, nn.DataParallel)
    assert trainer.step == 3 and probe.seen and all(s == (True, torch.bfloat16) for s in probe.seen)
