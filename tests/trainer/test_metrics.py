"""trainer/metrics.py: the --log-every interval, averaged by samples, kept on the device and
saved with a checkpoint as its ``log_interval`` section (format 1's ``log_window`` migrated)."""
from __future__ import annotations

import pytest
import torch

from amptrain.distributed import build_strategy
from amptrain.checkpoint import StateRegistry
from amptrain.trainer.metrics import LogInterval

CPU = torch.device("cpu")


def test_logged_means_are_weighted_by_samples_and_the_window_starts_afresh():
    window = LogInterval(CPU)
    window.start(0)
    window.add([("loss", torch.tensor(1.0), 3), ("loss", torch.tensor(3.0), 1)], samples=4)
    window.add([("d_loss", torch.tensor(2.0), 4)], samples=4)
    read = window.read(build_strategy("auto", "cpu"), step=2)
    assert read["means"] == {"loss": pytest.approx(1.5), "d_loss": pytest.approx(2.0)}
    assert read["samples_per_s"] > 0 and window.samples == 0 and window.start_step == 2
    assert window.counts == {"loss": 0, "d_loss": 0}


def test_the_section_round_trips_every_key_and_part():
    several = LogInterval(CPU)
    several.add([("d_loss", torch.tensor(1.0), 2), ("g_loss", torch.tensor(3.0), 2)], samples=2)
    several.grad_norms = {"discriminator": torch.tensor(1.0), "generator": None}
    state = several.state_dict()
    assert set(state) == {"samples_since_log", "sums", "counts", "grad_norms"}
    restored = LogInterval(CPU)
    restored.load_state_dict(state)
    assert {k: float(v) for k, v in restored.sums.items()} == {"d_loss": 2.0, "g_loss": 6.0}
    assert restored.counts == {"d_loss": 2, "g_loss": 2} and restored.samples == 2
    assert restored.grad_norms["generator"] is None
    assert float(restored.grad_norms["discriminator"]) == 1.0


@pytest.mark.parametrize("window, sums, norms", [
    # format 1, one part logging only "loss": its own entries
    ({"loss_sum": torch.tensor(8.0), "loss_samples": 4, "samples_since_log": 4,
      "grad_norm": torch.tensor(0.5), "step_epoch": 0}, {"loss": 8.0}, {"model": 0.5}),
    ({"loss_sum": torch.tensor(8.0), "loss_samples": 4, "samples_since_log": 4,
      "grad_norm": None, "step_epoch": 0}, {"loss": 8.0}, {}),
    # format 1, several keys: today's entries under log_window
    ({"samples_since_log": 4, "sums": {"d_loss": torch.tensor(8.0)}, "counts": {"d_loss": 4},
      "grad_norms": {"discriminator": torch.tensor(0.5)}, "step_epoch": 1},
     {"d_loss": 8.0}, {"discriminator": 0.5}),
    (None, {}, {}),  # no interval saved: it starts empty
], ids=["one-part", "one-part-no-norm", "several", "none"])
def test_a_format_1_log_window_is_migrated(window, sums, norms):
    interval = LogInterval(CPU)
    registry = StateRegistry()
    registry.register(interval)
    registry.load_state_dict({"log_window": window})  # no "sections": layout 0
    assert {k: float(v) for k, v in interval.sums.items()} == sums
    assert interval.samples == (4 if window else 0)
    assert {k: float(v) for k, v in interval.grad_norms.items()} == norms
