"""Helpers shared by the distributed tests: child processes, torchrun, comparisons."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from amptrain.trainer import Trainer
from tests.conftest import tiny_mlp
from tests.distributed import worker

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 420  # a hang must fail the test, not block CI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(**extra: str) -> dict[str, str]:
    """This environment minus any torchrun variables, running this checkout's amptrain."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TORCHELASTIC_RESTART_COUNT")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _descendants(pid: int) -> list[int]:
    """All processes below ``pid`` (torchrun starts its workers in sessions of their own,
    so killing the launcher's process group would leave them running)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def run(cmd: list[str], env: dict[str, str], timeout: int = TIMEOUT_S,
        cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run a process tree; on timeout dump the workers' stacks, kill the tree, and fail."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        workers = _descendants(proc.pid)
        _signal_all(workers, signal.SIGUSR1)  # worker.py dumps its stacks
        try:
            proc.communicate(timeout=3)
        except subprocess.TimeoutExpired:
            pass
        _signal_all([proc.pid, *workers], signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
        pytest.fail(f"{' '.join(cmd[:6])}... hung for {timeout}s\n{err[-6000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def torchrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--nnodes", "1", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                *args], env or child_env())


def _reference(**options) -> Trainer:
    """The same run in one process (no strategy: a single device)."""
    return worker.fit(None, **options)


def _assert_params_close(actual, expected, rtol, atol, *, moved_by=None):
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, rtol=rtol, atol=atol, msg=name)
    if moved_by is not None:  # the comparison means something: training moved the weights
        init = tiny_mlp().state_dict()
        moved = max((expected[k] - init[k]).abs().max().item() for k in init)
        assert moved > moved_by, moved
