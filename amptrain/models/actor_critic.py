"""``actor-critic``: the policy and value networks of the ``ppo`` task (CleanRL's shape).

Two separate MLPs on the flattened observation, each two hidden layers of ``hidden``
(64) units with tanh, orthogonally initialised (gain sqrt(2), zero biases):

* ``actor`` -> ``head``: the policy's logits (discrete actions) or the Gaussian's mean
  (continuous actions); ``head`` starts with gain 0.01, so the first policy is near
  uniform. ``head`` is the name every built-in model gives its output layer, so
  ``--keep-fp32 head`` keeps the policy's output layer in fp32 under autocast;
* ``critic``: the state value (last layer gain 1);
* ``log_std``: a state-independent log standard deviation per action dimension
  (continuous actions only), starting at 0.

The interface every actor-critic of the ppo task keeps (``module:`` models too):
``forward(obs) -> (logits_or_mean, value)`` with shapes ``(N, actions)`` and ``(N,)`` (or
``(N, 1)``), and for continuous actions a ``log_std`` parameter broadcastable to
``(N, actions)``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ..common.errors import UserError
from .core import ModelInputs, parse_options, register, require_positive

#: The data kinds of gym: environments (amptrain.data.gym).
ENV_KINDS = ("env-discrete", "env-continuous")


def _layer(n_in: int, n_out: int, gain: float = math.sqrt(2)) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs (module docstring)."""

    def __init__(self, observations: int, actions: int, *, continuous: bool,
                 hidden: int = 64) -> None:
        super().__init__()
        self.actor = nn.Sequential(_layer(observations, hidden), nn.Tanh(),
                                   _layer(hidden, hidden), nn.Tanh())
        self.head = _layer(hidden, actions, gain=0.01)
        self.critic = nn.Sequential(_layer(observations, hidden), nn.Tanh(),
                                    _layer(hidden, hidden), nn.Tanh(),
                                    _layer(hidden, 1, gain=1.0))
        self.log_std = nn.Parameter(torch.zeros(actions)) if continuous else None

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = obs.flatten(1)
        return self.head(self.actor(flat)), self.critic(flat).squeeze(-1)


@register("actor-critic")
def actor_critic(argument: str, inputs: ModelInputs) -> nn.Module:
    """``actor-critic[:hidden=64]`` for ``gym:`` environments."""
    spec = f"actor-critic:{argument}" if argument else "actor-critic"
    o = parse_options(argument, {"hidden": 64}, spec, positional="hidden")
    require_positive(o, spec, "hidden")
    if inputs.kind not in ENV_KINDS:
        raise UserError(f"--model {spec} is a policy and a value function for "
                        f"reinforcement learning: it needs --data gym:ENV_ID (this data is "
                        f"{inputs.kind})")
    return ActorCritic(math.prod(inputs.input_shape), inputs.num_classes,
                       continuous=inputs.kind == "env-continuous", hidden=o["hidden"])


__all__ = ["ENV_KINDS", "ActorCritic", "actor_critic"]
