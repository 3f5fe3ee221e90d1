"""snapshot.py: training state put back: all of it around micro-batch probes
(TrainingSnapshot), and what a failed step changed besides gradients (StepStart)."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from amptrain import Precision
from amptrain.trainer.snapshot import StepStart, TrainingSnapshot
from tests.conftest import tiny_classification, tiny_mlp

CPU = torch.device("cpu")


def _step(precision: Precision, model: nn.Module, optimizer, data, inject_inf: bool = False):
    x, y = data.tensors[0][:32], data.tensors[1][:32]
    with precision.autocast():
        loss = F.cross_entropy(model(x), y)
    if inject_inf:
        model.head.weight.register_hook(lambda g: torch.full_like(g, float("inf")))
    precision.backward(loss)
    precision.step(optimizer)


def _optimizer_tensors(optimizer) -> list[torch.Tensor]:
    return [v.clone() for s in optimizer.state.values() for v in s.values()
            if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("name", ["16-mixed", "bf16-master"])
def test_restore_puts_weights_optimizer_scaler_and_rng_back(name):
    data = tiny_classification()
    precision = Precision(name, device="cpu", init_scale=1024.0)
    model = tiny_mlp()
    model, optimizer = precision.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    _step(precision, model, optimizer, data)  # the optimizer has state to get back
    weights = {k: v.clone() for k, v in precision.fp32_state_dict(model).items()}
    half = {k: v.clone() for k, v in model.state_dict().items()}
    moments = _optimizer_tensors(optimizer)
    scale, skipped = precision.loss_scale, precision.skipped_steps
    snapshot = TrainingSnapshot(model, optimizer, precision, CPU)
    with torch.random.fork_rng():
        expected_draw = torch.rand(5)  # the next draw, with the RNG left where it was

    # A probe: two optimizer steps (the second one overflowing), and random draws.
    _step(precision, model, optimizer, data)
    _step(precision, model, optimizer, data, inject_inf=name == "16-mixed")
    torch.rand(100)
    assert not torch.equal(model.head.bias, half["head.bias"])  # the probe changed things
    if name == "16-mixed":
        assert (precision.loss_scale, precision.skipped_steps) == (scale / 2, skipped + 1)

    snapshot.restore()
    assert all(torch.equal(v, precision.fp32_state_dict(model)[k]) for k, v in weights.items())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in half.items())  # model dtype
    assert all(torch.equal(a, b) for a, b in zip(moments, _optimizer_tensors(optimizer)))
    assert precision.loss_scale == scale and precision.skipped_steps == skipped
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.rand(5), expected_draw)


def test_the_snapshot_is_a_copy_not_a_view():
    precision = Precision("32-true", device="cpu")
    model = tiny_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = precision.setup(model, optimizer)
    snapshot = TrainingSnapshot(model, optimizer, precision, CPU)
    before = snapshot.weights["head.weight"].clone()
    with torch.no_grad():
        model.head.weight.add_(1.0)
    assert torch.equal(snapshot.weights["head.weight"], before)
    snapshot.restore()
    assert torch.equal(model.head.weight, before)


class _Noisy(nn.Module):
    """BatchNorm running statistics and dropout: what a failed forward changes."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.5))
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.body(x))


def test_step_start_puts_batchnorm_statistics_and_rng_back():
    model = _Noisy().train()
    x = tiny_classification(n=32).tensors[0]
    start = StepStart(model, CPU)
    start.save()
    first = model(x)  # draws dropout masks, updates the running statistics
    stats = [b.clone() for b in model.buffers()]
    start.restore()
    assert not torch.equal(model.body[1].running_mean, stats[0])  # put back, not kept
    assert all(torch.equal(b, s) for b, s in zip(model.buffers(), start.saved))
    again = model(x)  # a redone step sees exactly what the failed one saw
    assert torch.equal(again, first)
    assert all(torch.equal(b, s) for b, s in zip(model.buffers(), stats))


def test_step_start_saves_again_each_step_and_refuses_restore_before_save():
    model = _Noisy().train()
    start = StepStart(model, CPU)
    with pytest.raises(AssertionError, match="restore\\(\\) before save\\(\\)"):
        start.restore()
    x = tiny_classification(n=32).tensors[0]
    start.save()
    model(x)          # step 1 succeeds
    start.save()      # step 2 starts from here
    mean = model.body[1].running_mean.clone()
    model(x)          # step 2 fails ...
    start.restore()   # ... and goes back to its own start, not step 1's
    assert torch.equal(model.body[1].running_mean, mean)
    StepStart(tiny_mlp(), CPU).save()  # a model without buffers: RNG only
