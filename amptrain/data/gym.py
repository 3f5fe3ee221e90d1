"""``gym:ENV_ID[,key=value,...]``: a Gymnasium environment as a run's data.

An environment has no samples on disk: what a reinforcement-learning run trains on is its
rollouts. The data source therefore owns the environments and says what a rollout is:

* the **training split** is :class:`RolloutSlots`, one index per transition of a rollout
  (``num_envs x rollout_steps`` per process, times the processes). The Trainer shuffles
  and cuts these indices into minibatches as it cuts any dataset (seeded by ``--seed`` and
  the epoch), so one Trainer epoch is one pass over a rollout; the task
  (:mod:`amptrain.tasks.ppo`) fills the rollout and reads each minibatch's transitions;
* the **validation split** is :class:`EvalEpisodes`: one sample per evaluation episode,
  its start observation and its seed (fixed seeds from :data:`EVAL_SEED`, so every
  evaluation and ``amptrain eval`` later play the same episodes).

Both carry the :class:`GymEnvs` that makes the environments. Environment ``i`` of process
``rank`` is seeded ``--seed + rank * num_envs + i`` (CleanRL's ``seed + i`` on one
process; disjoint between processes). The vector environment resets an episode in the
same step that ends it (Gymnasium's ``SAME_STEP`` autoreset), handing the final
observation of a truncated episode to the task, which bootstraps its value.

Observation and reward normalisation follow CleanRL's ``ppo_continuous_action.py``
(running mean/variance of observations, rewards scaled by the running standard deviation
of the discounted return, both clipped to +-10), for continuous actions only, as that
recipe does; the discrete recipe (``ppo.py``) normalises nothing. Unlike Gymnasium's
per-environment wrappers, one set of statistics serves all of a process's environments.

This module never imports the tasks: it knows environments, not learning.
"""
from __future__ import annotations

import ast
import logging
from typing import Any

import numpy as np
import torch

from ..common.errors import UserError
from .core import DataBundle, DataOptions, TensorData, register
from .gym_guard import EnvGuard, action_map, describe_spaces, made
from .gym_options import DEFAULT_EVAL_EPISODES, VECTOR_MODES, check_eval_episodes

log = logging.getLogger("amptrain")

#: Seed of evaluation episode k: EVAL_SEED + k (fixed, not --seed, like the split seed).
EVAL_SEED = 1_000_000
#: CleanRL's clip of normalised observations and rewards.
NORM_CLIP = 10.0
#: The recipes' rollout shapes: (environments, steps per environment per rollout).
#: CleanRL ppo.py (discrete) and ppo_continuous_action.py (continuous).
DEFAULT_ROLLOUT = {"discrete": (4, 128), "continuous": (1, 2048)}
#: The longest evaluation episode played: environments without a time limit are cut
#: there (said when the data is built; the task counts cut episodes).
EVAL_EPISODE_CAP = 10_000
#: Bytes of device memory one rollout may take at most, as a share of the host's memory.
ROLLOUT_MEMORY_SHARE = 0.5
INSTALL = "pip install 'amptrain[rl]' (or pip install gymnasium)"


def import_gymnasium(spec: str) -> Any:
    """Gymnasium, or a UserError naming ``--data`` with the install command."""
    try:
        import gymnasium
    except ImportError:
        raise UserError(f"--data {spec} needs Gymnasium, which is not installed: "
                        f"{INSTALL}") from None
    return gymnasium


def _value(raw: str) -> Any:
    """An option's value: a Python literal (number, True/False, None) or else a string."""
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return {"true": True, "false": False}.get(raw.lower(), raw)


