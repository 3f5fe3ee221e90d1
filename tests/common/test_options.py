"""The option machinery (amptrain/config/options.py): one declaration per option gives its
flag, YAML key and keyword under one flat name; values are converted as their flag would
convert them, and every error names the flag (command line) or keyword (library)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from amptrain.config import (
    PrecisionConfig,
    RunConfig,
    TrainConfig,
    build_config,
    cli_flag,
    coerce,
    config_fields,
    option,
    option_paths,
    replace_options,
    section,
    to_dict,
)
from amptrain.common.errors import UserError, cli_spelling


# A small config of its own, so the machinery is checked apart from the real options.
@dataclass
class _Inner:
    label: str = option("a", "a renamed option", flat="inner_label")
    size: int | str | None = option(None, "an integer or a word", kind=str, integer_or_word=True)
    names: str = option("x", "a comma-joined list", comma_list=True)


@dataclass
class _Outer:
    rate: float = option(0.5, "a number")
    count: int = option(3, "an integer")
    on: bool = option(False, "a switch")
    patterns: list[str] = option([], "a list option")  # noqa: RUF009 (as amptrain declares)
    inner: _Inner = section(_Inner)  # noqa: RUF009


def _field(cls: type, name: str) -> dataclasses.Field:
    return config_fields(cls)[name]


# ------------------------------------------------------------- coerce
@pytest.mark.parametrize("name,value,expected", [
    ("rate", "1e-3", 0.001),            # YAML 1.1 reads 1e-3 as a string
    ("rate", " 2 ", 2.0),
    ("rate", 2, 2.0),
    ("count", "4", 4),
    ("count", 4.0, 4),                  # a whole float is taken as the integer
    ("on", "TRUE", True),
    ("on", "false", False),
    ("patterns", "head", ["head"]),    # one pattern is a list of one
    ("patterns", ("a", "b*"), ["a", "b*"]),
    ("size", "16", 16),
    ("size", 16, 16),
    ("size", "auto", "auto"),
    ("names", ["a", "b", 3], "a,b,3"),
    ("names", "a,b", "a,b"),
    ("inner_label", Path("runs") / "x", str(Path("runs") / "x")),
])
def test_coerce_converts_as_the_flag_would(name, value, expected):
    converted = coerce(_field(_Outer, name), value)
    assert converted == expected and type(converted) is type(expected)


def test_coerce_keeps_none_only_where_none_is_the_default():
    assert coerce(_field(_Inner, "size"), None) is None
    with pytest.raises(UserError, match=r"^count needs a value \(default: 3\)$"):
        coerce(_field(_Outer, "count"), None)


@pytest.mark.parametrize("name,value,fragment", [
    ("count", "4.5", "count must be an integer (got '4.5')"),
    ("count", 4.5, "count must be an integer (got 4.5)"),
    ("count", True, "count must be an integer (got True)"),
    ("rate", "fast", "rate must be a number (got 'fast')"),
    ("on", 1, "on is true or false (got 1)"),
    ("patterns", ["a", 1], "patterns takes a pattern or a list of patterns"),
    ("inner_label", 3, "inner_label must be a string (got int 3)"),
])
def test_coerce_refuses_the_wrong_kind_by_name(name, value, fragment):
    with pytest.raises(UserError) as error:
        coerce(_field(_Outer, name), value)
    assert str(error.value).startswith(fragment)
    with cli_spelling(), pytest.raises(UserError) as error:
        coerce(_field(_Outer, name), value)
    assert str(error.value).startswith(cli_flag(name) + " ")


def test_cli_flag_spells_the_flat_name():
    assert cli_flag("micro_batch_size") == "--micro-batch-size"
    assert cli_flag("lr") == "--lr"


# ------------------------------------------------------------- the flat view
def test_flat_names_and_paths_follow_the_sections():
    paths = option_paths(_Outer)
    assert paths == {"rate": ("rate",), "count": ("count",), "on": ("on",),
                     "patterns": ("patterns",), "inner_label": ("inner", "label"),
                     "size": ("inner", "size"), "names": ("inner", "names")}
    assert list(config_fields(_Outer)) == list(paths)  # field order
    assert config_fields(_Outer)["inner_label"].name == "label"


def test_precision_is_the_flat_name_of_the_precision_section_name():
    fields, paths = config_fields(TrainConfig), option_paths(TrainConfig)
    assert fields["precision"].name == "name" and "name" not in fields
    assert paths["precision"] == ("precision", "name")
    assert paths["micro_batch_size"] == ("batching", "micro_batch_size")
    assert paths["seed"] == ("seed",)
    assert option_paths(PrecisionConfig)["precision"] == ("name",)


def test_every_flat_name_is_unique_and_reaches_its_value():
    def leaf_count(cls: type) -> int:  # counted without the flat view
        return sum(leaf_count(f.default_factory) if f.metadata.get("section") else 1
                   for f in dataclasses.fields(cls))

    config = TrainConfig()
    paths = option_paths(TrainConfig)
    assert len(paths) == len(to_dict(config)) == leaf_count(TrainConfig)
    for name, path in paths.items():
        value = config
        for attribute in path:
            value = getattr(value, attribute)
        assert value == to_dict(config)[name], name


def test_run_config_adds_the_run_options():
    assert set(config_fields(RunConfig)) - set(config_fields(TrainConfig)) == \
        {"model", "data", "val_fraction", "seq_len", "tokenizer", "text_glob", "augment",
         # gym: data and the ppo task
         "env_steps", "num_envs", "rollout_steps", "vector_env", "eval_episodes",
         "minibatches", "update_epochs", "gamma", "gae_lambda", "clip_coef", "ent_coef",
         "vf_coef"}


# ------------------------------------------------------------- build, to_dict, replace
def test_build_config_and_to_dict_round_trip():
    values = {"precision": "bf16-mixed", "keep_fp32": ["head", "*.norm*"], "lr": 0.003,
              "micro_batch_size": 8, "batch_size": 32, "channels_last": True,
              "model": "mlp", "seed": 7, "strategy": "ddp"}
    config = build_config(RunConfig, values)
    assert config.precision.name == "bf16-mixed" and config.batching.micro_batch_size == 8
    assert config.distributed.strategy == "ddp" and config.model == "mlp"
    flat = to_dict(config)
    assert list(flat) == list(config_fields(RunConfig))
    assert {k: flat[k] for k in values} == values
    assert build_config(RunConfig, flat) == config
    # to_dict copies lists: editing the dict leaves the config alone.
    flat["keep_fp32"].append("body")
    assert config.precision.keep_fp32 == ["head", "*.norm*"]


def test_build_config_of_nothing_is_the_defaults():
    assert build_config(TrainConfig, {}) == TrainConfig()
    assert to_dict(build_config(_Outer, {})) == {"rate": 0.5, "count": 3, "on": False,
                                                 "patterns": [], "inner_label": "a",
                                                 "size": None, "names": "x"}


def test_replace_options_copies_and_validates_anew():
    config = build_config(TrainConfig, {"batch_size": 32, "lr": 0.01})
    changed = replace_options(config, lr="0.02", warmup_steps=5)
    assert changed.schedule.lr == 0.02 and changed.schedule.warmup_steps == 5
    assert changed.batching.batch_size == 32
    assert config.schedule.lr == 0.01 and config.schedule.warmup_steps == 0
    with pytest.raises(UserError, match="batch_size must be an integer >= 1"):
        replace_options(config, batch_size=0)
    with pytest.raises(UserError, match="unknown keyword 'weight_decy'.*did you mean weight_decay"):
        replace_options(config, weight_decy=0.1)


def test_with_options_rebuilds_only_the_sections_it_changes():
    config = build_config(RunConfig, {"batch_size": 32, "lr": 0.01, "keep_fp32": ["head"]})
    changed = config.with_options(lr="0.02", out="runs/x")
    assert changed.schedule.lr == 0.02 and changed.out == "runs/x"
    assert type(changed) is RunConfig and changed.model == config.model
    # Untouched sections are the same (never mutated) objects; the touched one is new.
    assert changed.batching is config.batching and changed.precision is config.precision
    assert changed.schedule is not config.schedule and config.schedule.lr == 0.01
    assert config.with_options() is config
    # The same as the flat round trip it replaces.
    assert changed == build_config(RunConfig, {**to_dict(config), "lr": 0.02, "out": "runs/x"})
    # A section validates again, and so does the config around it.
    with pytest.raises(UserError, match="--warmup-steps must be >= 0"), cli_spelling():
        config.with_options(warmup_steps=-1)
    with pytest.raises(UserError, match="seq_len applies to text: data"):
        config.with_options(seq_len=64)
    with pytest.raises(UserError, match="unknown keyword 'lrr'.*did you mean lr"):
        config.with_options(lrr=0.1)


# ------------------------------------------------------------- unknown names
def test_unknown_name_names_its_flag_or_keyword():
    # (moved from tests/test_config.py: the ({"warp": 9}, "--warp") case)
    with cli_spelling(), pytest.raises(UserError, match="--warp"):
        build_config(TrainConfig, {"warp": 9})
    with pytest.raises(UserError, match="warp") as error:
        build_config(TrainConfig, {"warp": 9})
    assert "--" not in str(error.value)


def test_unknown_names_suggest_the_closest_option():
    with pytest.raises(UserError) as error:
        build_config(TrainConfig, {"batchsize": 3})
    assert str(error.value) == ("unknown keyword 'batchsize' for Trainer (TrainConfig); "
                                "did you mean batch_size?")
    with cli_spelling(), pytest.raises(UserError) as error:
        build_config(RunConfig, {"micro_batchsize": 3})
    assert str(error.value) == ("unknown option --micro-batchsize; did you mean "
                                "--micro-batch-size? (see `amptrain train --help`)")
    with cli_spelling(), pytest.raises(UserError) as error:
        build_config(RunConfig, {"modle": "mlp"}, source="key")
    assert str(error.value).startswith("unknown key --modle; did you mean --model?")
    with pytest.raises(UserError) as error:
        build_config(TrainConfig, {"xyzzy": 1})
    assert "did you mean" not in str(error.value)
    # Unknown names are refused before any value is converted.
    with pytest.raises(UserError, match="unknown keyword 'xyzzy'"):
        build_config(TrainConfig, {"lr": "fast", "xyzzy": 1})


# ------------------------------------------------------------- moved from tests/test_config.py
@pytest.mark.parametrize("values,keyword,fragment", [
    ({"lr": "fast"}, "lr", "must be a number"),
    ({"lr": [1]}, "lr", "must be a number"),
    ({"epochs": 2.5}, "epochs", "must be an integer"),
    ({"epochs": True}, "epochs", "must be an integer"),
    ({"keep_fp32": 5}, "keep_fp32", "a pattern or a list of patterns"),
    ({"out": 123}, "out", "must be a string"),
    ({"resume": 7}, "resume", "must be a string"),
    ({"compile": "maybe"}, "compile", "true or false"),
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
    assert config.schedule.epochs == 2 and config.schedule.max_steps == 4
    assert isinstance(config.schedule.max_steps, int)
    assert config.compile is False and config.precision.keep_fp32 == ["head"]
    assert config.batching.split() == (8, 2)


@pytest.mark.parametrize("value", ["x" * 100_000, list(range(100_000))])
def test_an_echoed_value_is_bounded(value):
    with cli_spelling(), pytest.raises(UserError) as error:
        build_config(RunConfig, {"lr": value})
    message = str(error.value)
    assert message.startswith("--lr must be a number (got ") and len(message) < 300
    assert "characters in all)" in message


# ------------------------------------------------ the options a user gave (issue 33)
def test_a_config_carries_the_names_it_was_built_from_never_its_defaults():
    from amptrain.config import TrainConfig, given_options, to_dict

    config = build_config(TrainConfig, {"momentum": 0.9, "lr": "0.1"})
    assert config.given == {"momentum", "lr"} == given_options(config)
    assert "momentum" in config.given and config.schedule.momentum == 0.9  # the default value
    assert TrainConfig().given == frozenset()  # built from its sections: nothing given
    assert "given" not in to_dict(config) and config == build_config(TrainConfig, {"lr": 0.1})


def test_amptrain_changes_keep_the_given_set_and_keywords_join_it():
    from amptrain.config import TrainConfig

    config = TrainConfig.from_options(lr=0.1)
    changed = config.with_options(out="runs/x", log_every=3)  # amptrain's own changes
    assert changed.given == {"lr"} and changed.out == "runs/x"
    chosen = changed.with_given_options(scheduler="none")  # a library call's keywords
    assert chosen.given == {"lr", "scheduler"} and chosen.schedule.scheduler == "none"
    assert changed.with_given_options() is changed


def test_the_given_set_survives_a_copy_and_a_pickle():
    import copy
    import pickle

    from amptrain.config import RunConfig

    config = RunConfig.from_options(model="mlp", seed=3)
    assert pickle.loads(pickle.dumps(config)).given == {"model", "seed"}
    assert copy.deepcopy(config).given == {"model", "seed"}


# ----------------------------------------------------------------- issue 48, class 9
@pytest.mark.parametrize("keyword,value,expected", [
    ("max_steps", np.int64(3), 3), ("max_steps", np.int32(3), 3),
    ("batch_size", np.uint16(8), 8), ("init_scale", np.float32(1024), 1024.0),
    ("lr", np.float64(0.01), 0.01), ("lr", np.int64(1), 1.0),
    ("micro_batch_size", np.int64(4), 4),
])
def test_numpy_numbers_are_taken_where_python_numbers_are(keyword, value, expected):
    config = build_config(RunConfig, {keyword: value})
    got = {flat: v for flat, v in to_dict(config).items()}[keyword]
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize("keyword,value,fragment", [
    ("max_steps", np.float64(2.5), "--max-steps must be an integer"),
    ("lr", np.array([0.1, 0.2]), "--lr must be a number"),
])
def test_numpy_values_that_are_no_such_number_are_refused(keyword, value, fragment):
    with cli_spelling(), pytest.raises(UserError, match=fragment):
        build_config(RunConfig, {keyword: value})
