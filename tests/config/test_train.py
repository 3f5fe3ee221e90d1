"""What a training run is configured with (amptrain/config/train.py): each section validates
itself when built and names the option it refuses; BatchingConfig.split derives the
missing one of batch, micro-batch and accumulation."""
from __future__ import annotations

import math

import pytest

from amptrain.config import (
    DEFAULT_LR,
    MAX_SEED,
    BatchingConfig,
    CheckpointConfig,
    DistributedConfig,
    LoggingConfig,
    PrecisionConfig,
    RunConfig,
    ScheduleConfig,
    TrainConfig,
    build_config,
)
from amptrain.common.errors import UserError, cli_spelling


# ------------------------------------------------------------- each section's checks
@pytest.mark.parametrize("section,kwargs,name,fragment", [
    (PrecisionConfig, {"growth_interval": 0}, "growth_interval", "must be an integer >= 1"),
    (PrecisionConfig, {"max_bad_steps": 0}, "max_bad_steps", "must be an integer >= 1"),
    (PrecisionConfig, {"init_scale": math.inf}, "init_scale", "must be a positive number"),
    (PrecisionConfig, {"min_scale": 0.0}, "min_scale", "must be a positive number"),
    (PrecisionConfig, {"growth_factor": 0.5}, "growth_factor", "must be > 1"),
    (PrecisionConfig, {"backoff_factor": 0.0}, "backoff_factor", "must be between 0 and 1"),
    (PrecisionConfig, {"min_scale": 8.0, "init_scale": 4.0}, "min_scale", "must not exceed"),
    (BatchingConfig, {"batch_size": 0}, "batch_size", "must be an integer >= 1"),
    (BatchingConfig, {"accumulate": 0}, "accumulate", "must be an integer >= 1"),
    (BatchingConfig, {"num_workers": -1}, "num_workers", "must be >= 0"),
    (BatchingConfig, {"micro_batch_size": 0}, "micro_batch_size", "positive integer or 'auto'"),
    (BatchingConfig, {"micro_batch_size": True}, "micro_batch_size", "positive integer or 'auto'"),
    (BatchingConfig, {"micro_batch_size": "auto", "accumulate": 2}, "micro_batch_size",
     "auto derives"),
    (BatchingConfig, {"memory_budget_gb": 4.0}, "memory_budget_gb", "only applies with"),
    (BatchingConfig, {"micro_batch_size": "auto", "memory_budget_gb": 0.0}, "memory_budget_gb",
     "must be a positive number"),
    (ScheduleConfig, {"epochs": 0}, "epochs", "must be an integer >= 1"),
    (ScheduleConfig, {"max_steps": 0}, "max_steps", "must be an integer >= 1"),
    (ScheduleConfig, {"base_batch_size": 0}, "base_batch_size", "must be an integer >= 1"),
    (ScheduleConfig, {"warmup_steps": -1}, "warmup_steps", "must be >= 0"),
    (ScheduleConfig, {"weight_decay": -0.1}, "weight_decay", "must be >= 0"),
    (ScheduleConfig, {"momentum": -0.1}, "momentum", "must be >= 0"),
    (ScheduleConfig, {"lr": math.nan}, "lr", "must be a positive number"),
    (ScheduleConfig, {"clip_grad_norm": 0.0}, "clip_grad_norm", "must be a positive number"),
    (ScheduleConfig, {"scheduler": "step"}, "scheduler",
     "is not one of amptrain's (none, cosine, onecycle, linear) nor a "
     "torch.optim.lr_scheduler class: did you mean StepLR?"),
    (ScheduleConfig, {"lr_scaling": "sqrt"}, "lr_scaling", "needs"),
    (CheckpointConfig, {"save_every": 0}, "save_every", "must be an integer >= 1"),
    (CheckpointConfig, {"keep_last": -1}, "keep_last", "must be >= 0"),
    (LoggingConfig, {"log_every": 0}, "log_every", "must be an integer >= 1"),
    (LoggingConfig, {"eval_every": 0}, "eval_every", "must be an integer >= 1"),
    (DistributedConfig, {"strategy": "horovod"}, "strategy", "must be one of auto, ddp, fsdp, dp"),
    (TrainConfig, {"seed": MAX_SEED + 1}, "seed", f"from 0 to {MAX_SEED}"),
    (TrainConfig, {"out": "  "}, "out", "must name a directory"),
    (RunConfig, {"val_fraction": 1.0}, "val_fraction", "must be between 0 and 1"),
    (RunConfig, {"val_fraction": 0.0}, "val_fraction", "must be between 0 and 1"),
    (RunConfig, {"seed": -1}, "seed", "must be >= 0"),   # TrainConfig's checks still run
])
def test_each_section_refuses_bad_values_by_name(section, kwargs, name, fragment):
    with pytest.raises(UserError) as error:
        section(**kwargs)
    message = str(error.value)
    assert message.startswith(name + " ") and fragment in message and "--" not in message
    with cli_spelling(), pytest.raises(UserError) as error:
        section(**kwargs)
    assert str(error.value).startswith("--" + name.replace("_", "-") + " ")