def parse_spec(argument: str, spec: str) -> tuple[str, dict[str, Any]]:
    """``ENV_ID[,key=value,...]`` -> (environment id, keyword arguments of ``gym.make``)."""
    env_id, *items = argument.split(",")
    if not env_id:
        raise UserError(f"--data {spec}: name an environment, e.g. "
                        f"--data gym:CartPole-v1")
    kwargs = {}
    for item in items:
        key, eq, raw = item.partition("=")
        if not eq or not key.isidentifier():
            raise UserError(f"--data {spec}: {item!r} is not key=value (keyword "
                            f"arguments of the environment)")
        kwargs[key] = _value(raw)
    return env_id, kwargs


class RunningMeanStd:
    """Running mean and variance (Chan et al.'s parallel update, float64), as CleanRL's
    normalisation wrappers keep them; its state is JSON-able (the task's checkpoint state)."""

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.mean = np.zeros(shape, dtype=np.float64)
        self.var = np.ones(shape, dtype=np.float64)
        self.count = 1e-4

    def update(self, batch: np.ndarray) -> None:
        batch_mean, batch_var, n = batch.mean(axis=0), batch.var(axis=0), batch.shape[0]
        delta, total = batch_mean - self.mean, self.count + n
        self.mean = self.mean + delta * n / total
        m2 = self.var * self.count + batch_var * n + delta ** 2 * self.count * n / total
        self.var, self.count = m2 / total, total

    def state(self) -> dict[str, Any]:
        return {"mean": np.asarray(self.mean).tolist(), "var": np.asarray(self.var).tolist(),
                "count": float(self.count)}

    def load(self, state: dict[str, Any]) -> None:
        self.mean = np.asarray(state["mean"], dtype=np.float64)
        self.var = np.asarray(state["var"], dtype=np.float64)
        self.count = float(state["count"])


class GymEnvs:
    """What makes a run's environments: the id and keywords, the vector shape, whether
    actions are discrete, the action bounds and the observation normaliser's statistics."""

    def __init__(self, spec: str, env_id: str, kwargs: dict[str, Any], *, num_envs: int,
                 rollout_steps: int, vector: str, space: dict[str, Any], seed: int = 0) -> None:
        self.spec, self.env_id, self.kwargs, self.seed = spec, env_id, kwargs, seed
        self.num_envs, self.rollout_steps, self.vector = num_envs, rollout_steps, vector
        self.discrete: bool = space["discrete"]
        self.actions: int = space["actions"]            # count, or the action vector's size
        self.obs_shape: tuple[int, ...] = space["obs_shape"]
        self.low, self.high = space.get("low"), space.get("high")
        #: amptrain's actions -> the environment's (Discrete's start, Box's bounds).
        self._to_env = action_map(space)
        #: CleanRL normalises for continuous control only.
        self.normalise = not self.discrete
        self.obs_stats = RunningMeanStd(self.obs_shape)
        #: The running discounted return's statistics (the reward scale learnt from).
        self.reward_stats = RunningMeanStd()
        #: The discount of the reward normaliser's running return (the task sets its own).
        self.gamma = 0.99

    @property
    def rollout_size(self) -> int:
        """Transitions in one process's rollout."""
        return self.num_envs * self.rollout_steps

    def make(self, **extra: Any) -> EnvGuard:
        """One environment (evaluation), called through its guard (data/gym_guard.py)."""
        gym = import_gymnasium(self.spec)
        env = made(self.spec, self.env_id,
                   lambda: gym.make(self.env_id, **self.kwargs, **extra))
        return EnvGuard(self.spec, self.env_id, env, self.obs_shape)

    def normalised(self, obs: np.ndarray, update: bool) -> np.ndarray:
        """Observations as the policy sees them (``update``: learn from them first)."""
        if not self.normalise:
            return obs
        if update:
            self.obs_stats.update(obs)
        out = (obs - self.obs_stats.mean) / np.sqrt(self.obs_stats.var + 1e-8)
        return np.clip(out, -NORM_CLIP, NORM_CLIP)

    def reward_scale(self) -> float:
        """What rewards are divided by for learning (1 without normalisation)."""
        return float(np.sqrt(self.reward_stats.var + 1e-8)) if self.normalise else 1.0

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        """Actions as the environment takes them: a discrete index plus the space's
        ``start``, continuous ones clipped to its bounds (as CleanRL's ClipAction; the
        rollout keeps the unclipped sample)."""
        return self._to_env(actions)

    def stepper(self, rank: int, world: int, restart: int = 0) -> EnvStepper:
        """This process's vector environment, reset with its seeds (``restart``: the
        number of rollouts done before, for a resumed run: fresh but reproducible seeds)."""
        gym = import_gymnasium(self.spec)
        from gymnasium.vector import AutoresetMode

        mode = "async" if self.vector == "async" else "sync"
        envs = made(self.spec, self.env_id, lambda: gym.make_vec(
            self.env_id, num_envs=self.num_envs, vectorization_mode=mode,
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP}, **self.kwargs))
        guarded = EnvGuard(self.spec, self.env_id, envs, self.obs_shape, batch=self.num_envs)
        first = self.seed + rank * self.num_envs + restart * self.num_envs * world
        try:
            return EnvStepper(self, guarded, [first + i for i in range(self.num_envs)])
        except BaseException:
            guarded.close()
            raise


