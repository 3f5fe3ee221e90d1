"""``amptrain train --nproc-per-node N`` (amptrain/launch.py): launcher flags become
torchrun's arguments, the workers get flags that rebuild the launcher's config, and a
restarted worker resumes from the last checkpoint."""
from __future__ import annotations

import argparse

import pytest

from amptrain.cli import build_parser
from amptrain.commands.common import merged_values
from amptrain.config import RunConfig, build_config
from amptrain.common.errors import UserError
from amptrain.workflows.launch import (config_args, launch_requested, resume_after_restart,
                                       torchrun_args)

_TORCHRUN_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TORCHELASTIC_RESTART_COUNT")


@pytest.fixture(autouse=True)
def _not_under_torchrun(monkeypatch):
    # These tests decide for themselves whether they run "inside torchrun".
    for name in _TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)


def _train_args(*argv: str) -> tuple[argparse.Namespace, RunConfig]:
    args = build_parser().parse_args(["train", *argv])
    return args, build_config(RunConfig, merged_values(args))


# ----------------------------------------------- moved from tests/distributed/test_base.py
def test_launcher_flags_become_torchrun_arguments_not_config():
    args, config = _train_args("--model", "mlp", "--precision", "bf16-mixed", "--keep-fp32", "head",
                               "--lr", "0.003", "--no-progress", "--out", "runs/x",
                               "--nproc-per-node", "4", "--max-restarts", "2")
    assert launch_requested(args)
    argv = torchrun_args(args, config)
    assert argv[:6] == ["--nproc-per-node", "4", "--nnodes", "1", "--max-restarts", "2"]
    assert "--master-port" not in argv  # one machine: torchrun picks a free port itself
    child = argv[argv.index("-m"):]
    assert child[:3] == ["-m", "amptrain", "train"]
    assert not {"--nproc-per-node", "--max-restarts"} & set(child)
    # The workers rebuild exactly the config the launcher resolved.
    _, rebuilt = _train_args(*child[3:])
    assert rebuilt == config


def test_multi_node_launch_needs_the_master_address():
    args, config = _train_args("--nproc-per-node", "8", "--nnodes", "2", "--node-rank", "1")
    with pytest.raises(UserError, match="--master-addr"):
        torchrun_args(args, config)
    machine = ("--nproc-per-node", "8", "--nnodes", "2", "--node-rank", "1",
               "--master-addr", "10.0.0.1", "--master-port", "29400")
    argv = torchrun_args(*_train_args(*machine))
    assert argv[argv.index("--node-rank") + 1] == "1"
    assert argv[argv.index("--master-addr") + 1] == "10.0.0.1"
    assert argv[argv.index("--master-port") + 1] == "29400"
    # Restartable jobs rendezvous through c10d (a fresh store per attempt).
    argv = torchrun_args(*_train_args(*machine, "--max-restarts", "3"))
    assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400"


def test_launcher_flags_inside_torchrun_are_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    args, _ = _train_args("--nproc-per-node", "2")
    with pytest.raises(UserError, match="already started by torchrun"):
        launch_requested(args)


def test_restarted_worker_resumes_automatically(monkeypatch):
    config = build_config(RunConfig, {"out": "runs/x"})
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert resume_after_restart(config).checkpointing.resume is None
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert resume_after_restart(config).checkpointing.resume == "auto"


# ------------------------------------------------------------- config_args
def _parse_back(argv: list[str]) -> RunConfig:
    args = build_parser().parse_args(["train", *argv])
    return build_config(RunConfig, merged_values(args))


def test_config_args_rebuild_the_same_config():
    config = RunConfig.from_options(
        model="mlp", data="synthetic-image", precision="bf16-mixed", lr=3e-4,
        batch_size=48, micro_batch_size=8, optimizer="sgd", momentum=0.0, seed=11,
        keep_fp32=["head", "*.norm*"], channels_last=True, no_progress=True,
        scheduler="onecycle", warmup_steps=5, lr_scaling="sqrt", base_batch_size=16,
        clip_grad_norm=1.5, val_fraction=0.25, max_steps=40, out="runs/launch test")
    argv = config_args(config)
    assert [a for a in argv if a.startswith("--keep-fp32")] == \
        ["--keep-fp32=head", "--keep-fp32=*.norm*"]             # a list: one flag per item
    assert "--channels-last" in argv and "--compile" not in argv  # bools: given when true
    assert "--out=runs/launch test" in argv                       # one word: '-x' values too
    assert _parse_back(argv) == config


