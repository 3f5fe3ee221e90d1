"""commands/common.py: config flags generated from the config dataclasses, --config YAML
merged under the flags, default output directories and the command line for reports."""
from __future__ import annotations

import argparse
import re

import pytest
import yaml

from amptrain.commands import common
from amptrain.commands.common import add_config_flags, command_line, default_out, merged_values
from amptrain.config import RunConfig, cli_flag, config_fields
from amptrain.precision import PRECISION_NAMES


def _parser(**options) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="amptrain train")
    parser.add_argument("--config")
    add_config_flags(parser, **options)
    return parser


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}


def test_every_option_is_a_flag_under_its_flat_name():
    actions = _actions(_parser())
    for name in config_fields(RunConfig):
        assert actions[name].option_strings == [cli_flag(name)], name
    # The precision section's `name` field is --precision, not --name.
    assert "name" not in actions and actions["precision"].option_strings == ["--precision"]


def test_only_the_flags_given_appear_typed_as_their_options():
    parser = _parser()
    assert vars(parser.parse_args([])) == {"config": None}  # no default sneaks in under YAML
    args = parser.parse_args(["--lr", "0.1", "--epochs", "3", "--keep-fp32", "head",
                              "--keep-fp32", "*.norm", "--compile", "--micro-batch-size", "auto"])
    assert vars(args) == {"config": None, "lr": 0.1, "epochs": 3, "keep_fp32": ["head", "*.norm"],
                          "compile": True, "micro_batch_size": "auto"}
    assert "(default: adamw)" in _actions(parser)["optimizer"].help


def test_closed_choices_are_refused_by_the_parser(capsys):
    parser = _parser()
    assert parser.parse_args(["--lr-scaling", "sqrt"]).lr_scaling == "sqrt"
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--lr-scaling", "cube"])
    assert exit_.value.code == 2
    assert "argument --lr-scaling: invalid choice: 'cube'" in capsys.readouterr().err


def test_precision_takes_aliases_the_parser_does_not_know():
    # Open choices: the config resolves aliases (Keras and Lightning spellings) later.
    assert _parser().parse_args(["--precision", "mixed_bfloat16"]).precision == "mixed_bfloat16"


def test_precision_lists_its_choices_in_help():
    help_text = _actions(_parser())["precision"].help
    assert f"(one of: {', '.join(PRECISION_NAMES)})" in help_text


def test_only_adds_just_the_named_options():
    assert set(_actions(_parser(only=["lr", "seed"]))) == {"config", "lr", "seed"}


def test_flags_override_the_yaml_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"lr": 0.5, "seed": 3, "model": "mlp"}))
    parser = _parser()
    parser.add_argument("--nproc-per-node", type=int)  # not a config option: never merged
    args = parser.parse_args(["--config", str(path), "--seed", "9", "--nproc-per-node", "2"])
    assert merged_values(args) == {"lr": 0.5, "seed": 9, "model": "mlp"}
    assert merged_values(parser.parse_args(["--epochs", "2"])) == {"epochs": 2}


def test_default_out_is_a_safe_timestamped_name_under_runs(monkeypatch):
    monkeypatch.setattr(common.time, "strftime", lambda fmt: "20260101-120000")
    config = RunConfig.from_options(model="module:my/models.py:Net", data="npz:/tmp/x y.npz")
    assert default_out(config) == "runs/20260101-120000-module_my_models.py_Net-npz_tmp_x_y.npz"
    assert default_out(config, prefix="compare-").startswith("runs/compare-20260101-120000-")
    long = RunConfig.from_options(model="transformer:" + "layers=2," * 20, data="digits")
    name = default_out(long).split("/", 1)[1]
    assert re.fullmatch(r"20260101-120000-[A-Za-z0-9_.-]{1,60}", name)


@pytest.mark.parametrize("argv, expected", [
    (["/usr/local/bin/amptrain", "train", "--out", "my runs/x"],
     "amptrain train --out 'my runs/x'"),
    (["/repo/amptrain/__main__.py", "compare", "--seeds", "2"], "amptrain compare --seeds 2"),
    (["/usr/bin/pytest", "tests"], None),  # not the amptrain command: nothing to report
])
def test_command_line_is_what_the_user_typed(monkeypatch, argv, expected):
    monkeypatch.setattr(common.sys, "argv", argv)
    assert command_line() == expected


def test_config_from_args_merges_yaml_under_flags_once(tmp_path):
    from amptrain.commands.common import config_from_args, with_out

    (tmp_path / "c.yaml").write_text("lr: 0.5\nepochs: 7\n")
    args = _parser().parse_args(["--config", str(tmp_path / "c.yaml"), "--lr", "0.25"])
    config = config_from_args(args)
    assert config.schedule.lr == 0.25 and config.schedule.epochs == 7  # the flag wins
    decided = with_out(config, prefix="x-")
    assert decided.out.startswith("runs/x-") and with_out(decided) is decided


def test_merged_values_reads_the_options_of_several_classes():
    from amptrain.compare import CompareOptions

    args = argparse.Namespace(config=None, lr=0.1, seeds=3, steps=9)
    assert merged_values(args) == {"lr": 0.1}
    assert merged_values(args, RunConfig, CompareOptions) == {"lr": 0.1, "seeds": 3}


def test_command_modules_import_nothing_heavy():
    """`amptrain --help` imports every command module: none may bring torch or numpy."""
    import subprocess
    import sys

    code = ("import sys\nfrom amptrain import commands\n"
            "for name in commands.COMMANDS: commands.load(name)\n"
            "print(sorted(m for m in ('torch', 'numpy', 'amptrain.workflows.runner')"
            " if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"


def test_the_config_carries_exactly_the_flags_typed_and_the_yaml_keys(tmp_path):
    from amptrain.commands.common import config_from_args

    (tmp_path / "c.yaml").write_text("momentum: 0.9\nepochs: 7\n")
    args = _parser().parse_args(["--config", str(tmp_path / "c.yaml"), "--lr", "0.001",
                                 "--batch-size", "64"])
    config = config_from_args(args)
    # --batch-size 64 and momentum 0.9 are the defaults: given all the same.
    assert config.given == {"momentum", "epochs", "lr", "batch_size"}
    assert config_from_args(_parser().parse_args([])).given == frozenset()


def test_a_runs_own_config_yaml_read_back_gives_only_what_differs_from_the_defaults(tmp_path):
    from amptrain.commands.common import config_from_args

    resolved = {"lr": 0.01, "momentum": 0.9, "init_scale": 65536.0, "keep_fp32": [],
                "model": "mlp", "world_size": 1, "lr_schedule": {"lr_scaling": "none"}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(resolved))
    args = _parser().parse_args(["--config", str(tmp_path / "config.yaml"), "--seed", "0"])
    config = config_from_args(args)
    assert config.given == {"lr", "model", "seed"}  # amptrain wrote the rest, at defaults
    assert (config.schedule.lr, config.schedule.momentum, config.model) == (0.01, 0.9, "mlp")
