"""The ``ppo`` task's evaluation: deterministic episodes (the policy's most likely action,
or the Gaussian's mean), all the episodes of a validation batch played side by side.

Each episode has its own environment, reset from its own seed, so an episode's actions
and return do not depend on which others share its batch; the policy is asked once per
step for every episode still running (one forward of a few rows instead of one per
episode and step: on a CPU the per-call cost of a small model's forward dominates an
evaluation). A forward of several rows may round differently in the last bits from a
forward of one row, so a value or a near-tie of two actions may differ from one episode
played alone at that level.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..data.gym import EVAL_EPISODE_CAP

#: The longest evaluation episode played (environments without a time limit): said up
#: front when the environment has none (data/gym.py), and each episode cut at it is
#: counted (``episodes_cut``), never reported as an ordinary return.
MAX_EPISODE_STEPS = EVAL_EPISODE_CAP


@dataclass
class Episode:
    """One evaluation episode: its return, its length, the squared error of the critic's
    value of its start against the discounted return it learnt, and whether it was cut
    at :data:`MAX_EPISODE_STEPS`."""

    total: float = 0.0
    length: int = 0
    discounted: float = 0.0
    discount: float = 1.0
    start_value: float | None = None
    cut: bool = False

    @property
    def value_error(self) -> float:
        return (float(self.start_value or 0.0) - self.discounted) ** 2


def play_episodes(env: Any, model: Any, seeds: Sequence[int], device: torch.device, *,
                  gamma: float, stopping: Callable[[], bool] = lambda: False
                  ) -> list[Episode]:
    """Play one deterministic episode of ``env`` (the run's :class:`~amptrain.data.gym`
    environment) from each of ``seeds`` with ``model`` (``obs -> (action head, value)``),
    side by side. ``stopping()`` is asked between steps: True ends the evaluation (the
    caller's :class:`~amptrain.tasks.base.EvaluationStopped`) -- the episodes played so
    far are returned with the unfinished ones dropped."""
    games = [env.make() for _ in seeds]
    episodes = [Episode() for _ in seeds]
    try:
        observations = [game.reset(seed=int(seed)) for game, seed in zip(games, seeds)]
        running = list(range(len(games)))
        scale = env.reward_scale()
        while running:
            if stopping():
                return [episodes[i] for i in range(len(games)) if i not in running]
            seen = env.normalised(np.stack([observations[i] for i in running]), update=False)
            head, value = model(torch.as_tensor(seen, dtype=torch.float32, device=device))
            head = head.float()
            if env.discrete:
                actions: list[Any] = head.argmax(dim=1).tolist()
            else:
                actions = list(head.cpu().numpy())
            values = value.float().reshape(-1).tolist()
            still = []
            for row, i in enumerate(running):
                episode = episodes[i]
                episode.length += 1
                if episode.start_value is None:
                    episode.start_value = values[row]
                # The environment's own action (Discrete's start, Box's bounds).
                taken = env.to_env(np.asarray(actions[row]))
                observations[i], reward, terminated, truncated, _ = games[i].step(
                    int(taken) if env.discrete else taken)
                episode.total += float(reward)
                episode.discounted += episode.discount * float(reward) / scale
                episode.discount *= gamma
                if terminated or truncated:
                    continue
                if episode.length >= MAX_EPISODE_STEPS:
                    episode.cut = True
                    continue
                still.append(i)
            running = still
    finally:
        for game in games:
            game.close()
    return episodes


__all__ = ["Episode", "MAX_EPISODE_STEPS", "play_episodes"]
