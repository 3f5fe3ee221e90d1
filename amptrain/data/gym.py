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
from typing import Any

import numpy as np
import torch

from ..common.errors import UserError
from .core import DataBundle, DataOptions, TensorData, register

#: Seed of evaluation episode k: EVAL_SEED + k (fixed, not --seed, like the split seed).
EVAL_SEED = 1_000_000
#: CleanRL's clip of normalised observations and rewards.
NORM_CLIP = 10.0
#: The recipes' rollout shapes: (environments, steps per environment per rollout).
#: CleanRL ppo.py (discrete) and ppo_continuous_action.py (continuous).
DEFAULT_ROLLOUT = {"discrete": (4, 128), "continuous": (1, 2048)}
DEFAULT_EVAL_EPISODES = 10
VECTOR_MODES = ("sync", "async")
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

    def make(self, **extra: Any) -> Any:
        """One environment (evaluation)."""
        gym = import_gymnasium(self.spec)
        return gym.make(self.env_id, **self.kwargs, **extra)

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
        """Actions as the environment takes them (continuous ones clipped to its bounds,
        as CleanRL's ClipAction; the rollout keeps the unclipped sample)."""
        return actions if self.discrete else np.clip(actions, self.low, self.high)

    def stepper(self, rank: int, world: int, restart: int = 0) -> EnvStepper:
        """This process's vector environment, reset with its seeds (``restart``: the
        number of rollouts done before, for a resumed run: fresh but reproducible seeds)."""
        gym = import_gymnasium(self.spec)
        from gymnasium.vector import AutoresetMode

        mode = "async" if self.vector == "async" else "sync"
        envs = gym.make_vec(self.env_id, num_envs=self.num_envs, vectorization_mode=mode,
                            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
                            **self.kwargs)
        first = self.seed + rank * self.num_envs + restart * self.num_envs * world
        return EnvStepper(self, envs, [first + i for i in range(self.num_envs)])


class EnvStepper:
    """A process's running environments: raw episode statistics, normalised observations
    and rewards for learning, the final observation of truncated episodes."""

    def __init__(self, source: GymEnvs, envs: Any, seeds: list[int]) -> None:
        self.source, self.envs, self.seeds = source, envs, seeds
        obs, _ = envs.reset(seed=seeds)
        self.obs = source.normalised(np.asarray(obs, dtype=np.float64), update=True)
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
        reward = np.asarray(reward, dtype=np.float64)
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
                final = np.asarray(info["final_obs"][i], dtype=np.float64)[None]
                finals[int(i)] = source.normalised(final, update=False)[0]
        self.obs = source.normalised(np.asarray(obs, dtype=np.float64), update=True)
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


def describe_spaces(env: Any, spec: str) -> dict[str, Any]:
    """The facts of an environment's spaces, or a UserError for spaces PPO cannot act in."""
    from gymnasium import spaces

    obs, act = env.observation_space, env.action_space
    if not isinstance(obs, spaces.Box):
        raise UserError(f"--data {spec}: the observation space is "
                        f"{type(obs).__name__}; amptrain's ppo takes Box observations only "
                        f"(flatten Dict/Tuple observations, e.g. with a wrapper, in your own "
                        f"registered environment)")
    if isinstance(act, spaces.Discrete):
        return {"discrete": True, "actions": int(act.n), "obs_shape": tuple(obs.shape)}
    if isinstance(act, spaces.Box) and len(act.shape) == 1:
        return {"discrete": False, "actions": int(act.shape[0]), "obs_shape": tuple(obs.shape),
                "low": np.asarray(act.low, dtype=np.float64),
                "high": np.asarray(act.high, dtype=np.float64)}
    raise UserError(f"--data {spec}: the action space is {type(act).__name__} "
                    f"{getattr(act, 'shape', '')}; amptrain's ppo acts in Discrete or 1-d "
                    f"Box action spaces")


def _world() -> tuple[int, int]:
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
    try:
        env = gym.make(env_id, **kwargs)
    except gym.error.Error as exc:
        raise UserError(f"--data {spec}: {exc}") from None
    except TypeError as exc:  # a keyword the environment does not take
        raise UserError(f"--data {spec}: {exc}") from None
    try:
        space = describe_spaces(env, spec)
        kind = "discrete" if space["discrete"] else "continuous"
        num_envs, steps = DEFAULT_ROLLOUT[kind]
        vector = options.vector_env or "sync"
        if vector not in VECTOR_MODES:
            raise UserError(f"--vector-env must be one of {', '.join(VECTOR_MODES)} "
                            f"(got {vector!r})")
        envs = GymEnvs(spec, env_id, kwargs, num_envs=options.num_envs or num_envs,
                       rollout_steps=options.rollout_steps or steps, vector=vector,
                       space=space, seed=options.seed)
        episodes = options.eval_episodes or DEFAULT_EVAL_EPISODES
        seeds = torch.arange(EVAL_SEED, EVAL_SEED + episodes)
        starts = [np.asarray(env.reset(seed=int(s))[0], dtype=np.float32) for s in seeds]
    finally:
        env.close()
    _, world = _world()
    train = RolloutSlots(envs, torch.arange(envs.rollout_size * world))
    val = EvalEpisodes(envs, torch.from_numpy(np.stack(starts)), seeds)
    return DataBundle(train, val, num_classes=space["actions"],
                      input_shape=tuple(space["obs_shape"]), kind=f"env-{kind}", task="ppo",
                      class_names=[])


__all__ = ["DEFAULT_ROLLOUT", "EVAL_SEED", "EnvStepper", "EvalEpisodes", "GymEnvs",
           "RolloutSlots", "RunningMeanStd", "gym_data", "parse_spec"]
