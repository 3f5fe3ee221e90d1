"""The options of ``gym:`` data (:mod:`.gym`), declared once beside it: the environments a
rollout is collected from and the evaluation episodes, with their checks and the data
they apply to. The defaults not written here are the recipe's, decided by the source
(:data:`.gym.DEFAULT_ROLLOUT`). Torch-free: the command line's parser is built from it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..common.errors import UserError, flag
from ..common.options import option, require_positive
from .scope import DataScope

#: The vector environments --vector-env names.
VECTOR_MODES = ("sync", "async")
DEFAULT_EVAL_EPISODES = 10
#: The most evaluation episodes a run plays (--eval-episodes, eval --episodes): each is
#: reset up front, then played one after another on the host. RL papers report 10 to 100;
#: 10,000 puts a mean return's standard error at 1 % of the returns' standard deviation.
MAX_EVAL_EPISODES = 10_000
#: Reinforcement learning's options (gym: data's and the ppo task's) apply to gym: data.
RL_SCOPE = DataScope("reinforcement learning on gym: data", ("gym:",))


def check_eval_episodes(episodes: int | None, shown: str) -> None:
    """Refuse more than :data:`MAX_EVAL_EPISODES` episodes, naming the option as
    ``shown`` (``--eval-episodes``, ``--episodes``), before anything is built."""
    if episodes is not None and episodes > MAX_EVAL_EPISODES:
        raise UserError(f"{shown} {episodes} is more than the {MAX_EVAL_EPISODES} "
                        f"evaluation episodes amptrain plays (each is reset up front)")


# Defaults: CleanRL's ppo.py for discrete actions, ppo_continuous_action.py for continuous
# ones; None leaves the choice to the source's recipe.
@dataclass
class GymOptions:
    """gym: data's options: its environments and evaluation episodes, checked when built."""

    SCOPE: ClassVar[DataScope] = RL_SCOPE

    num_envs: int | None = option(None, "gym: data: environments per process (CleanRL: 4 "
                                        "discrete, 1 continuous)", kind=int, group="rl")
    rollout_steps: int | None = option(None, "gym: data: steps per environment in a rollout "
                                             "(CleanRL: 128 discrete, 2048 continuous)",
                                       kind=int, group="rl")
    vector_env: str | None = option(None, "gym: data: sync (one process, the default) or "
                                          "async (a subprocess per environment)", kind=str,
                                    group="rl", choices=VECTOR_MODES)
    eval_episodes: int | None = option(None, f"gym: data: deterministic episodes per "
                                             f"evaluation (default {DEFAULT_EVAL_EPISODES})",
                                       kind=int, group="rl")

    def __post_init__(self) -> None:
        require_positive(self, "num_envs", "rollout_steps", "eval_episodes", optional=True)
        check_eval_episodes(self.eval_episodes, flag("eval_episodes"))
