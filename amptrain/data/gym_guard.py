"""The one place a user's Gymnasium environment is called: every ``make``, ``reset`` and
``step`` of a ``gym:`` run goes through :class:`EnvGuard`.

An environment is the user's code, and it fails in the user's ways: a registration that
does not import, a missing optional dependency (pygame), ``max_episode_steps=0``, a
``reset`` or ``step`` that raises, the old Gym 4-tuple, observations of the wrong shape,
NaN or inf observations and rewards. Each becomes one line naming ``--data gym:...``, the
environment and what it did at which step (as ``module:`` data's errors do), never a
traceback from Gymnasium or torch, and never a "lower --lr" halt later for what is the
environment's fault.

The guard also owns how amptrain's actions map onto the environment's action space
(:func:`action_map`): a ``Discrete(n, start=k)`` space takes ``k..k+n-1``, so the policy's
index ``i`` is the environment's action ``k + i``. Every space amptrain accepts is mapped
exactly here, or refused by :func:`describe_spaces`.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..common.errors import UserError


def _said(exc: BaseException) -> str:
    """An exception as one line (its type and its message's first line)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def made(spec: str, env_id: str, build: Callable[[], Any]) -> Any:
    """``build()`` (``gym.make`` / ``gym.make_vec``), or one line naming ``--data`` for
    whatever making the user's environment raised (a registration that fails, an
    env module's import error, a missing optional dependency, bad keywords)."""
    try:
        return build()
    except UserError:
        raise
    except Exception as exc:  # the user's environment code: any error is theirs
        raise UserError(f"--data {spec}: making the environment {env_id} failed: "
                        f"{_said(exc)}") from None


def describe_spaces(env: Any, spec: str) -> dict[str, Any]:
    """The facts of an environment's spaces, or a UserError for spaces PPO cannot act in."""
    from gymnasium import spaces

    obs, act = env.observation_space, env.action_space
    if not isinstance(obs, spaces.Box):
        raise UserError(f"--data {spec}: the observation space is "
                        f"{type(obs).__name__}; amptrain's ppo takes Box observations only "
                        f"(flatten Dict/Tuple observations, e.g. with a wrapper, in your own "
                        f"registered environment)")
    if not obs.shape or 0 in obs.shape:
        raise UserError(f"--data {spec}: the environment's observation space has shape "
                        f"{tuple(obs.shape)}; amptrain's ppo needs at least one observed "
                        f"value (a Box of shape (n,) or larger): fix the environment")
    if isinstance(act, spaces.Discrete):
        if int(act.n) < 1:
            raise UserError(f"--data {spec}: the environment's Discrete action space has "
                            f"{int(act.n)} actions")
        return {"discrete": True, "actions": int(act.n), "start": int(act.start),
                "obs_shape": tuple(obs.shape)}
    if isinstance(act, spaces.Box) and len(act.shape) == 1:
        return {"discrete": False, "actions": int(act.shape[0]), "obs_shape": tuple(obs.shape),
                "low": np.asarray(act.low, dtype=np.float64),
                "high": np.asarray(act.high, dtype=np.float64)}
    raise UserError(f"--data {spec}: the action space is {type(act).__name__} "
                    f"{getattr(act, 'shape', '')}; amptrain's ppo acts in Discrete or 1-d "
                    f"Box action spaces")


def action_map(space: dict[str, Any]) -> Callable[[np.ndarray], np.ndarray]:
    """amptrain's actions -> the environment's: a discrete index plus the space's
    ``start``; a continuous action clipped to the bounds (CleanRL's ClipAction)."""
    if space["discrete"]:
        start = space.get("start", 0)
        return lambda actions: np.asarray(actions, dtype=np.int64) + start
    low, high = space["low"], space["high"]
    return lambda actions: np.clip(actions, low, high)


class EnvGuard:
    """One environment (or vector environment) of a run, called only through here."""

    def __init__(self, spec: str, env_id: str, env: Any, obs_shape: tuple[int, ...], *,
                 batch: int | None = None) -> None:
        self.spec, self.env_id, self.env = spec, env_id, env
        self.shape = obs_shape if batch is None else (batch, *obs_shape)
        self.steps = 0

    def _fail(self, what: str) -> UserError:
        return UserError(f"--data {self.spec}: the environment {self.env_id} {what}")

    def _obs(self, obs: Any, where: str) -> np.ndarray:
        try:
            array = np.asarray(obs, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise self._fail(f"returned an observation that is no array at {where} "
                             f"({_said(exc)})") from None
        if array.shape != self.shape:
            raise self._fail(f"returned observations of shape {array.shape} at {where}; its "
                             f"observation space says {self.shape}")
        if not np.isfinite(array).all():
            raise self._fail(f"returned a non-finite (NaN or inf) observation at {where}: "
                             f"the environment's values, not the training's")
        return array

    def reset(self, seed: Any) -> np.ndarray:
        """The first observations (checked)."""
        try:
            out = self.env.reset(seed=seed)
        except UserError:
            raise
        except Exception as exc:
            raise self._fail(f"raised in reset (seed {seed}): {_said(exc)}") from None
        if not (isinstance(out, tuple) and len(out) == 2):
            raise self._fail("returned no (observation, info) pair from reset (the old Gym "
                             "API; amptrain needs Gymnasium's)")
        return self._obs(out[0], "reset")

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Any]:
        """(observations, rewards, terminated, truncated, info), all checked."""
        self.steps += 1
        where = f"step {self.steps}"
        try:
            out = self.env.step(actions)
        except UserError:
            raise
        except Exception as exc:
            if "expected 5, got 4" in str(exc):  # Gymnasium's wrappers unpacking a 4-tuple
                raise self._fail(f"returned a 4-tuple from step at {where} (the old Gym "
                                 f"API); amptrain needs Gymnasium's (obs, reward, "
                                 f"terminated, truncated, info)") from None
            raise self._fail(f"raised at {where}: {_said(exc)}") from None
        if not (isinstance(out, tuple) and len(out) == 5):
            size = len(out) if isinstance(out, tuple) else type(out).__name__
            raise self._fail(f"returned a {size}-tuple from step at {where}; amptrain needs "
                             f"Gymnasium's (obs, reward, terminated, truncated, info) (a "
                             f"4-tuple is the old Gym API)")
        obs, reward, terminated, truncated, info = out
        try:
            reward = np.asarray(reward, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise self._fail(f"returned a reward that is no number at {where} "
                             f"({_said(exc)})") from None
        if not np.isfinite(reward).all():
            raise self._fail(f"returned a non-finite (NaN or inf) reward at {where}: the "
                             f"environment's value, not the training's")
        return (self._obs(obs, where), reward, np.asarray(terminated, dtype=bool),
                np.asarray(truncated, dtype=bool), info)

    def final(self, obs: Any) -> np.ndarray:
        """A truncated episode's final observation (checked: it is bootstrapped from)."""
        array = np.asarray(obs, dtype=np.float64)
        if not np.isfinite(array).all():
            raise self._fail(f"returned a non-finite (NaN or inf) final observation at "
                             f"step {self.steps}: the environment's values, not the "
                             f"training's")
        return array

    def close(self) -> None:
        try:
            self.env.close()
        except Exception:  # noqa: S110  (closing a failed environment must not hide its error)
            pass


__all__ = ["EnvGuard", "action_map", "describe_spaces", "made"]
