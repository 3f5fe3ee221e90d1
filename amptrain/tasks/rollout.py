"""The PPO task's rollout and arithmetic, in fp32 whatever the precision: the buffer of
one rollout, generalised advantage estimation, the action distributions and the loss.

Conventions (one process's rollout of ``T`` steps of ``N`` environments):

* ``rewards[t]``, ``values[t] = V(s_t)`` and ``ended[t]``: whether the episode ended at
  step ``t`` (terminated or truncated; ``s_{t+1}`` is then the next episode's first
  observation). A truncated episode's reward already holds ``gamma * V(final_obs)``
  (the rollout adds it), so GAE treats every end alike;
* ``next_value = V(s_T)``: the value of the observation after the rollout.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.distributions import Categorical, Distribution, Normal


def gae(rewards: torch.Tensor, values: torch.Tensor, ended: torch.Tensor,
        next_value: torch.Tensor, gamma: float, lam: float
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) of ``T x N`` rewards by GAE(gamma, lambda) (Schulman et al.
    2016), the returns being ``advantages + values`` (the critic's targets)."""
    rewards, values = rewards.float(), values.float()
    continues = 1.0 - ended.float()
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(next_value, dtype=torch.float32)
    following = next_value.float()
    for t in reversed(range(rewards.shape[0])):
        delta = rewards[t] + gamma * following * continues[t] - values[t]
        running = delta + gamma * lam * continues[t] * running
        advantages[t] = running
        following = values[t]
    return advantages, advantages + values


def distribution(out: torch.Tensor, log_std: torch.Tensor | None) -> Distribution:
    """The policy at ``out`` (logits, or the Gaussian's mean with ``log_std``), in fp32:
    log-probabilities and the PPO ratio are computed from fp32-cast outputs."""
    if log_std is None:
        return Categorical(logits=out.float())
    mean = out.float()
    return Normal(mean, log_std.float().expand_as(mean).exp())


def log_prob(dist: Distribution, actions: torch.Tensor) -> torch.Tensor:
    """Per-sample log-probability of ``actions`` (summed over a continuous action's
    dimensions): all that acting needs."""
    logp = dist.log_prob(actions)
    return logp.sum(-1) if isinstance(dist, Normal) else logp


def log_prob_entropy(dist: Distribution, actions: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample log-probability of ``actions`` and entropy (summed over a continuous
    action's dimensions): what an update needs."""
    entropy = dist.entropy()
    return log_prob(dist, actions), entropy.sum(-1) if isinstance(dist, Normal) else entropy


@dataclass(frozen=True)
class LossSettings:
    """The coefficients of the PPO loss (CleanRL's names)."""

    clip_coef: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    norm_adv: bool = True
    clip_vloss: bool = True


def ppo_loss(new_logp: torch.Tensor, entropy: torch.Tensor, new_value: torch.Tensor, *,
             old_logp: torch.Tensor, advantages: torch.Tensor, old_value: torch.Tensor,
             returns: torch.Tensor, settings: LossSettings
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped-surrogate PPO loss of a minibatch (Schulman et al. 2017) and its
    statistics (detached): ``policy_loss``, ``value_loss``, ``entropy``, ``approx_kl``
    (the ``(r - 1) - log r`` estimator) and ``clip_frac``."""
    s = settings
    log_ratio = new_logp.float() - old_logp
    ratio = log_ratio.exp()
    if s.norm_adv:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    policy = torch.max(-advantages * ratio,
                       -advantages * ratio.clamp(1 - s.clip_coef, 1 + s.clip_coef)).mean()
    new_value = new_value.float().reshape(returns.shape)
    unclipped = (new_value - returns) ** 2
    if s.clip_vloss:
        clipped = old_value + (new_value - old_value).clamp(-s.clip_coef, s.clip_coef)
        value = 0.5 * torch.max(unclipped, (clipped - returns) ** 2).mean()
    else:
        value = 0.5 * unclipped.mean()
    ent = entropy.float().mean()
    loss = policy - s.ent_coef * ent + s.vf_coef * value
    with torch.no_grad():
        stats = {"policy_loss": policy.detach(), "value_loss": value.detach(),
                 "entropy": ent.detach(), "approx_kl": ((ratio - 1) - log_ratio).mean(),
                 "clip_frac": ((ratio - 1).abs() > s.clip_coef).float().mean()}
    return loss, stats


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """``1 - Var(returns - values) / Var(returns)`` (a device scalar; NaN for constant
    returns): 1 is a perfect critic, 0 no better than a constant."""
    var = returns.var()
    return 1 - (returns - values).var() / var


class Rollout:
    """One process's rollout of ``steps x envs`` transitions, on the device, in fp32
    (actions: int64 for discrete spaces)."""

    def __init__(self, steps: int, envs: int, obs_shape: tuple[int, ...], actions: int, *,
                 discrete: bool, device: torch.device) -> None:
        self.steps, self.envs = steps, envs
        self.obs = torch.zeros(steps, envs, *obs_shape, device=device)
        shape = (steps, envs) if discrete else (steps, envs, actions)
        self.actions = torch.zeros(shape, device=device,
                                   dtype=torch.int64 if discrete else torch.float32)
        self.logp = torch.zeros(steps, envs, device=device)
        self.values = torch.zeros(steps, envs, device=device)
        self.advantages: torch.Tensor | None = None
        self.returns: torch.Tensor | None = None

    def put(self, t: int, obs: torch.Tensor, actions: torch.Tensor, logp: torch.Tensor,
            values: torch.Tensor) -> None:
        self.obs[t], self.actions[t] = obs, actions
        self.logp[t], self.values[t] = logp.float(), values.float().reshape(self.envs)

    def finish(self, rewards: torch.Tensor, ended: torch.Tensor, next_value: torch.Tensor,
               gamma: float, lam: float) -> None:
        """The advantages and returns (``rewards``, ``ended``: ``T x N`` on the device)."""
        self.advantages, self.returns = gae(rewards, self.values, ended, next_value,
                                            gamma, lam)

    def __len__(self) -> int:
        return self.steps * self.envs

    def minibatch(self, index: torch.Tensor) -> dict[str, Any]:
        """The transitions at flat ``index`` (``t * envs + env``)."""
        assert self.advantages is not None and self.returns is not None, "finish() first"
        flat = {"obs": self.obs.flatten(0, 1), "actions": self.actions.flatten(0, 1),
                "logp": self.logp.flatten(), "values": self.values.flatten(),
                "advantages": self.advantages.flatten(), "returns": self.returns.flatten()}
        index = index.to(self.obs.device)
        return {key: value[index] for key, value in flat.items()}


__all__ = ["LossSettings", "Rollout", "distribution", "explained_variance", "gae",
           "log_prob_entropy", "ppo_loss"]
