"""common/clock.py: the one clock amptrain times its steps with, replaceable by a caller."""
from __future__ import annotations

import itertools
import json
import time

import pytest

from amptrain.common import clock
from amptrain.compare.timing import Contender
from amptrain.precision.tf32 import MathSwitches
from amptrain.trainer import Trainer
from tests.conftest import ManualClock, steps_take, tiny_classification, tiny_mlp


def test_the_default_clock_is_perf_counter_and_use_restores_it():
    manual = ManualClock()
    with clock.use(manual):
        manual.advance(2.5)
        assert clock.now() == 2.5
    # Back to the default source, compared as an object: no reading of this machine's time.
    assert clock._clock is time.perf_counter


def test_a_training_logs_its_speed_and_compare_times_its_steps_on_the_injected_clock(
        tmp_path, monkeypatch):
    manual = ManualClock()
    steps_take(monkeypatch, manual, lambda step: 0.25)  # 32 samples in 0.25 s each step
    trainer = Trainer(precision="32-true", device="cpu", no_progress=True, batch_size=32,
                      max_steps=4, log_every=2, out=str(tmp_path / "run"))
    with clock.use(manual):
        trainer.fit(tiny_mlp(), tiny_classification(n=128))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    speeds = [r["samples_per_s"] for r in records if "loss" in r]
    assert speeds == [pytest.approx(128.0)] * 2  # exact: no real time in it
    assert all(r["data_wait_frac"] == 0.0 for r in records if "loss" in r)

    lane = Contender("32-true", trainer, MathSwitches(),
                     itertools.cycle(list(itertools.islice(trainer.train_windows.epoch(0), 1))))
    with clock.use(manual):
        lane.step(timed=True)
    assert lane.step_times_s == [0.25]
