"""Where a process sits in a torchrun job: its device, and the launcher that reads it.

amptrain's own launcher (amptrain/launch.py) refuses to start inside torchrun and
resumes restarted workers; both read torchrun's environment through LaunchEnv.
"""
from __future__ import annotations

import argparse

import pytest
import torch

from amptrain.cli import build_parser
from amptrain.commands.common import merged_values
from amptrain.config import RunConfig, build_config
from amptrain.distributed import process_device
from amptrain.errors import UserError
from amptrain.launch import launch_requested, resume_after_restart, torchrun_args


# ------------------------------------------------------------- unit checks
def test_each_process_takes_its_local_gpu_or_the_cpu():
    assert process_device("cpu", 3) == torch.device("cpu")
    if not torch.cuda.is_available():
        assert process_device("auto", 1) == torch.device("cpu")
    else:
        assert process_device("auto", 0) == torch.device("cuda", 0)
        with pytest.raises(UserError, match="--device cuda"):
            process_device("cuda:0", 0)


# ------------------------------------------------------------- the launcher
def _train_args(*argv: str) -> tuple[argparse.Namespace, RunConfig]:
    args = build_parser().parse_args(["train", *argv])
    return args, build_config(RunConfig, merged_values(args))


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
