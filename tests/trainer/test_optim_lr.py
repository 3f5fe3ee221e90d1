"""Learning rate for the batch size trained, and its warm-up (amptrain/lrscale.py):

    lr = lr0 * B / B0 (linear) or lr0 * sqrt(B / B0) (sqrt)
    auto warm-up = min(5 epochs, ceil(10% of the run))   only when the lr is scaled up
    warm-up = max(--warmup-steps, auto warm-up), never longer than the run

The Trainer's use of the plan (the lr of each step) is tested end to end in
tests/test_autobatch.py.
"""
from __future__ import annotations

import math

import pytest

from amptrain.config import TrainConfig
from amptrain.common.errors import cli_spelling
from amptrain.trainer.optim import (AUTO_WARMUP_FRACTION, GOYAL_WARMUP_EPOCHS, LrSchedule,
                                    auto_warmup_steps, plan_lr)


def _config(**options) -> TrainConfig:
    return TrainConfig.from_options(**{"lr": 0.1, "batch_size": 256, "base_batch_size": 64,
                                       **options})


# ------------------------------------------------------------- auto_warmup_steps
def test_auto_warmup_is_goyals_five_epochs_on_a_long_run():
    # (moved from tests/test_autobatch.py) Goyal et al.: 90 epochs of ImageNet at batch 256.
    assert auto_warmup_steps(steps_per_epoch=5005, total_steps=450450) == 5 * 5005  # Goyal


@pytest.mark.parametrize("steps_per_epoch,total_steps,expected", [
    (10, 1000, 50),      # 5 epochs < 10% of the run
    (10, 100, 10),       # 10% of the run < 5 epochs
    (10, 95, 10),        # ceil(9.5)
    (10, 7, 1),          # ceil(0.7)
    (1, 1000, 5),
    (10, 0, 1),          # at least one step
])
def test_auto_warmup_is_five_epochs_capped_at_a_tenth_of_the_run(steps_per_epoch, total_steps,
                                                                 expected):
    assert auto_warmup_steps(steps_per_epoch, total_steps) == expected
    assert expected == max(1, min(GOYAL_WARMUP_EPOCHS * steps_per_epoch,
                                  math.ceil(AUTO_WARMUP_FRACTION * total_steps)))


# ------------------------------------------------------------- plan_lr
@pytest.mark.parametrize("scaling,factor", [("linear", 4.0), ("sqrt", 2.0)])
def test_scaling_up_multiplies_the_lr_and_adds_the_auto_warmup(scaling, factor):
    plan = plan_lr(_config(lr_scaling=scaling), steps_per_epoch=10, total_steps=1000)
    assert plan == LrSchedule(base_lr=0.1, lr=pytest.approx(0.1 * factor),
                              factor=pytest.approx(factor), warmup_steps=50, warmup_given=0,
                              warmup_auto=50)


def test_sqrt_and_linear_differ_on_a_non_square_ratio():
    linear = plan_lr(_config(lr_scaling="linear", batch_size=128), 10, 1000)
    sqrt = plan_lr(_config(lr_scaling="sqrt", batch_size=128), 10, 1000)
    assert linear.factor == pytest.approx(2.0) and linear.lr == pytest.approx(0.2)
    assert sqrt.factor == pytest.approx(math.sqrt(2.0))
    assert sqrt.lr == pytest.approx(0.1 * math.sqrt(2.0))


def test_the_auto_warmup_is_capped_by_a_short_run():
    plan = plan_lr(_config(lr_scaling="linear"), steps_per_epoch=10, total_steps=100)
    assert (plan.warmup_auto, plan.warmup_steps) == (10, 10)


@pytest.mark.parametrize("options", [
    {"lr_scaling": "none"},                                            # no scaling
    {"lr_scaling": "linear", "batch_size": 32},                        # scaled down: 0.05
    {"lr_scaling": "sqrt", "batch_size": 64},                          # factor 1: not up
])
def test_no_auto_warmup_unless_the_lr_is_scaled_up(options):
    plan = plan_lr(_config(**options), steps_per_epoch=10, total_steps=1000)
    assert plan.factor <= 1.0
    assert (plan.warmup_auto, plan.warmup_steps, plan.warmup_given) == (0, 0, 0)


def test_scaling_down_keeps_the_given_warmup():
    plan = plan_lr(_config(lr_scaling="linear", batch_size=32, warmup_steps=7), 10, 1000)
    assert plan.lr == pytest.approx(0.05) and plan.factor == pytest.approx(0.5)
    assert (plan.warmup_steps, plan.warmup_given, plan.warmup_auto) == (7, 7, 0)


