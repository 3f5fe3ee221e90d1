"""trainer/metrics.py: the --log-every window, averaged by samples, kept on the device and
saved with a checkpoint (one part: today's entries)."""
from __future__ import annotations

import pytest
import torch

from amptrain.distributed import build_strategy
from amptrain.trainer.metrics import MetricsWindow

CPU = torch.device("cpu")


def test_logged_means_are_weighted_by_samples_and_the_window_starts_afresh():
    window = MetricsWindow(CPU)
    window.start(0)
    window.add([("loss", torch.tensor(1.0), 3), ("loss", torch.tensor(3.0), 1)], samples=4)
    window.add([("d_loss", torch.tensor(2.0), 4)], samples=4)
    read = window.read(build_strategy("auto", "cpu"), step=2)
    assert read["means"] == {"loss": pytest.approx(1.5), "d_loss": pytest.approx(2.0)}
    assert read["samples_per_s"] > 0 and window.samples == 0 and window.start_step == 2
    assert window.counts == {"loss": 0, "d_loss": 0}


def test_one_part_state_keeps_todays_entries_and_several_round_trip():
    one = MetricsWindow(CPU)
    one.add([("loss", torch.tensor(2.0), 4)], samples=4)
    one.grad_norms["model"] = torch.tensor(0.5)
    state = one.state_dict()
    assert set(state) == {"loss_sum", "loss_samples", "samples_since_log", "grad_norm"}
    assert (float(state["loss_sum"]), state["loss_samples"]) == (8.0, 4)
    several = MetricsWindow(CPU)
    several.add([("d_loss", torch.tensor(1.0), 2), ("g_loss", torch.tensor(3.0), 2)], samples=2)
    several.grad_norms = {"discriminator": torch.tensor(1.0), "generator": None}
    restored = MetricsWindow(CPU)
    restored.load_state_dict(several.state_dict())
    assert {k: float(v) for k, v in restored.sums.items()} == {"d_loss": 2.0, "g_loss": 6.0}
    assert restored.counts == {"d_loss": 2, "g_loss": 2} and restored.samples == 2
    assert restored.grad_norms["generator"] is None
    back = MetricsWindow(CPU)
    back.load_state_dict(state)
    assert float(back.sums["loss"]) == 8.0 and float(back.grad_norms["model"]) == 0.5