class EnvStepper:
    """A process's running environments: raw episode statistics, normalised observations
    and rewards for learning, the final observation of truncated episodes."""

    def __init__(self, source: GymEnvs, envs: EnvGuard, seeds: list[int]) -> None:
        self.source, self.envs, self.seeds = source, envs, seeds
        obs = envs.reset(seed=seeds)
        self.obs = source.normalised(obs, update=True)
        n = source.num_envs
        self.episode_return = np.zeros(n)
        self.episode_length = np.zeros(n, dtype=np.int64)
        self.discounted = np.zeros(n)
        self.finished: list[tuple[float, int]] = []   # (return, length), since last read

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                 dict[int, np.ndarray]]:
        """One step of every environment: (next observations, rewards for learning,
        episode ended, {env: final observation} of truncated episodes)."""
        source = self.source
        obs, reward, terminated, truncated, info = self.envs.step(source.to_env(actions))
        ended = np.logical_or(terminated, truncated)
        self.episode_return += reward
        self.episode_length += 1
        learn = reward
        if source.normalise:  # CleanRL's NormalizeReward: scale by the return's std
            self.discounted = self.discounted * source.gamma + reward
            source.reward_stats.update(self.discounted)
            learn = np.clip(reward / source.reward_scale(), -NORM_CLIP, NORM_CLIP)
            self.discounted[ended] = 0.0
        finals: dict[int, np.ndarray] = {}
        for i in np.flatnonzero(ended):
            self.finished.append((float(self.episode_return[i]), int(self.episode_length[i])))
            self.episode_return[i], self.episode_length[i] = 0.0, 0
            if truncated[i] and not terminated[i]:
                final = self.envs.final(info["final_obs"][i])[None]
                finals[int(i)] = source.normalised(final, update=False)[0]
        self.obs = source.normalised(obs, update=True)
        return self.obs, learn, ended, finals

    def take_finished(self) -> list[tuple[float, int]]:
        """Episodes finished since the last call: (raw return, length)."""
        done, self.finished = self.finished, []
        return done

    def close(self) -> None:
        self.envs.close()


class RolloutSlots(TensorData):
    """The training split: indices of a rollout's transitions (module docstring)."""

    #: What ``--task auto`` trains on it.
    task = "ppo"

    def __init__(self, envs: GymEnvs, slots: torch.Tensor) -> None:
        super().__init__(slots)
        self.env = envs

    def to(self, device: torch.device) -> RolloutSlots:
        return RolloutSlots(self.env, self.tensors[0].to(device))


class EvalEpisodes(TensorData):
    """The validation split: one evaluation episode per sample (start observation, seed)."""

    def __init__(self, envs: GymEnvs, obs: torch.Tensor, seeds: torch.Tensor) -> None:
        super().__init__(obs, seeds)
        self.env = envs

    def to(self, device: torch.device) -> EvalEpisodes:
        return EvalEpisodes(self.env, *(t.to(device) for t in self.tensors))


