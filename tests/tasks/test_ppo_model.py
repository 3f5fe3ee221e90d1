"""The ppo task's check of its model (tasks/ppo_model.py): a user's actor-critic whose
forward cannot take a batch of observations is one line naming the model option and what
the forward must accept, read from its signature before anything calls it."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from amptrain.common.errors import UserError, cli_spelling
from amptrain.models.actor_critic import ActorCritic
from amptrain.tasks.ppo_model import actor_critic_of

#: What actor_critic_of reads of gym: data's environments (data/gym.py GymEnvs).
CARTPOLE = SimpleNamespace(obs_shape=(4,), actions=2, discrete=True)


class _Head(nn.Module):
    """An actor-critic's layers; the subclasses differ only in their forward."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.calls = 0

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        out = self.linear(x)
        return out[:, :2], out[:, 2]


class NoObs(_Head):
    def forward(self) -> torch.Tensor:
        self.calls += 1
        return self.linear.weight


class TakesMask(_Head):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.heads(x * mask)


class KeywordOnly(_Head):
    def forward(self, *, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.heads(state)


class AnyArguments(_Head):
    def forward(self, *inputs: torch.Tensor, **options: object
                ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.heads(inputs[0])


@pytest.mark.parametrize("model,said", [
    (NoObs(), "NoObs.forward() cannot be called as forward(obs): too many positional"),
    (TakesMask(), "TakesMask.forward(x, mask) cannot be called as forward(obs): "
                  "missing a required argument: 'mask'"),
    (KeywordOnly(), "cannot be called as forward(obs): too many positional arguments"),
])
def test_a_forward_that_cannot_take_observations_is_named_before_it_is_called(model, said):
    with cli_spelling(), pytest.raises(UserError) as error:
        actor_critic_of(model, CARTPOLE, "module:mine.Net")
    message = str(error.value)
    assert message.startswith("--model module:mine.Net: --task ppo needs an actor-critic "
                              "whose forward takes one batch of observations, forward(obs) "
                              "with obs of shape (N, 4), and returns (logits_or_mean, value) "
                              "with shapes (N, 2) and (N,)")
    assert said in message and "\n" not in message
    assert model.calls == 0  # refused by its signature: the forward never ran


def test_a_library_caller_is_told_the_keyword_and_the_class():
    with pytest.raises(UserError) as error:
        actor_critic_of(NoObs(), CARTPOLE)
    assert str(error.value).startswith("model (NoObs): task ppo needs an actor-critic whose "
                                       "forward takes one batch of observations")
    assert "--" not in str(error.value)


def test_a_forward_that_takes_observations_however_it_spells_them_is_kept():
    for model in (AnyArguments(), ActorCritic(4, 2, continuous=False)):
        module, continuous = actor_critic_of(model, CARTPOLE, "module:mine.Net")
        assert module is model and continuous is False


def test_a_forward_that_fails_inside_still_says_what_it_must_accept():
    class Wrong(_Head):
        def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.heads(obs.reshape(-1, 8))  # the user's bug, inside the call

    with cli_spelling(), pytest.raises(UserError) as error:
        actor_critic_of(Wrong(), CARTPOLE, "module:mine.Wrong")
    assert "forward takes one batch of observations" in str(error.value)
    assert "the model Wrong fails on a batch of observations of shape (2, 4): " \
           "RuntimeError" in str(error.value)
