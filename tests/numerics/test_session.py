"""The telemetry in a Trainer run: numerics.jsonl (its schema, its sampled steps), the
TensorBoard tags, the picture, ``off``, the auto period, and no host read on the steps
that are not sampled."""
from __future__ import annotations

import json

import pytest
from amptrain.common.errors import UserError
from amptrain.numerics.recorder import AUTO_BASELINE, Schedule
from amptrain.numerics.stats import WHATIF
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification, tiny_mlp
from tests.trainer.test_overhead import spied_run

FIELDS = {"step", "module", "tensor", "format", "amax", "flushed", "saturated", "whatif"}


def _fit(tmp_path, numerics, steps=6, precision="bf16-mixed", **options):
    trainer = Trainer(precision=precision, batch_size=16, max_steps=steps, log_every=3,
                      no_progress=True, device="cpu", numerics=numerics, out=tmp_path,
                      **options)
    trainer.fit(tiny_mlp(), tiny_classification())
    return trainer


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_jsonl_tensorboard_and_picture(tmp_path):
    _fit(tmp_path, "2")
    records = [json.loads(line) for line in (tmp_path / "numerics.jsonl").open()]
    assert {r["step"] for r in records} == {2, 4, 6}
    for r in records:
        assert set(r) == FIELDS and r["format"] == "bf16"
        assert set(r["whatif"]) == set(WHATIF)
        assert all(set(v) == {"flushed", "saturated", "snr_db"} for v in r["whatif"].values())
    step2 = {(r["module"], r["tensor"]) for r in records if r["step"] == 2}
    assert step2 == {("body.0", t) for t in ("activation", "weight", "gradient")} \
        | {("head", t) for t in ("activation", "weight", "gradient")} | {("loss", "activation")}
    # the weight's amax is the weight's (as the step-2 forward used it, in bf16)
    head_w = next(r for r in records if r["step"] == 2 and r["module"] == "head"
                  and r["tensor"] == "weight")
    assert 0 < head_w["amax"] < 1

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert "numerics/head/gradient/flushed" in tags and "numerics/loss/activation/amax" in tags
    assert [e.step for e in events.Scalars("numerics/body.0/activation/amax")] == [2, 4, 6]
    assert (tmp_path / "numerics.png").read_bytes()[:4] == b"\x89PNG"


def test_off_records_nothing(tmp_path):
    trainer = _fit(tmp_path, "off", steps=3, precision="32-true")
    assert not (tmp_path / "numerics.jsonl").exists()
    assert not (tmp_path / "numerics.png").exists()
    assert trainer.step_context.watch_loss is None


def test_a_wrong_value_names_the_option():
    with pytest.raises(UserError, match="numerics takes auto, off or a number"):
        Trainer(numerics="sometimes")


def test_steps_between_samples_read_nothing_from_the_device(tmp_path):
    # numerics every 8 steps: steps 3..7 are spied on (step 8, sampled, is not).
    trainer = Trainer(precision="16-mixed", batch_size=16, epochs=100, log_every=1000,
                      no_progress=True, device="cpu", numerics="8", out=tmp_path,
                      optimizer="adamw")
    spy = spied_run(trainer, tiny_mlp(), tiny_classification(), steps=8)
    assert spy.calls == [], "host reads in unsampled steps:\n" + "\n".join(spy.calls)
    assert {json.loads(line)["step"] for line in (tmp_path / "numerics.jsonl").open()} == {8}


def test_the_spy_sees_a_sampled_step(tmp_path):
    # The same run sampling step 4, inside the spied steps: its one read is seen.
    trainer = Trainer(precision="16-mixed", batch_size=16, epochs=100, log_every=1000,
                      no_progress=True, device="cpu", numerics="4", optimizer="adamw")
    spy = spied_run(trainer, tiny_mlp(), tiny_classification(), steps=8)
    assert spy.calls and all("in collect" in call for call in spy.calls)


def test_auto_period_keeps_the_cost_under_two_percent():
    schedule = Schedule(0)
    schedule.timed(1, 3.0, sampled=False)       # step 1 warms up: not counted
    for step in range(2, 2 + AUTO_BASELINE):    # plain steps: 0.1 s
        assert not schedule.is_sampled(step)
        schedule.timed(step, 0.1, sampled=False)
    first = 2 + AUTO_BASELINE
    assert schedule.is_sampled(first)
    schedule.timed(first, 0.5, sampled=True)    # a sampled step: 0.5 s
    # extra 0.4 s per sample <= 1.5 % of 0.1 s per step (the 2 % promise, with a margin)
    assert schedule.period == 267 and schedule.next == first + 267
    schedule.timed(first + 267, 0.12, sampled=True)   # sampling got cheaper: the median
    schedule.timed(first + 534, 0.12, sampled=True)   # of the last 3 is 0.02 s extra
    assert schedule.period == 14 and schedule.next == first + 548
    schedule.timed(first + 548, 0.05, sampled=True)   # "cheaper than plain": noise
    schedule.timed(first + 562, 0.05, sampled=True)
    assert schedule.period == 10  # never below AUTO_MIN_PERIOD


def test_auto_samples_after_timing_plain_steps(tmp_path):
    _fit(tmp_path, "auto", steps=AUTO_BASELINE + 2, precision="32-true")
    steps = {json.loads(line)["step"] for line in (tmp_path / "numerics.jsonl").open()}
    assert steps == {AUTO_BASELINE + 2}


def test_a_run_that_fails_on_a_sampled_step_leaves_no_hook(tmp_path):
    model = tiny_mlp()

    class Boom:
        def on_step_end(self, trainer):
            if trainer.step == 1:   # step 2 is sampled: its hooks are on now
                raise RuntimeError("boom")

    trainer = Trainer(precision="32-true", batch_size=16, max_steps=4, no_progress=True,
                      device="cpu", numerics="2", out=tmp_path, callbacks=[Boom()])
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(model, tiny_classification())
    assert all(not m._forward_hooks for m in model.modules())