@pytest.mark.parametrize("section,kwargs", [
    (PrecisionConfig, {"min_scale": 4.0, "init_scale": 4.0, "backoff_factor": 0.99}),
    (BatchingConfig, {"micro_batch_size": "auto", "memory_budget_gb": 0.5}),
    (BatchingConfig, {"num_workers": 0, "accumulate": 1}),
    (ScheduleConfig, {"lr_scaling": "linear", "base_batch_size": 8, "warmup_steps": 0,
                      "momentum": 0.0, "weight_decay": 0.0}),
    (CheckpointConfig, {"keep_last": 0}),
    (TrainConfig, {"seed": MAX_SEED}),
    (RunConfig, {"val_fraction": 0.5}),
])
def test_valid_edge_values_are_kept_as_given(section, kwargs):
    built = section(**kwargs)
    for key, value in kwargs.items():
        assert getattr(built, key) == value


def test_error_messages_are_exact_where_two_options_meet():
    with cli_spelling(), pytest.raises(UserError) as error:
        PrecisionConfig(min_scale=10.0, init_scale=4.0)
    assert str(error.value) == "--min-scale (10.0) must not exceed --init-scale (4.0)"
    with pytest.raises(UserError) as error:
        ScheduleConfig(lr_scaling="linear")
    assert str(error.value) == ("lr_scaling linear needs base_batch_size (the batch size lr "
                                "was tuned for)")


def test_schedule_resolves_the_optimizers_default_lr():
    assert ScheduleConfig(optimizer="sgd").resolved_lr() == DEFAULT_LR["sgd"] == 0.05
    assert ScheduleConfig().resolved_lr() == DEFAULT_LR["adamw"] == 1e-3
    assert ScheduleConfig(optimizer="sgd", lr=0.2).resolved_lr() == 0.2


def test_batching_auto():
    assert BatchingConfig(micro_batch_size="auto").auto
    assert not BatchingConfig(micro_batch_size=8).auto and not BatchingConfig().auto


# ------------------------------------------------------------- BatchingConfig.split
@pytest.mark.parametrize("kwargs,world_size,expected", [
    ({"batch_size": 64}, 4, (16, 1)),
    ({"batch_size": 64, "micro_batch_size": 8}, 4, (8, 2)),
    ({"batch_size": 64, "accumulate": 2}, 4, (8, 2)),
    ({"batch_size": 64, "micro_batch_size": 4, "accumulate": 2}, 8, (4, 2)),
    ({"batch_size": 64, "micro_batch_size": "auto"}, 2, (32, 1)),
])
def test_split_over_processes(kwargs, world_size, expected):
    micro, accumulate = BatchingConfig(**kwargs).split(world_size)
    assert (micro, accumulate) == expected
    assert micro * accumulate * world_size == kwargs["batch_size"]


@pytest.mark.parametrize("kwargs,world_size,message", [
    ({"batch_size": 30}, 4,
     ("--batch-size 30 is not divisible by the 4 processes; use a multiple of 4 "
      "(nearest: 28 or 32)")),
    ({"batch_size": 2}, 4,
     "--batch-size 2 is not divisible by the 4 processes; use a multiple of 4 (nearest: 4)"),
    ({"batch_size": 64, "micro_batch_size": 32}, 4,
     ("--micro-batch-size 32 is larger than the per-device batch 16 (--batch-size 64 over 4 "
      "processes): a micro-batch is a part of the batch; lower --micro-batch-size or raise "
      "--batch-size")),
    ({"batch_size": 48, "micro_batch_size": 10}, 1,
     ("--micro-batch-size 10 does not divide the per-device batch 48; valid values: 1, 2, 3, 4, "
      "6, 8, 12, 16, ... (nearest: 8 or 12), or keep it with --batch-size 40 or 50")),
    ({"batch_size": 64, "micro_batch_size": 6}, 4,
     ("--micro-batch-size 6 does not divide the per-device batch 16; valid values: 1, 2, 4, 8, "
      "16 (nearest: 4 or 8), or keep it with --batch-size 48 or 72")),
    ({"batch_size": 64, "accumulate": 5}, 1,
     ("--accumulate 5 does not divide the per-device batch 64; valid values: 1, 2, 4, 8, 16, "
      "32, 64")),
    ({"batch_size": 64, "micro_batch_size": 8, "accumulate": 2}, 2,
     ("--micro-batch-size 8 x --accumulate 2 x 2 process(es) = 32, not --batch-size 64; "
      "drop one of the three")),
])
def test_split_errors_say_what_would_work(kwargs, world_size, message):
    batching = BatchingConfig(**kwargs)
    with cli_spelling(), pytest.raises(UserError) as error:
        batching.split(world_size)
    assert str(error.value) == message


