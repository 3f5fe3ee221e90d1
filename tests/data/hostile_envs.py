"""Gymnasium environments that misbehave as users' environments do, made by id
``tests.data.hostile_envs:NAME-v0`` (Gymnasium imports this module, which registers them).

Each is tiny (2 observed values, a few steps) so a run on it takes well under a second.
"""
from __future__ import annotations

import os
import signal
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class Tiny(gym.Env):
    """2 observed values, 3 actions; an episode ends after 8 steps. ``bad_step``: the step
    at which :meth:`misbehave` decides what ``step`` returns."""

    bad_step = 10**9

    def __init__(self, **_: Any) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(3)
        self.t = 0
        self.taken: list[int] = []

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action: Any) -> Any:
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is outside {self.action_space}")
        self.t += 1
        self.taken.append(int(action))
        out = (np.full(2, 0.1 * self.t, np.float32), 1.0, self.t >= 8, False, {})
        return self.misbehave(out) if self.t >= self.bad_step else out

    def misbehave(self, out: Any) -> Any:
        return out


class StartAt5(Tiny):
    """Discrete(3, start=5): only actions 5, 6, 7 are valid (checked by Tiny.step)."""

    def __init__(self, **_: Any) -> None:
        super().__init__()
        self.action_space = spaces.Discrete(3, start=5)


class NanObs(Tiny):
    bad_step = 3

    def misbehave(self, out: Any) -> Any:
        return (np.full(2, np.nan, np.float32), *out[1:])


class InfReward(Tiny):
    bad_step = 2

    def misbehave(self, out: Any) -> Any:
        return (out[0], float("inf"), *out[2:])


class StepRaises(Tiny):
    bad_step = 2

    def misbehave(self, out: Any) -> Any:
        raise RuntimeError("the simulator lost its connection")


class ResetRaises(Tiny):
    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        raise OSError("no such map file")


class OldApi(Tiny):
    bad_step = 1

    def misbehave(self, out: Any) -> Any:
        return (out[0], out[1], out[2], {})


class WrongShape(Tiny):
    bad_step = 2

    def misbehave(self, out: Any) -> Any:
        return (np.zeros(5, np.float32), *out[1:])


class ZeroD(Tiny):
    def __init__(self, **_: Any) -> None:
        super().__init__()
        self.observation_space = spaces.Box(-1.0, 1.0, (), np.float32)


class Endless(Tiny):
    """Never ends an episode (registered without a time limit)."""

    def step(self, action: Any) -> Any:
        obs, reward, _, truncated, info = super().step(action)
        return obs, reward, False, truncated, info


class SignalsInEval(Tiny):
    """Sends its own process SIGTERM when the second evaluation episode starts to be
    played (its second reset with that episode's seed: the first is made up front when
    the data is built)."""

    starts = 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        if seed == 1_000_001:  # data/gym.py EVAL_SEED + 1
            type(self).starts += 1
            if type(self).starts == 2:
                os.kill(os.getpid(), signal.SIGTERM)
        return super().reset(seed=seed, options=options)


class NeedsPygame(Tiny):
    def __init__(self, **_: Any) -> None:
        raise gym.error.DependencyNotInstalled(
            'pygame is not installed, run `pip install "gymnasium[classic-control]"`')


for _name in ("StartAt5", "NanObs", "InfReward", "StepRaises", "ResetRaises", "OldApi",
              "WrongShape", "ZeroD", "NeedsPygame", "SignalsInEval"):
    gym.register(f"{_name}-v0", entry_point=f"{__name__}:{_name}", max_episode_steps=50,
                 disable_env_checker=True)
gym.register("Endless-v0", entry_point=f"{__name__}:Endless", disable_env_checker=True)
gym.register("Unimportable-v0", entry_point="tests.data.no_such_module:Env")
