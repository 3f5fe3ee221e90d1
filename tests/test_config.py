"""Config validation: every error names the flag (command line) or keyword (library)."""
from __future__ import annotations

import pytest

from amptrain.config import RunConfig, TrainConfig, build_config, load_yaml
from amptrain.errors import UserError, cli_spelling


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
    with cli_spelling(), pytest.raises(UserError, match=flag):
        build_config(TrainConfig, values)
    # A library caller is told the keyword it passed, not a command-line flag.
    keyword = flag.lstrip("-").replace("-", "_")
    with pytest.raises(UserError, match=keyword) as error:
        build_config(TrainConfig, values)
    assert "--" not in str(error.value)


@pytest.mark.parametrize("values,keyword,fragment", [
    ({"lr": "fast"}, "lr", "must be a number"),
    ({"lr": [1]}, "lr", "must be a number"),
    ({"epochs": 2.5}, "epochs", "must be an integer"),
    ({"epochs": True}, "epochs", "must be an integer"),
    ({"keep_fp32": 5}, "keep_fp32", "a pattern or a list of patterns"),
    ({"out": 123}, "out", "must be a string"),
    ({"resume": 7}, "resume", "must be a string"),
    ({"compile": "maybe"}, "compile", "true or false"),
    ({"seed": 2 ** 64}, "seed", "from 0 to 4294967295"),
    ({"seed": -1}, "seed", ">= 0"),
    ({"batch_size": None}, "batch_size", "needs a value"),
    ({"lrr": 0.1}, "lrr", "did you mean lr"),
])
def test_wrong_types_name_the_keyword(values, keyword, fragment):
    with pytest.raises(UserError, match=fragment) as error:
        build_config(TrainConfig, values)
    assert str(error.value).startswith(keyword) or repr(keyword) in str(error.value)


def test_values_are_converted_as_their_flag_would_convert_them():
    config = build_config(TrainConfig, {"lr": "1e-3", "epochs": "2", "max_steps": 4.0,
                                        "compile": "false", "keep_fp32": "head",
                                        "micro_batch_size": 8, "batch_size": 16})
    assert config.schedule.lr == 0.001 and isinstance(config.schedule.lr, float)
    assert config.schedule.epochs == 2 and config.schedule.max_steps == 4 and isinstance(config.schedule.max_steps, int)
    assert config.compile is False and config.precision.keep_fp32 == ["head"]
    assert config.batching.split() == (8, 2)


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


def test_yaml_keys_accept_dashes(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("batch-size: 32\nkeep_fp32: [head]\nmodel: mlp\n")
    config = build_config(RunConfig, load_yaml(path))
    assert config.batching.batch_size == 32 and config.precision.keep_fp32 == ["head"] and config.model == "mlp"


def test_yaml_errors_are_user_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_yaml(bad)
    with pytest.raises(UserError, match="no such file"):
        load_yaml(tmp_path / "missing.yaml")


@pytest.mark.parametrize("text,fragment", [
    (b"lr: 1e-3\nmax_steps: 3\n", None),                # YAML 1.1 reads 1e-3 as a string
    (b"lr: abc\n", "--lr must be a number (got 'abc')"),
    (b"keep_fp32: 5\n", "--keep-fp32 takes a pattern"),
    (b"growth_factor: big\n", "--growth-factor must be a number"),
    (b"resume: 7\n", "--resume must be a string"),
    (b"model: {name: mlp}\n", "--model must be a string"),
    (b"", "the file is empty"),
    (b"- lr\n- 3\n", "expected a mapping of option: value (got a YAML list)"),
    (b"lr: \xff\xfe\n", "not UTF-8 text"),
])
def test_yaml_values_are_typed_like_their_flags(tmp_path, text, fragment):
    path = tmp_path / "run.yaml"
    path.write_bytes(text)
    if fragment is None:
        config = build_config(RunConfig, load_yaml(path))
        assert config.schedule.lr == 0.001 and config.schedule.max_steps == 3
        return
    with cli_spelling(), pytest.raises(UserError) as error:
        build_config(RunConfig, load_yaml(path))
    assert fragment in str(error.value)
