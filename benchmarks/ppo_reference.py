"""A plain single-file PPO loop: the reference that amptrain's ppo task is timed against.

The recipe is CleanRL's (vwxyzjn/cleanrl, ``ppo.py`` for discrete and
``ppo_continuous_action.py`` for continuous actions), written out here from its
description, not copied: Gymnasium vector environments, an actor-critic of two tanh
layers of 64 (separate actor and critic, orthogonal initialisation: gain sqrt(2), 0.01 for
the policy head, 1 for the value head), GAE (gamma 0.99, lambda 0.95), the clipped surrogate
(0.2) and clipped value loss, advantages normalised per minibatch, an entropy bonus, Adam
(eps 1e-5) with the learning rate annealed linearly to zero, gradients clipped to norm 0.5.
Discrete: lr 2.5e-4, 4 minibatches, 4 epochs, entropy 0.01. Continuous (Gaussian with a
state-independent log-std): lr 3e-4, 32 minibatches, 10 epochs, no entropy bonus, and
observations and rewards normalised by running statistics and clipped to ±10.

Precision: ``32-true``, or ``bf16-mixed``/``16-mixed`` as ``torch.autocast`` on the CPU
around acting and around the update's forward pass (``16-mixed`` with a ``GradScaler``);
the distributions, losses and GAE are computed in fp32 from the network's outputs.

For a side-by-side benchmark :func:`iterate` yields after every update (one rollout plus
its optimisation), so two loops can take turns in one process; :func:`run` drives it to
the end. Time is split into stepping the environments, acting (the policy's forward pass
during the rollout) and updating (GAE plus the minibatch epochs).

    python benchmarks/ppo_reference.py [--env CartPole-v1] [--num-envs 4] \
        [--rollout-steps 128] [--env-steps 100000] [--seed 1] \
        [--precision 32-true[,bf16-mixed,16-mixed]] [--threads 1]
"""
from __future__ import annotations

import argparse
import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from amptrain.compare.seeds import iqm