def _available_memory() -> int:
    """The host's physical memory in bytes (the rollout's bound)."""
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1 << 40


def check_rollout_memory(envs: GymEnvs) -> None:
    """Refuse a rollout (``--num-envs x --rollout-steps``) whose buffers would need more
    than :data:`ROLLOUT_MEMORY_SHARE` of the memory, before anything is allocated."""
    per = int(np.prod(envs.obs_shape)) + (1 if envs.discrete else envs.actions) + 6
    need = envs.rollout_size * per * 8  # fp32 buffers, the host's float64 rewards, twice
    room = int(_available_memory() * ROLLOUT_MEMORY_SHARE)
    if need > room:
        raise UserError(f"--rollout-steps {envs.rollout_steps} x --num-envs {envs.num_envs}: "
                        f"the rollout would need about {need / 2**30:.1f} GiB, more than "
                        f"{room / 2**30:.1f} GiB (half this machine's memory); lower "
                        f"--rollout-steps")


def process_world() -> tuple[int, int]:
    """(rank, world size) while data is built, before the run's strategy exists: the
    rollout's slots cover every process's environments. A running step asks its loop."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@register("gym")
def gym_data(argument: str, options: DataOptions) -> DataBundle:
    """``gym:ENV_ID[,key=value,...]`` (module docstring)."""
    spec = f"gym:{argument}"
    gym = import_gymnasium(spec)
    env_id, kwargs = parse_spec(argument, spec)
    env = made(spec, env_id, lambda: gym.make(env_id, **kwargs))
    try:
        space = describe_spaces(env, spec)
        kind = "discrete" if space["discrete"] else "continuous"
        num_envs, steps = DEFAULT_ROLLOUT[kind]
        chosen = options.gym
        vector = chosen.vector_env or "sync"
        if vector not in VECTOR_MODES:
            raise UserError(f"--vector-env must be one of {', '.join(VECTOR_MODES)} "
                            f"(got {vector!r})")
        envs = GymEnvs(spec, env_id, kwargs, num_envs=chosen.num_envs or num_envs,
                       rollout_steps=chosen.rollout_steps or steps, vector=vector,
                       space=space, seed=options.seed)
        episodes = chosen.eval_episodes or DEFAULT_EVAL_EPISODES
        check_eval_episodes(episodes, "--eval-episodes")  # (a caller of build_data's)
        check_rollout_memory(envs)
        if getattr(getattr(env, "spec", None), "max_episode_steps", 1) is None:
            log.warning("--data %s: the environment has no time limit: each evaluation "
                        "episode is cut at %d steps and counted as cut (give it one: "
                        "%s,max_episode_steps=N)", spec, EVAL_EPISODE_CAP, spec)
        seeds = torch.arange(EVAL_SEED, EVAL_SEED + episodes)
        guard = EnvGuard(spec, env_id, env, space["obs_shape"])
        starts = [guard.reset(seed=int(s)).astype(np.float32) for s in seeds]
        env.action_space.seed(int(seeds[0]))
        guard.step(env.action_space.sample())  # one step: a broken step() fails up front
    finally:
        env.close()
    _, world = process_world()
    train = RolloutSlots(envs, torch.arange(envs.rollout_size * world))
    val = EvalEpisodes(envs, torch.from_numpy(np.stack(starts)), seeds)
    return DataBundle(train, val, num_classes=space["actions"],
                      input_shape=tuple(space["obs_shape"]), kind=f"env-{kind}", task="ppo",
                      class_names=[])


__all__ = ["DEFAULT_ROLLOUT", "EVAL_SEED", "EnvStepper", "EvalEpisodes", "GymEnvs",
           "RolloutSlots", "RunningMeanStd", "gym_data", "parse_spec"]
