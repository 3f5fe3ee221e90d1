"""The built-in actor-critic: CleanRL's shape and initialisation, the interface the ppo
task reads, and data it refuses."""
from __future__ import annotations

import math

import pytest
import torch

from amptrain.common.errors import UserError
from amptrain.models import ModelInputs, build_model
from amptrain.models.actor_critic import ActorCritic

DISCRETE = ModelInputs(num_classes=2, input_shape=(4,), kind="env-discrete")
CONTINUOUS = ModelInputs(num_classes=3, input_shape=(5,), kind="env-continuous")


def test_discrete_actor_critic_returns_logits_and_values():
    torch.manual_seed(0)
    model = build_model("actor-critic", DISCRETE)
    logits, value = model(torch.randn(7, 4))
    assert logits.shape == (7, 2) and value.shape == (7,) and model.log_std is None
    assert [n for n, _ in model.named_children()] == ["actor", "head", "critic"]


def test_continuous_actor_critic_has_a_state_independent_log_std():
    model = build_model("actor-critic:32", CONTINUOUS)
    mean, value = model(torch.randn(2, 5))
    assert mean.shape == (2, 3) and value.shape == (2,)
    assert torch.equal(model.log_std.data, torch.zeros(3))
    assert model.actor[0].out_features == 32


def test_orthogonal_initialisation_with_cleanrl_gains():
    model = ActorCritic(4, 2, continuous=False)
    first = model.actor[0].weight          # 64 x 4: orthonormal columns times sqrt(2)
    assert torch.allclose(first.T @ first, 2.0 * torch.eye(4), atol=1e-5)
    head = model.head.weight                # 2 x 64: orthonormal rows times 0.01
    assert torch.allclose(head @ head.T, 1e-4 * torch.eye(2), atol=1e-8)
    value = model.critic[4].weight          # 1 x 64, gain 1
    assert value.norm().item() == pytest.approx(1.0, rel=1e-5)
    assert all(torch.count_nonzero(m.bias) == 0 for m in model.modules()
               if isinstance(m, torch.nn.Linear))
    assert math.isclose(model.actor[2].weight.norm().item() ** 2, 2.0 * 64, rel_tol=1e-4)


def test_actor_critic_refuses_data_that_is_not_an_environment():
    with pytest.raises(UserError, match="needs --data gym:ENV_ID"):
        build_model("actor-critic", ModelInputs(num_classes=10, input_shape=(1, 8, 8)))
    with pytest.raises(UserError, match="try --model actor-critic"):
        build_model("cnn", DISCRETE)
