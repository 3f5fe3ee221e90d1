"""Helpers shared by the checkpoint tests: tiny training runs, the CLI, real processes.

In-process tests stop a run with ``stop_requested`` (what the signal handler sets) and
resume it in a new Trainer; the slow tests drive real ``python -m amptrain train``
processes with SIGTERM and SIGKILL.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

from amptrain import checkpoint
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification

REPO = Path(__file__).resolve().parents[2]
COMPARED = ("step", "epoch", "loss", "lr", "loss_scale", "grad_norm", "skipped_steps")


def dropout_mlp(seed: int = 0) -> nn.Module:
    """Dropout makes the torch RNG part of the trajectory, so its restore is tested too."""
    torch.manual_seed(seed)
    return nn.Sequential(OrderedDict(
        body=nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Dropout(0.2)),
        head=nn.Linear(16, 3)))


def adamw_pair(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A small model and its AdamW (the sharded-checkpoint tests)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def adamw_step(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    """One optimizer step on a batch drawn from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    model(torch.randn(5, 4, generator=generator)).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def plain_state(step: int) -> dict:
    """The plain (non-tensor) entries of a checkpoint at ``step``."""
    return {"format": checkpoint.FORMAT, "format_version": checkpoint.FORMAT_VERSION,
            "step": step, "epoch": 0, "window_in_epoch": step, "config": {}, "rng": {}}


TRAIN = tiny_classification(n=200)          # batch 32: 7 steps per epoch, the last partial
VAL = tiny_classification(n=64, seed=1)
OPTIONS = {"device": "cpu", "deterministic": True, "no_progress": True, "batch_size": 32,
           "epochs": 3, "log_every": 4, "lr": 0.02, "scheduler": "cosine", "warmup_steps": 2,
           # fp16: a huge initial scale overflows, and a short growth interval makes the
           # scale grow and back off again, so scale, growth tracker and skips all move.
           "init_scale": 2.0 ** 20, "growth_interval": 3}


class StopAt:
    """Asks the trainer to stop after step ``k``, as the SIGTERM handler would."""

    def __init__(self, k: int) -> None:
        self.k = k

    def on_step_end(self, trainer: Trainer) -> None:
        if trainer.step == self.k:
            trainer.stop_requested = "SIGTERM"


def _train(out: Path, precision: str, *, callbacks=(), **options) -> Trainer:
    trainer = Trainer(precision=precision, out=str(out), callbacks=callbacks,
                      **{**OPTIONS, **options})
    trainer.fit(dropout_mlp(), TRAIN, VAL)
    return trainer


def _records(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: r.get(k) for k in COMPARED} for r in map(json.loads, lines) if "loss" in r]


# -------------------------------------------------------------- clear errors
CLI_RUN = ("--model", "mlp:16", "--data", "digits", "--precision", "32-true", "--batch-size", "64",
           "--max-steps", "3", "--no-progress")


def _error_line(code: int, err: str) -> str:
    assert code == 2, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("amptrain: error:")]
    assert len(errors) == 1, err
    return errors[0]


# ------------------------------------------------------------ real processes
TRAIN_ARGS = ("train", "--model", "mlp:32", "--data", "digits", "--precision", "16-mixed",
              "--deterministic", "--batch-size", "32", "--epochs", "12", "--log-every", "5",
              "--no-progress")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != checkpoint.SLOW_SAVE_ENV}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **extra)
    return env


def _start(out: Path, *args: str, **env: str) -> subprocess.Popen:
    """``python -m amptrain train ...``; stderr goes to a file (a full pipe would block it)."""
    out.mkdir(parents=True, exist_ok=True)
    # Open past this function: _finish() reads it back and closes it.
    log_file = open(out / f"stderr-{time.monotonic_ns()}.txt", "w+")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "amptrain", *TRAIN_ARGS, *args,
                             "--out", str(out)], env=_env(**env), stdout=subprocess.DEVNULL,
                            stderr=log_file, text=True)
    proc.log_file = log_file  # type: ignore[attr-defined]
    return proc


def _stderr(proc: subprocess.Popen) -> str:
    proc.log_file.seek(0)
    return proc.log_file.read()


def _finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    proc.wait(timeout=timeout)
    err = _stderr(proc)
    proc.log_file.close()
    return proc.returncode, err


def _wait_for(condition, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"process ended early ({proc.returncode}): {_stderr(proc)}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out waiting")
        time.sleep(0.005)


def _final_weights(out: Path) -> dict[str, torch.Tensor]:
    state = checkpoint.load(out / "checkpoints" / "last.pt")
    assert state["step"] == 12 * 45
    return state["model"]


def _assert_matches(out: Path, reference: Path) -> None:
    mine, theirs = _final_weights(out), _final_weights(reference)
    for key in theirs:
        assert torch.equal(mine[key], theirs[key]), key
    assert _records(out) == _records(reference)
