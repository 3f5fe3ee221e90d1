"""gym: data: the spec, the bundle, the environments' seeds, normalisation, truncation,
the spaces refused, and Gymnasium missing (a real interpreter whose import fails)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from amptrain.data import DataOptions, GymOptions, build_data
from amptrain.data.gym import EVAL_SEED, RunningMeanStd, parse_spec

from .conftest import assert_data_error

pytest.importorskip("gymnasium")


def test_spec_options_are_typed_keywords_of_the_environment():
    assert parse_spec("CartPole-v1", "gym:CartPole-v1") == ("CartPole-v1", {})
    env_id, kwargs = parse_spec("Pendulum-v1,g=9.81,max_episode_steps=50,render_mode=rgb_array",
                                "gym:x")
    assert env_id == "Pendulum-v1"
    assert kwargs == {"g": 9.81, "max_episode_steps": 50, "render_mode": "rgb_array"}


def test_cartpole_bundle_is_the_rollout_and_the_evaluation_episodes():
    bundle = build_data("gym:CartPole-v1", DataOptions(gym=GymOptions(
        num_envs=2, rollout_steps=8, eval_episodes=3)))
    assert (bundle.num_classes, bundle.input_shape, bundle.kind, bundle.task) == \
        (2, (4,), "env-discrete", "ppo")
    assert bundle.train.tensors[0].tolist() == list(range(16))
    assert bundle.val.tensors[1].tolist() == [EVAL_SEED, EVAL_SEED + 1, EVAL_SEED + 2]
    assert bundle.val.tensors[0].shape == (3, 4)
    assert bundle.train.env is bundle.val.env and not bundle.train.env.normalise


def test_recipe_defaults_depend_on_the_action_space():
    discrete = build_data("gym:CartPole-v1").train.env
    continuous = build_data("gym:Pendulum-v1").train.env
    assert (discrete.num_envs, discrete.rollout_steps) == (4, 128)
    assert (continuous.num_envs, continuous.rollout_steps) == (1, 2048)
    assert continuous.normalise and not continuous.discrete and continuous.actions == 1
    assert continuous.to_env(np.array([[5.0]])).tolist() == [[2.0]]  # clipped to the bounds


def test_environments_are_seeded_from_the_seed_the_index_and_the_rank():
    envs = build_data("gym:CartPole-v1", DataOptions(seed=7, gym=GymOptions(num_envs=3))).train.env
    assert envs.stepper(rank=0, world=2).seeds == [7, 8, 9]
    assert envs.stepper(rank=1, world=2).seeds == [10, 11, 12]
    assert envs.stepper(rank=0, world=2, restart=1).seeds == [13, 14, 15]
    a, b = envs.stepper(0, 1), envs.stepper(0, 1)
    assert np.array_equal(a.obs, b.obs) and not np.array_equal(a.obs[0], a.obs[1])


def test_truncated_episodes_hand_back_their_final_observation():
    envs = build_data("gym:CartPole-v1,max_episode_steps=3",
                      DataOptions(gym=GymOptions(num_envs=2))).train.env
    stepper = envs.stepper(0, 1)
    for _ in range(3):
        obs, reward, ended, finals = stepper.step(np.array([0, 1]))
    assert ended.tolist() == [True, True] and sorted(finals) == [0, 1]
    assert reward.tolist() == [1.0, 1.0]
    assert not np.array_equal(finals[0], obs[0])  # the final one, not the next episode's
    assert stepper.take_finished() == [(3.0, 3), (3.0, 3)] and stepper.take_finished() == []


def test_continuous_rewards_are_scaled_by_the_running_return_std():
    envs = build_data("gym:Pendulum-v1", DataOptions(gym=GymOptions(num_envs=1))).train.env
    stepper = envs.stepper(0, 1)
    for _ in range(50):
        obs, reward, _, _ = stepper.step(np.zeros((1, 1)))
    assert abs(reward[0]) < abs(stepper.episode_return[0])  # learnt in a smaller scale
    assert np.all(np.abs(obs) <= 10.0) and envs.obs_stats.count > 50


def test_running_mean_std_matches_numpy():
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(300, 2))
    stats = RunningMeanStd((2,))
    for chunk in np.split(data, 6):
        stats.update(chunk)
    assert np.allclose(stats.mean, data.mean(0), atol=1e-4)
    assert np.allclose(stats.var, data.var(0), atol=1e-3)
    again = RunningMeanStd((2,))
    again.load(stats.state())
    assert np.array_equal(again.mean, stats.mean) and again.count == stats.count


@pytest.mark.parametrize("spec,match", [
    ("gym:NoSuchEnv-v0", "doesn't exist"),
    ("gym:Blackjack-v1", "observation space is Tuple"),
    ("gym:FrozenLake-v1", "observation space is Discrete"),
    ("gym:CartPole-v1,nonsense", "is not key=value"),
    ("gym:CartPole-v1,no_such_keyword=1", "no_such_keyword"),
    ("gym:", "name an environment"),
])
def test_bad_specs_are_one_line_naming_data(spec, match):
    assert_data_error(spec, match)


def test_gymnasium_missing_is_one_line_with_the_install_command(tmp_path: Path):
    shim = tmp_path / "shim" / "gymnasium"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('No module named gymnasium')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path / "shim"), os.environ.get("PYTHONPATH", ""), str(Path.cwd())])}
    result = subprocess.run([sys.executable, "-m", "amptrain", "train", "--data",
                             "gym:CartPole-v1", "--model", "actor-critic", "--out",
                             str(tmp_path / "run")], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("amptrain: error: --data gym:CartPole-v1")
    assert "pip install 'amptrain[rl]'" in lines[0]
    assert not (tmp_path / "run").exists()
