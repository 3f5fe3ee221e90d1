"""Issue 48: a user's environment that misbehaves (tests/data/hostile_envs.py), wrapped once
by data/gym_guard.py: exact action mapping, one line naming --data for each failure, no
environment wait left unbounded."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from amptrain.common.errors import UserError
from amptrain.data import DataOptions, GymOptions, build_data
from amptrain.models.actor_critic import ActorCritic
from amptrain.tasks import ppo_eval
from amptrain.tasks.ppo import PpoTask
from amptrain.trainer import Trainer

from tests.commands.helpers import REPO

from .conftest import assert_data_error

pytest.importorskip("gymnasium")

HOSTILE = "gym:tests.data.hostile_envs:"
SMALL = DataOptions(seed=0, gym=GymOptions(num_envs=2, rollout_steps=8, eval_episodes=2))


def _fit(name: str, steps: int = 4, **options):
    data = build_data(HOSTILE + name, SMALL)
    env = data.train.env
    torch.manual_seed(0)
    model = ActorCritic(2, env.actions, continuous=False)
    trainer = Trainer(max_steps=steps, batch_size=8, scheduler="none", no_progress=True,
                      logger="none", **options)
    before = [p.detach().clone() for p in model.parameters()]
    task = PpoTask(minibatches=2, update_epochs=1)
    return trainer, model, data, task, before


def _fit_error(name: str, match: str) -> None:
    trainer, model, data, task, before = _fit(name)
    with pytest.raises(UserError, match=match) as caught:
        trainer.fit(model, data.train, data.val, task=task)
    message = str(caught.value)
    assert "\n" not in message and f"--data {HOSTILE}{name}" in message
    assert "--lr" not in message
    assert task.stepper is None  # the environments were closed with the failed run


@pytest.mark.timeout(60)
def test_discrete_space_with_a_start_gets_its_own_actions():
    # Discrete(3, start=5): Tiny.step raises for anything but 5, 6, 7 (on 9d432d4: 0..2).
    trainer, model, data, task, _ = _fit("StartAt5-v0")
    assert data.train.env.to_env(np.array([0, 1, 2])).tolist() == [5, 6, 7]
    result = trainer.fit(model, data.train, data.val, task=task)
    assert result.steps == 4 and np.isfinite(result.val_metrics["return"])


@pytest.mark.parametrize("name,match", [
    ("NanObs-v0", "returned a non-finite .NaN or inf. observation at step 3"),
    ("InfReward-v0", "returned a non-finite .NaN or inf. reward at step 2"),
    ("StepRaises-v0", "raised at step 2: RuntimeError: the simulator lost its connection"),
    # The vector environment stacks observations: the wrong shape fails there.
    ("WrongShape-v0", "raised at step 2: ValueError: Output array is the wrong shape"),
])
@pytest.mark.timeout(60)
def test_an_environment_failing_mid_run_is_one_line_naming_data(name, match):
    _fit_error(name, match)


@pytest.mark.parametrize("spec,match", [
    (HOSTILE + "ResetRaises-v0", "raised in reset .seed 1000000.: OSError: no such map file"),
    (HOSTILE + "OldApi-v0", "returned a 4-tuple from step at step 1 .the old Gym API."),
    (HOSTILE + "ZeroD-v0", r"observation space has shape \(\); amptrain's ppo needs at "
                           r"least one observed value"),
    (HOSTILE + "NeedsPygame-v0", "failed: DependencyNotInstalled: pygame is not installed"),
    (HOSTILE + "Unimportable-v0", "failed: ModuleNotFoundError: No module named "
                                  "'tests.data.no_such_module'"),
    ("gym:tests.data.no_such_module:X-v0", "failed: ModuleNotFoundError"),
    ("gym:CartPole-v1,max_episode_steps=0", "Expect the `max_episode_steps` to be positive"),
    ("gym:CartPole-v1,max_episode_steps=-3", "Expect the `max_episode_steps` to be positive"),
])
def test_an_environment_that_cannot_start_is_one_line_naming_data(spec, match):
    assert_data_error(spec, match, SMALL)


def test_eval_episodes_and_rollout_are_bounded_before_anything_is_made():
    # The episodes: refused where the option is declared, before the data is built.
    with pytest.raises(UserError, match="^eval_episodes 1000000 is more than the 10000"):
        GymOptions(eval_episodes=1_000_000)
    with pytest.raises(UserError, match=r"--rollout-steps 2000000000 x --num-envs 4: the "
                                        r"rollout would need about .* GiB, more than"):
        build_data("gym:CartPole-v1", DataOptions(gym=GymOptions(rollout_steps=2_000_000_000)))


@pytest.mark.timeout(60)
def test_an_environment_without_a_time_limit_is_cut_and_said_so(monkeypatch, caplog):
    monkeypatch.setattr(ppo_eval, "MAX_EPISODE_STEPS", 30)
    with caplog.at_level("WARNING", logger="amptrain"):
        trainer, model, data, task, _ = _fit("Endless-v0")
        assert "has no time limit: each evaluation episode is cut" in caplog.text
        trainer.fit(model, data.train, data.val, task=task)
        result = trainer.evaluate()
    assert result.details["episodes_cut"] == 2 and result.details["lengths"] == [30.0, 30.0]
    assert "2 of 2 evaluation episodes were cut at 30 steps" in caplog.text
    assert task.reports.report(result)["episodes_cut"] == 2


# ------------------------------------------------------------------ hangs (async)
def _async_run(out, env_steps: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
           "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "amptrain", "train", "--data", "gym:CartPole-v1",
         "--vector-env", "async", "--env-steps", str(env_steps), "--num-envs", "2",
         "--rollout-steps", "16", "--eval-episodes", "1", "--out", str(out),
         "--no-progress", "--logger", "none", "--log-every", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float) -> str:
    """The run's output (stdout and stderr) once it exits."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:  # the hang this guards against: kill its workers too
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_async_run_exits_after_its_outputs(tmp_path):
    # On 9d432d4 the forked workers kept amptrain's SIGTERM handler: printed outputs:,
    # then never exited.
    proc = _async_run(tmp_path / "run", 64)
    out = _finish(proc, 90)
    assert proc.returncode == 0, out
    assert "outputs:" in out and "SIGTERM" not in out


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigterm_to_an_async_run_checkpoints_and_exits(tmp_path):
    proc = _async_run(tmp_path / "run", 100_000)
    assert proc.stdout is not None
    started = False
    for line in proc.stdout:  # training has begun (its first log line)
        if line.startswith("epoch"):
            started = True
            break
    assert started
    proc.send_signal(signal.SIGTERM)
    out = _finish(proc, 90)
    assert proc.returncode == 143, out
    assert "checkpoint" in out and (tmp_path / "run" / "checkpoints" / "last.pt").is_file()


# ------------------------------------------------------ messages that point the right way
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_resume_with_another_num_envs_names_num_envs(tmp_path):
    from tests.test_cli import run_in_process

    args = ["train", "--data", "gym:CartPole-v1", "--env-steps", "64", "--rollout-steps",
            "16", "--eval-episodes", "1", "--out", str(tmp_path / "run"), "--no-progress",
            "--logger", "none"]
    assert run_in_process([*args, "--num-envs", "2"], tmp_path).returncode == 0
    checkpoint = (tmp_path / "run" / "checkpoints" / "last.pt").read_bytes()
    again = run_in_process([*args, "--num-envs", "4", "--resume", "auto"], tmp_path)
    lines = again.stderr.strip().splitlines()
    assert again.returncode == 2 and len(lines) == 1, again.stderr
    assert "--num-envs 4 differs from checkpoint" in lines[0] and "--batch-size" not in lines[0]
    assert (tmp_path / "run" / "checkpoints" / "last.pt").read_bytes() == checkpoint
