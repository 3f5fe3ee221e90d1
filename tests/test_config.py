"""Config validation: every error names the flag to change."""
from __future__ import annotations

import pytest

from amptrain.config import RunConfig, TrainConfig, build_config, load_yaml
from amptrain.errors import UserError


@pytest.mark.parametrize("values,flag", [
    ({"accumulate": 0}, "--accumulate"),
    ({"batch_size": -4}, "--batch-size"),
    ({"lr": -1.0}, "--lr"),
    ({"optimizer": "adam"}, "--optimizer"),
    ({"micro_batch_size": "big"}, "--micro-batch-size"),
    ({"growth_factor": 1.0}, "--growth-factor"),
    ({"backoff_factor": 1.5}, "--backoff-factor"),
    ({"lr_scaling": "linear"}, "--base-batch-size"),
    ({"warp": 9}, "--warp"),
])
def test_bad_values_name_their_flag(values, flag):
    with pytest.raises(UserError, match=flag):
        build_config(TrainConfig, values)


@pytest.mark.parametrize("values,expected", [
    ({"batch_size": 64}, (64, 1)),
    ({"batch_size": 64, "accumulate": 4}, (16, 4)),
    ({"batch_size": 64, "micro_batch_size": 8}, (8, 8)),
    ({"batch_size": 64, "micro_batch_size": 16, "accumulate": 4}, (16, 4)),
])
def test_batching_derives_the_missing_value(values, expected):
    assert build_config(TrainConfig, values).batching() == expected


def test_batching_errors_list_valid_values():
    with pytest.raises(UserError, match="valid values: 1, 2, 3, 4, 6, 8, 12, 16"):
        build_config(TrainConfig, {"batch_size": 48, "micro_batch_size": 10}).batching()
    with pytest.raises(UserError, match="not divisible by the 4 processes"):
        build_config(TrainConfig, {"batch_size": 30}).batching(world_size=4)
    with pytest.raises(UserError, match="drop one of the three flags"):
        build_config(TrainConfig, {"batch_size": 64, "micro_batch_size": 8,
                                   "accumulate": 4}).batching()


def test_yaml_keys_accept_dashes(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("batch-size: 32\nkeep_fp32: [head]\nmodel: mlp\n")
    config = build_config(RunConfig, load_yaml(path))
    assert config.batch_size == 32 and config.keep_fp32 == ["head"] and config.model == "mlp"


def test_yaml_errors_are_user_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_yaml(bad)
    with pytest.raises(UserError, match="no such file"):
        load_yaml(tmp_path / "missing.yaml")
