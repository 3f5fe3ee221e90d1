"""build_strategy: ``--strategy`` and torchrun's environment pick the strategy."""
from __future__ import annotations

import sys

import pytest

from amptrain.distributed import Strategy, build_strategy
from amptrain.common.errors import UserError
from amptrain.trainer import Trainer
from tests.distributed.helpers import child_env, run


# ------------------------------------------------------------- unit checks
def test_auto_is_single_device_without_torchrun(monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    strategy = build_strategy("auto", "cpu")
    assert type(strategy) is Strategy and strategy.world_size == 1
    assert Trainer(device="cpu").strategy.world_size == 1


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_ddp_and_fsdp_without_torchrun_name_the_flag(monkeypatch, name):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(UserError, match="--nproc-per-node"):
        build_strategy(name, "cpu")


def test_dp_under_torchrun_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(UserError, match="--strategy dp"):
        build_strategy("dp", "cpu")


def test_cli_ddp_without_launcher_exits_2_with_one_line(tmp_path):
    env = child_env()
    env.pop("WORLD_SIZE", None)
    result = run([sys.executable, "-m", "amptrain", "train", "--strategy", "ddp", "--model", "mlp",
                  "--out", str(tmp_path / "r")], env, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "--nproc-per-node" in result.stderr