def test_suggested_batch_sizes_do_split():
    # The "keep it with --batch-size ..." values really work with the micro-batch given.
    for batch_size in (48, 72):
        assert BatchingConfig(batch_size=batch_size, micro_batch_size=6).split(4)[0] == 6
    for batch_size in (40, 50):
        assert BatchingConfig(batch_size=batch_size, micro_batch_size=10).split(1)[0] == 10


# ------------------------------------------------------------- from_options, RunConfig
def test_from_options_takes_flat_names():
    config = TrainConfig.from_options(lr="0.1", batch_size=32, precision="bf16-mixed",
                                      keep_fp32="head", eval_every=5)
    assert type(config) is TrainConfig
    assert config.schedule.lr == 0.1 and config.batching.batch_size == 32
    assert config.precision.name == "bf16-mixed" and config.precision.keep_fp32 == ["head"]
    assert config.logging.eval_every == 5
    assert config == build_config(TrainConfig, {"lr": 0.1, "batch_size": 32,
                                                "precision": "bf16-mixed",
                                                "keep_fp32": ["head"], "eval_every": 5})
    with pytest.raises(UserError, match=r"unknown keyword 'model' for Trainer \(TrainConfig\)"):
        TrainConfig.from_options(model="mlp")


# ------------------------------------------------------------- moved from tests/test_config.py
@pytest.mark.parametrize("values,flag", [
    ({"accumulate": 0}, "--accumulate"),
    ({"batch_size": -4}, "--batch-size"),
    ({"lr": -1.0}, "--lr"),
    ({"optimizer": "adamz"}, "--optimizer"),
    ({"micro_batch_size": "big"}, "--micro-batch-size"),
    ({"growth_factor": 1.0}, "--growth-factor"),
    ({"backoff_factor": 1.5}, "--backoff-factor"),
    ({"lr_scaling": "linear"}, "--base-batch-size"),
])
def test_bad_values_name_their_flag(values, flag):
    with cli_spelling(), pytest.raises(UserError, match=flag):
        build_config(TrainConfig, values)
    # A library caller is told the keyword it passed, not a command-line flag.
    keyword = flag.lstrip("-").replace("-", "_")
    with pytest.raises(UserError, match=keyword) as error:
        build_config(TrainConfig, values)
    assert "--" not in str(error.value)


@pytest.mark.parametrize("values,keyword,fragment", [
    ({"seed": 2 ** 64}, "seed", "from 0 to 4294967295"),
    ({"seed": -1}, "seed", ">= 0"),
])
def test_wrong_types_name_the_keyword(values, keyword, fragment):
    with pytest.raises(UserError, match=fragment) as error:
        build_config(TrainConfig, values)
    assert str(error.value).startswith(keyword) or repr(keyword) in str(error.value)


def test_micro_batch_larger_than_the_batch():
    with pytest.raises(UserError, match="micro_batch_size 64 is larger than batch_size 32"):
        build_config(TrainConfig, {"batch_size": 32, "micro_batch_size": 64}).batching.split()


@pytest.mark.parametrize("values,expected", [
    ({"batch_size": 64}, (64, 1)),
    ({"batch_size": 64, "accumulate": 4}, (16, 4)),
    ({"batch_size": 64, "micro_batch_size": 8}, (8, 8)),
    ({"batch_size": 64, "micro_batch_size": 16, "accumulate": 4}, (16, 4)),
])
def test_batching_derives_the_missing_value(values, expected):
    assert build_config(TrainConfig, values).batching.split() == expected


def test_batching_errors_list_valid_values():
    with pytest.raises(UserError, match="valid values: 1, 2, 3, 4, 6, 8, 12, 16"):
        build_config(TrainConfig, {"batch_size": 48, "micro_batch_size": 10}).batching.split()
    with pytest.raises(UserError, match="not divisible by the 4 processes"):
        build_config(TrainConfig, {"batch_size": 30}).batching.split(world_size=4)
    with pytest.raises(UserError, match="drop one of the three"):
        build_config(TrainConfig, {"batch_size": 64, "micro_batch_size": 8,
                                   "accumulate": 4}).batching.split()


# Issue 33: one owner of the batch split, one rounding rule.
def test_the_split_is_one_object_with_one_rule():
    from amptrain.config import MicroBatchSplit

    assert MicroBatchSplit.of(16, 64) == MicroBatchSplit(16, 4) == (16, 4)
    assert MicroBatchSplit.of(16, 64).per_device == 64
    for micro, per_device in ((16, 50), (0, 8), (9, 8)):
        with pytest.raises(ValueError, match="does not divide"):
            MicroBatchSplit.of(micro, per_device)  # never rounded up nor down
    split = BatchingConfig(batch_size=64, accumulate=4).split(2)
    assert isinstance(split, MicroBatchSplit) and split == (8, 4) and split.per_device == 32