#: Precisions this loop runs, as the autocast dtype of each (None: no autocast).
AUTOCAST = {"32-true": None, "bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
#: Episode returns reported at the end: the last this many finished episodes.
LAST_EPISODES = 20


@dataclass(frozen=True)
class Recipe:
    """The hyperparameters that differ between CleanRL's discrete and continuous scripts."""

    lr: float
    minibatches: int
    epochs: int
    entropy_coef: float
    normalise: bool   # running observation and reward normalisation (continuous only)
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.2
    value_coef: float = 0.5
    max_grad_norm: float = 0.5


DISCRETE = Recipe(lr=2.5e-4, minibatches=4, epochs=4, entropy_coef=0.01, normalise=False)
CONTINUOUS = Recipe(lr=3e-4, minibatches=32, epochs=10, entropy_coef=0.0, normalise=True)


def _make_env(env_id: str, recipe: Recipe) -> Callable[[], gym.Env]:
    def build() -> gym.Env:
        env = gym.make(env_id)
        # Episode statistics first, so returns are the environment's own, not normalised.
        env = gym.wrappers.RecordEpisodeStatistics(env)
        if recipe.normalise:
            env = gym.wrappers.ClipAction(env)
            env = gym.wrappers.NormalizeObservation(env)
            env = gym.wrappers.TransformObservation(env, lambda o: np.clip(o, -10, 10),
                                                   env.observation_space)
            env = gym.wrappers.NormalizeReward(env, gamma=recipe.gamma)
            env = gym.wrappers.TransformReward(env, lambda r: float(np.clip(r, -10, 10)))
        return env
    return build


def _layer(n_in: int, n_out: int, gain: float) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(n_in: int, n_out: int, head_gain: float) -> nn.Sequential:
    root2 = math.sqrt(2)
    return nn.Sequential(_layer(n_in, 64, root2), nn.Tanh(), _layer(64, 64, root2), nn.Tanh(),
                         _layer(64, n_out, head_gain))


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs; a categorical or a diagonal Gaussian policy."""

    def __init__(self, obs_size: int, action_space: gym.Space) -> None:
        super().__init__()
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        n_out = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        self.actor = _mlp(obs_size, n_out, 0.01)
        self.critic = _mlp(obs_size, 1, 1.0)
        self.log_std = None if self.discrete else nn.Parameter(torch.zeros(1, n_out))

    def distribution(self, obs: torch.Tensor) -> torch.distributions.Distribution:
        out = self.actor(obs).float()  # fp32 distributions, whatever autocast computed
        if self.discrete:
            return torch.distributions.Categorical(logits=out)
        assert self.log_std is not None
        return torch.distributions.Normal(out, self.log_std.expand_as(out).exp())

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).float().squeeze(-1)

    def log_prob(self, dist: torch.distributions.Distribution,
                 action: torch.Tensor) -> torch.Tensor:
        lp = dist.log_prob(action)
        return lp if self.discrete else lp.sum(-1)

    def entropy(self, dist: torch.distributions.Distribution) -> torch.Tensor:
        e = dist.entropy()
        return e if self.discrete else e.sum(-1)


def gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor,
        next_value: torch.Tensor, next_done: torch.Tensor, gamma: float, lam: float
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) of a (T, envs) rollout; ``dones[t]`` marks that the observation
    of step t began a new episode (the previous step ended one)."""
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        after_value, after_done = (next_value, next_done) if t == rewards.shape[0] - 1 \
            else (values[t + 1], dones[t + 1])
        alive = 1.0 - after_done
        delta = rewards[t] + gamma * after_value * alive - values[t]
        running = delta + gamma * lam * alive * running
        advantages[t] = running
    return advantages, advantages + values


def _autocast(dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()


#: Seed of evaluation episode k: EVAL_SEED + k (as amptrain's gym: data).
EVAL_SEED = 1_000_000
#: The longest evaluation episode (amptrain's cap for environments without a time limit).
EVAL_CAP = 10_000


def evaluate(model: ActorCritic, env_id: str, episodes: int, dtype: torch.dtype | None
             ) -> list[float]:
    """Deterministic episodes (the most likely action, or the Gaussian's mean), one after
    another from fixed seeds, as amptrain evaluates a ppo run: their returns."""
    env = gym.make(env_id)
    returns = []
    try:
        for k in range(episodes):
            obs, _ = env.reset(seed=EVAL_SEED + k)
            total = 0.0
            for _ in range(EVAL_CAP):
                with torch.no_grad(), _autocast(dtype):
                    out = model.actor(torch.as_tensor(obs[None], dtype=torch.float32)).float()[0]
                action = int(out.argmax().item()) if model.discrete else out.numpy()
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                if terminated or truncated:
                    break
            returns.append(total)
    finally:
        env.close()
    return returns


def iterate(env_id: str, num_envs: int, rollout_steps: int, total_env_steps: int, seed: int,
            precision: str = "32-true", *, recipe: Recipe | None = None, evaluations: int = 0,
            eval_episodes: int = 10) -> Iterator[dict[str, Any]]:
    """Train PPO, yielding the running figures (:func:`_figures`) after every update.
    ``recipe``: the hyperparameters (default: :data:`DISCRETE` or :data:`CONTINUOUS`, by
    the environment's action space). ``evaluations``: play ``eval_episodes`` deterministic
    episodes after every ``updates // evaluations`` updates and after the last (amptrain's
    cadence for a ppo run; 0: none)."""
    if precision not in AUTOCAST:
        raise ValueError(f"precision must be one of {', '.join(AUTOCAST)} (got {precision!r})")
    probe = gym.make(env_id)  # which recipe: the action space decides
    if recipe is None:
        recipe = DISCRETE if isinstance(probe.action_space, gym.spaces.Discrete) else CONTINUOUS
    probe.close()
    # SAME_STEP: a finished environment returns its next episode's first observation at
    # once, as CleanRL's scripts expect (truncation ends the bootstrap like termination).
    envs = gym.vector.SyncVectorEnv([_make_env(env_id, recipe) for _ in range(num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    batch = num_envs * rollout_steps
    minibatch = batch // recipe.minibatches
    updates = total_env_steps // batch
    if updates < 1 or minibatch < 2:
        raise ValueError(f"{total_env_steps} env steps of {num_envs} x {rollout_steps} give "
                         f"{updates} updates of minibatch {minibatch}: need >= 1 and >= 2")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    obs_shape = envs.single_observation_space.shape
    act_shape = envs.single_action_space.shape
    model = ActorCritic(int(np.prod(obs_shape)), envs.single_action_space)
    optimizer = torch.optim.Adam(model.parameters(), lr=recipe.lr, eps=1e-5)
    dtype = AUTOCAST[precision]
    scaler = torch.amp.GradScaler("cpu", enabled=dtype is torch.float16)

    obs = torch.zeros((rollout_steps, num_envs, *obs_shape))
    actions = torch.zeros((rollout_steps, num_envs, *act_shape))
    logprobs, rewards, dones, values = (torch.zeros(rollout_steps, num_envs) for _ in range(4))
    raw_obs, _ = envs.reset(seed=seed)
    next_obs = torch.as_tensor(raw_obs, dtype=torch.float32)
    next_done = torch.zeros(num_envs)
    clock = {"env": 0.0, "act": 0.0, "update": 0.0}
    every = max(1, updates // evaluations) if evaluations else 0
    evaluated: list[float] = []
    returns_seen: list[float] = []
    env_steps = 0
    for update in range(1, updates + 1):
        for group in optimizer.param_groups:  # linear annealing to 0 over the updates
            group["lr"] = recipe.lr * (1.0 - (update - 1) / updates)
        for t in range(rollout_steps):
            started = time.perf_counter()
            obs[t], dones[t] = next_obs, next_done
            with torch.no_grad(), _autocast(dtype):
                dist = model.distribution(next_obs)
                action = dist.sample()
                logprobs[t] = model.log_prob(dist, action)
                values[t] = model.value(next_obs)
            actions[t] = action
            stepped = time.perf_counter()
            raw_obs, reward, terminated, truncated, info = envs.step(action.numpy())
            clock["env"] += time.perf_counter() - stepped
            clock["act"] += stepped - started
            rewards[t] = torch.as_tensor(reward, dtype=torch.float32)
            next_obs = torch.as_tensor(raw_obs, dtype=torch.float32)
            next_done = torch.as_tensor(np.logical_or(terminated, truncated), dtype=torch.float32)
            final = info.get("final_info", {})
            if "episode" in final:
                ended = final["_episode"]
                returns_seen += [float(r) for r in final["episode"]["r"][ended]]
        env_steps += batch
        started = time.perf_counter()
        _optimise(model, optimizer, scaler, recipe, dtype, rng, obs, actions, logprobs,
                  rewards, values, dones, next_obs, next_done, minibatch)
        clock["update"] += time.perf_counter() - started
        if every and (update % every == 0 or update == updates):
            started = time.perf_counter()
            evaluated = evaluate(model, env_id, eval_episodes, dtype)
            clock["eval"] = clock.get("eval", 0.0) + time.perf_counter() - started
        yield {**_figures(update, updates, env_steps, clock, returns_seen),
               "eval_returns": evaluated}
    envs.close()


def _optimise(model: ActorCritic, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
              recipe: Recipe, dtype: torch.dtype | None, rng: np.random.Generator,
              obs: torch.Tensor, actions: torch.Tensor, logprobs: torch.Tensor,
              rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor,
              next_obs: torch.Tensor, next_done: torch.Tensor, minibatch: int) -> None:
    """GAE over the rollout, then the recipe's epochs of clipped-surrogate minibatch steps."""
    with torch.no_grad(), _autocast(dtype):
        next_value = model.value(next_obs)
    advantages, returns = gae(rewards, values, dones, next_value, next_done, recipe.gamma,
                              recipe.gae_lambda)
    flat = [x.reshape(-1, *x.shape[2:]) for x in (obs, actions, logprobs, advantages, returns,
                                                  values)]
    b_obs, b_actions, b_logprobs, b_adv, b_returns, b_values = flat
    batch = b_obs.shape[0]
    for _ in range(recipe.epochs):
        order = torch.from_numpy(rng.permutation(batch))
        for start in range(0, batch - minibatch + 1, minibatch):
            idx = order[start:start + minibatch]
            with _autocast(dtype):
                dist = model.distribution(b_obs[idx])
                new_value = model.value(b_obs[idx])
            log_ratio = model.log_prob(dist, b_actions[idx]) - b_logprobs[idx]
            ratio = log_ratio.exp()
            adv = b_adv[idx]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            policy_loss = torch.max(-adv * ratio,
                                    -adv * ratio.clamp(1 - recipe.clip, 1 + recipe.clip)).mean()
            clipped = b_values[idx] + (new_value - b_values[idx]).clamp(-recipe.clip, recipe.clip)
            value_loss = 0.5 * torch.max((new_value - b_returns[idx]) ** 2,
                                         (clipped - b_returns[idx]) ** 2).mean()
            loss = (policy_loss - recipe.entropy_coef * model.entropy(dist).mean()
                    + recipe.value_coef * value_loss)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), recipe.max_grad_norm)
            scaler.step(optimizer)
            scaler.update()


def _figures(update: int, updates: int, env_steps: int, clock: dict[str, float],
             returns_seen: list[float]) -> dict[str, Any]:
    """The loop's figures so far: env steps/s over the timed work, and its shares."""
    total = sum(clock.values()) or float("nan")
    last = returns_seen[-LAST_EPISODES:]
    return {"update": update, "updates": updates, "env_steps": env_steps,
            "env_steps_per_s": env_steps / total,
            "env_time_s": clock["env"], "act_time_s": clock["act"],
            "update_time_s": clock["update"],
            "env_share": clock["env"] / total, "act_share": clock["act"] / total,
            "update_share": clock["update"] / total,
            "episodes": len(returns_seen), "final_returns": last,
            "final_return_mean": float(np.mean(last)) if last else None}


def run(env_id: str, num_envs: int, rollout_steps: int, total_env_steps: int, seed: int,
        precision: str = "32-true", *, recipe: Recipe | None = None) -> dict[str, Any]:
    """Train to the end; the figures of the last update (see :func:`_figures`):
    ``env_steps_per_s``, the shares of time in the environments (``env_share``), acting
    and the updates (``update_share``), and the last finished episodes' returns."""
    last: dict[str, Any] = {}
    for figures in iterate(env_id, num_envs, rollout_steps, total_env_steps, seed, precision,
                           recipe=recipe):
        last = figures
    return last


def take_turns(loops: dict[str, Iterator[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Run several :func:`iterate` loops one update each in turn (so drift of a shared
    machine hits them alike) until all end; each loop's last figures by name."""
    last: dict[str, dict[str, Any]] = {}
    running = dict(loops)
    while running:
        for name in list(running):
            try:
                last[name] = next(running[name])
            except StopIteration:
                del running[name]
    return last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--rollout-steps", type=int, default=128)
    parser.add_argument("--env-steps", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--precision", default="32-true",
                        help=f"one of {', '.join(AUTOCAST)}, or several comma-separated: "
                             f"they take turns update by update")
    parser.add_argument("--evaluations", type=int, default=0,
                        help="evaluations in the run (amptrain's ppo default: 20)")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (a 64-wide MLP gains nothing from more, and "
                             "idle threads spinning between its tiny kernels cost time)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    precisions = [p.strip() for p in args.precision.split(",") if p.strip()]
    results = take_turns({p: iterate(args.env, args.num_envs, args.rollout_steps,
                                     args.env_steps, args.seed, p,
                                     evaluations=args.evaluations,
                                     eval_episodes=args.eval_episodes) for p in precisions})
    for precision, result in results.items():
        returns = result["final_returns"]
        print(f"{args.env} {precision}: {result['env_steps']} env steps in "
              f"{result['updates']} updates, {result['env_steps_per_s']:,.0f} env steps/s; "
              f"time in envs {result['env_share']:.0%}, acting {result['act_share']:.0%}, "
              f"updates {result['update_share']:.0%}")
        if returns:
            print(f"  last {len(returns)} of {result['episodes']} episodes: return mean "
                  f"{np.mean(returns):.1f}, IQM {iqm(returns):.1f}")
        if result["eval_returns"]:
            print(f"  last evaluation: return mean {np.mean(result['eval_returns']):.1f} "
                  f"over {len(result['eval_returns'])} deterministic episodes")


if __name__ == "__main__":
    main()
