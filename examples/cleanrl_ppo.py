"""A single-file PPO in CleanRL's style (CartPole-v1, discrete actions), mixed precision
by amptrain's ``Precision``. Written for amptrain's examples, after CleanRL's ppo.py.

    python examples/cleanrl_ppo.py [PRECISION] [TOTAL_TIMESTEPS]   # bf16-mixed, 20000

``PRECISION none`` runs the original lines (no autocast, plain backward/step): in 32-true
the episode returns are the same as the original's, episode by episode.

The lines that change against CleanRL's ppo.py (marked ``# amptrain`` below):

    +prec = Precision(precision)
    +agent, optimizer = prec.setup(agent, optimizer)
    -            _, newlogprob, entropy, newvalue = agent.get_action_and_value(...)
    +            with prec.autocast():
    +                _, newlogprob, entropy, newvalue = agent.get_action_and_value(...)
    -            loss.backward()
    -            nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    -            optimizer.step()
    +            prec.backward(loss)
    +            prec.clip_grad_norm_(agent.parameters(), max_grad_norm)
    +            prec.step(optimizer)

Log-probabilities in fp32 under bf16: ``get_action_and_value`` makes its
``Categorical`` from ``logits.float()``. A bf16 log-probability carries 8 bits of
mantissa, so the ratio ``exp(newlogprob - logprob)`` of two nearly equal values is noise
and PPO's clipping acts on it; amptrain's own ppo task keeps them in fp32 the same way.
"""
from __future__ import annotations

import sys
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions.categorical import Categorical


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int) -> None:
        super().__init__()
        self.critic = nn.Sequential(layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
                                    layer_init(nn.Linear(64, 64)), nn.Tanh(),
                                    layer_init(nn.Linear(64, 1), std=1.0))
        self.actor = nn.Sequential(layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
                                   layer_init(nn.Linear(64, 64)), nn.Tanh(),
                                   layer_init(nn.Linear(64, n_actions), std=0.01))

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None
                             ) -> tuple[torch.Tensor, ...]:
        # fp32 log-probabilities whatever the autocast dtype (see the module docstring)
        probs = Categorical(logits=self.actor(x).float())
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x).float()


def main(precision: str = "bf16-mixed", total_timesteps: int = 20000, *, seed: int = 1,
         num_envs: int = 4, num_steps: int = 128, learning_rate: float = 2.5e-4,
         gamma: float = 0.99, gae_lambda: float = 0.95, num_minibatches: int = 4,
         update_epochs: int = 4, clip_coef: float = 0.2, ent_coef: float = 0.01,
         vf_coef: float = 0.5, max_grad_norm: float = 0.5) -> dict[str, Any]:
    np.random.seed(seed)
    torch.manual_seed(seed)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(num_envs)])
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    agent = Agent(obs_dim, int(envs.single_action_space.n))
    optimizer = torch.optim.Adam(agent.parameters(), lr=learning_rate, eps=1e-5)
    if precision == "none":
        from contextlib import nullcontext as autocast
    else:
        from amptrain import Precision
        prec = Precision(precision)                      # amptrain
        agent, optimizer = prec.setup(agent, optimizer)  # amptrain
        autocast = prec.autocast                         # amptrain

    batch_size = num_envs * num_steps
    minibatch_size = batch_size // num_minibatches
    obs = torch.zeros((num_steps, num_envs, obs_dim))
    actions = torch.zeros((num_steps, num_envs))
    logprobs, rewards, dones, values = (torch.zeros((num_steps, num_envs)) for _ in range(4))
    next_obs_np, _ = envs.reset(seed=seed)
    next_obs = torch.tensor(next_obs_np, dtype=torch.float32)
    next_done = torch.zeros(num_envs)
    returns_seen: list[float] = []
    episode_return = np.zeros(num_envs)
    skipped = 0
    for update in range(total_timesteps // batch_size):
        optimizer.param_groups[0]["lr"] = learning_rate * (
            1.0 - update / (total_timesteps // batch_size))
        for step in range(num_steps):
            obs[step], dones[step] = next_obs, next_done
            with torch.no_grad(), autocast():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            values[step], actions[step], logprobs[step] = value.flatten(), action, logprob
            next_obs_np, reward, terminated, truncated, _ = envs.step(action.numpy())
            episode_return += reward
            done = np.logical_or(terminated, truncated)
            for i in np.flatnonzero(done):
                returns_seen.append(float(episode_return[i]))
                episode_return[i] = 0.0
            rewards[step] = torch.tensor(reward, dtype=torch.float32)
            next_obs = torch.tensor(next_obs_np, dtype=torch.float32)
            next_done = torch.tensor(done, dtype=torch.float32)
        with torch.no_grad(), autocast():
            next_value = agent.get_value(next_obs).float().reshape(1, -1)
        advantages = torch.zeros_like(rewards)
        lastgaelam = torch.zeros(num_envs)
        for t in reversed(range(num_steps)):
            nextnonterminal = 1.0 - (next_done if t == num_steps - 1 else dones[t + 1])
            nextvalues = next_value if t == num_steps - 1 else values[t + 1]
            delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
            lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
            advantages[t] = lastgaelam
        returns = advantages + values
        b_obs, b_logprobs = obs.reshape(-1, obs_dim), logprobs.reshape(-1)
        b_actions, b_advantages = actions.reshape(-1), advantages.reshape(-1)
        b_returns, b_values = returns.reshape(-1), values.reshape(-1)
        b_inds = np.arange(batch_size)
        for _ in range(update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, batch_size, minibatch_size):
                mb = b_inds[start:start + minibatch_size]
                with autocast():                                         # amptrain
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                        b_obs[mb], b_actions.long()[mb])
                ratio = (newlogprob - b_logprobs[mb]).exp()
                mb_adv = b_advantages[mb]
                mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                pg_loss = torch.max(-mb_adv * ratio,
                                    -mb_adv * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)).mean()
                v_loss = 0.5 * ((newvalue.view(-1) - b_returns[mb]) ** 2).mean()
                loss = pg_loss - ent_coef * entropy.mean() + v_loss * vf_coef
                optimizer.zero_grad()
                if precision == "none":
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), max_grad_norm)
                    optimizer.step()
                else:
                    prec.backward(loss)                                  # amptrain
                    prec.clip_grad_norm_(agent.parameters(), max_grad_norm)  # amptrain
                    skipped += not prec.step(optimizer)                  # amptrain
    envs.close()
    return {"episode_returns": returns_seen, "skipped": skipped}


if __name__ == "__main__":
    args = sys.argv[1:]
    result = main(args[0] if args else "bf16-mixed", int(args[1]) if len(args) > 1 else 20000)
    tail = result["episode_returns"][-10:]
    print(f"episodes {len(result['episode_returns'])}, mean return of the last 10 "
          f"{np.mean(tail):.1f}, skipped steps {result['skipped']}")