@pytest.mark.parametrize("given,expected", [(60, 60), (50, 50), (5, 50)])
def test_the_longer_of_given_and_auto_warmup_wins(given, expected):
    plan = plan_lr(_config(lr_scaling="linear", warmup_steps=given), 10, 1000)
    assert plan.warmup_auto == 50 and plan.warmup_given == given
    assert plan.warmup_steps == expected


@pytest.mark.parametrize("options", [
    {"lr_scaling": "linear", "warmup_steps": 500},
    {"lr_scaling": "none", "warmup_steps": 500},
])
def test_the_warmup_is_never_longer_than_the_run(options):
    plan = plan_lr(_config(**options), steps_per_epoch=10, total_steps=100)
    assert plan.warmup_steps == 100 and plan.warmup_given == 500


def test_the_optimizers_default_lr_is_the_base():
    config = TrainConfig.from_options(optimizer="sgd", batch_size=64, base_batch_size=16,
                                      lr_scaling="linear")
    plan = plan_lr(config, steps_per_epoch=4, total_steps=40)
    assert plan.base_lr == 0.05 and plan.lr == pytest.approx(0.2)
    assert plan.warmup_steps == plan.warmup_auto == 4


# ------------------------------------------------------------- LrSchedule
def test_describe_says_how_the_lr_and_warmup_came_about():
    with cli_spelling():
        _describe_says_how_the_lr_and_warmup_came_about()
    config = _config(lr_scaling="linear")  # a library caller is told the keywords
    assert "(batch_size 256, base_batch_size 64)" in plan_lr(config, 10, 1000).describe(config)


def _describe_says_how_the_lr_and_warmup_came_about():
    config = _config(lr_scaling="linear")
    assert plan_lr(config, 10, 1000).describe(config) == (
        "lr scaling linear: lr 0.1 x 256/64 = 0.4 (--batch-size 256, --base-batch-size 64); "
        "warm-up 50 steps (automatic for a scaled-up lr: min(5 epochs, 10% of the run))")
    config = _config(lr_scaling="sqrt", warmup_steps=80)
    assert plan_lr(config, 10, 1000).describe(config) == (
        "lr scaling sqrt: lr 0.1 x sqrt(256/64) = 0.2 (--batch-size 256, --base-batch-size 64); "
        "warm-up 80 steps (--warmup-steps)")
    config = _config(warmup_steps=3)
    assert plan_lr(config, 10, 1000).describe(config) is None


def test_report():
    config = _config(lr_scaling="linear", warmup_steps=5)
    plan = plan_lr(config, 10, 1000)
    assert plan.report() == {"base_lr": 0.1, "lr_factor": pytest.approx(4.0),
                             "warmup_steps_given": 5, "warmup_steps_auto": 50}


# ------------------------------------------------- the plan built first (issue 33)
def test_the_plan_is_built_from_the_config_first_and_its_warm_up_once_the_run_is_known():
    config = _config(lr_scaling="linear", warmup_steps=2)
    first = LrSchedule.for_batch(config)
    assert (first.base_lr, first.lr, first.factor) == (0.1, pytest.approx(0.4), pytest.approx(4))
    assert (first.warmup_steps, first.warmup_auto) == (2, 0)  # before the run's length
    assert first.for_run(10, 1000) == plan_lr(config, 10, 1000)
    assert first.for_run(10, 1000).warmup_steps == 50  # the automatic warm-up decided


def test_the_optimizer_and_the_scheduler_take_the_plan():
    import torch

    from amptrain.trainer.optim import build_optimizer, build_scheduler

    config = _config(lr_scaling="linear", scheduler="none")
    plan = LrSchedule.for_batch(config).for_run(10, 40)  # warm-up: 10% of 40 steps = 4
    model = torch.nn.Linear(2, 2)
    optimizer = build_optimizer(config, model, plan=plan)
    assert [g["lr"] for g in optimizer.param_groups] == [pytest.approx(0.4)] * 2
    scheduler = build_scheduler(config, optimizer, 40, plan=plan)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.4 / 4)  # step 0 of 4 warm-up
    lrs = []
    for _ in range(5):
        optimizer.step()
        scheduler.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    assert lrs == pytest.approx([0.2, 0.3, 0.4, 0.4, 0.4])
    # Without a plan: the config's own --warmup-steps (0 here) and lr.
    plain = build_optimizer(config, model)
    build_scheduler(config, plain, 40)
    assert plain.param_groups[0]["lr"] == pytest.approx(0.4)