def test_config_args_of_the_defaults_are_empty_and_auto_survives():
    assert config_args(RunConfig()) == []
    config = RunConfig.from_options(micro_batch_size="auto", memory_budget_gb=0.5,
                                    resume="auto", out="o")
    argv = config_args(config)
    assert argv == ["--out=o", "--micro-batch-size=auto", "--memory-budget-gb=0.5",
                    "--resume=auto"]
    assert _parse_back(argv) == config


def test_config_args_survive_values_that_start_with_a_dash():
    config = RunConfig.from_options(out="-run", keep_fp32=["-head"])
    assert _parse_back(config_args(config)) == config


# ------------------------------------------------------------- torchrun_args checks
@pytest.mark.parametrize("argv,flag", [
    (("--master-port", "70000"), "--master-port"),
    (("--master-port", "0"), "--master-port"),
    (("--node-rank", "2", "--nnodes", "2"), "--node-rank"),
    (("--node-rank", "2", "--nnodes", "2", "--master-addr", "10.0.0.1"), "--node-rank"),
    (("--node-rank", "-1"), "--node-rank"),
    (("--max-restarts", "-1"), "--max-restarts"),
])
def test_torchrun_args_refuse_impossible_launcher_flags(argv, flag):
    args, config = _train_args("--nproc-per-node", "2", *argv)
    with pytest.raises(UserError) as error:
        torchrun_args(args, config)
    assert str(error.value).startswith(flag + " ")


def test_torchrun_args_refuse_no_processes():
    args, config = _train_args("--nproc-per-node", "0")
    with pytest.raises(UserError, match=r"^--nproc-per-node must be >= 1 \(got 0\)$"):
        torchrun_args(args, config)


def test_torchrun_args_refuse_zero_machines():
    args, config = _train_args("--nproc-per-node", "2", "--nnodes", "0")
    with pytest.raises(UserError, match="--nnodes"):
        torchrun_args(args, config)


def test_one_machine_with_a_port_uses_static_rendezvous_on_localhost():
    argv = torchrun_args(*_train_args("--nproc-per-node", "2", "--master-port", "29600"))
    launcher = argv[:argv.index("-m")]
    assert launcher == ["--nproc-per-node", "2", "--nnodes", "1", "--max-restarts", "0",
                        "--node-rank", "0", "--master-addr", "127.0.0.1",
                        "--master-port", "29600"]
    # Restartable on one machine without a port: c10d on a free local port.
    argv = torchrun_args(*_train_args("--nproc-per-node", "2", "--max-restarts", "1"))
    assert argv[argv.index("--rdzv-endpoint") + 1] == "localhost:0"
    assert "--master-port" not in argv


# ------------------------------------------------------------- launch_requested, resume
def test_launch_is_requested_only_by_launcher_flags():
    args, _ = _train_args("--model", "mlp", "--epochs", "1")
    assert launch_requested(args) is False
    args, _ = _train_args("--nnodes", "2")
    with pytest.raises(UserError, match=r"^--nnodes needs --nproc-per-node N"):
        launch_requested(args)


def test_resume_is_left_alone_outside_torchrun_and_when_given(monkeypatch):
    config = build_config(RunConfig, {"out": "runs/x"})
    assert resume_after_restart(config) is config  # not under torchrun
    given = build_config(RunConfig, {"out": "runs/x", "resume": "runs/old/last.pt"})
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert resume_after_restart(given).checkpointing.resume == "runs/old/last.pt"


def test_config_args_carry_the_given_options_to_every_process():
    config = build_config(RunConfig, {"momentum": 0.9, "lr": 0.5, "out": "runs/x"})
    argv = config_args(config)
    assert "--momentum=0.9" in argv and "--lr=0.5" in argv  # momentum: given at its default
    rebuilt = build_config(RunConfig, merged_values(build_parser().parse_args(["train",
                                                                               *argv])))
    assert rebuilt == config and config.given <= rebuilt.given
