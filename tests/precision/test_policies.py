"""precision/policies.py: how one optimizer's steps reach its model's weights, chosen once
per pair by weight_policy (plain, fp32 masters, a kahan/stochastic rounding rule)."""
from __future__ import annotations

import torch
from torch import nn

from amptrain.precision.modes import MODES
from amptrain.precision.policies import (MasterCopies, PlainWeights, RoundingRule,
                                         WeightPolicy, weight_policy)


def _pair(lr: float = 0.5) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    return model, torch.optim.SGD(model.parameters(), lr=lr)


def _policy(mode: str, *, rule: str = "plain", optimizer: bool = True,
            managed_elsewhere: bool = False) -> tuple[nn.Module, torch.optim.Optimizer,
                                                       WeightPolicy]:
    model, opt = _pair()
    policy = weight_policy(model, opt if optimizer else None, MODES[mode], rule=rule,
                           kept_fp32=set(), seed=3, managed_elsewhere=managed_elsewhere)
    return model, opt, policy


def test_fp32_weights_are_stepped_as_they_are():
    model, opt, policy = _policy("32-true")
    params = list(model.parameters())
    assert type(policy) is PlainWeights and policy.kind == "plain" and policy.rule is None
    assert policy.stepped_params(params) == params
    assert [(a, b) for a, b in policy.grad_links()] == [(p, p) for p in params]
    assert policy.fp32_weights(model) == {} and policy.state_dict() is None
    assert policy.buffers() == []


def test_a_mixed_mode_keeps_fp32_weights_and_the_plain_policy():
    model, _, policy = _policy("bf16-mixed")
    assert type(policy) is PlainWeights
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_a_master_mode_casts_the_model_and_steps_fp32_copies():
    model, opt, policy = _policy("bf16-master")
    assert type(policy) is MasterCopies and policy.kind == "master"
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    stepped = [p for g in opt.param_groups for p in g["params"]]
    assert all(p.dtype == torch.float32 for p in stepped)
    assert policy.stepped_params(model.parameters()) == stepped
    masters = policy.fp32_weights(model)
    assert set(masters) == {name for name, _ in model.named_parameters()}
    assert all(v.dtype == torch.float32 for v in masters.values())


def test_masters_gather_gradients_once_step_and_copy_back():
    model, opt, policy = _policy("bf16-master")
    model(torch.ones(2, 4, dtype=torch.bfloat16)).float().sum().backward()
    half_grads = [p.grad.clone() for p in model.parameters()]
    policy.gather_grads()
    policy.gather_grads()  # once per step: clip, grad_norm and step all call it
    stepped = [p for g in opt.param_groups for p in g["params"]]
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(m.grad, h.float()) for m, h in zip(stepped, half_grads))
    before = [m.detach().clone() for m in stepped]
    opt.step()
    policy.after_step()
    for param, master, old, grad in zip(model.parameters(), stepped, before, half_grads):
        assert torch.equal(master.detach(), old - 0.5 * grad.float())
        assert torch.equal(param.detach(), master.detach().to(torch.bfloat16))


def test_the_masters_optimizer_clears_the_half_gradients_too_until_removed():
    model, opt, policy = _policy("bf16-master")
    model(torch.ones(2, 4, dtype=torch.bfloat16)).float().sum().backward()
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    assert "zero_grad" in opt.__dict__
    policy.remove()
    assert "zero_grad" not in opt.__dict__  # the class's own again


def test_masters_load_fp32_values_by_parameter_name():
    model, _, policy = _policy("bf16-master")
    values = {name: torch.full_like(p, 0.25, dtype=torch.float32)
              for name, p in model.named_parameters()}
    policy.load_fp32(model, values)
    assert all(torch.equal(v, values[k]) for k, v in policy.fp32_weights(model).items())


def test_a_true_half_mode_with_a_rule_gets_the_rounding_rule():
    model, opt, policy = _policy("bf16-true", rule="kahan")
    assert type(policy) is RoundingRule and policy.kind == "kahan" and policy.rule is not None
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    model(torch.ones(2, 4, dtype=torch.bfloat16)).float().sum().backward()
    opt.step()
    policy.after_step()
    assert policy.buffers() and all(b.dtype == torch.bfloat16 for b in policy.buffers())
    state = policy.state_dict()
    assert state is not None and state["rule"] == "kahan"
    policy.remove()


def test_a_true_half_mode_with_plain_rounding_only_casts():
    model, _, policy = _policy("16-true")
    assert type(policy) is PlainWeights
    assert all(p.dtype == torch.float16 for p in model.parameters())


def test_without_an_optimizer_a_half_mode_only_casts():
    model, _, policy = _policy("bf16-master", optimizer=False)
    assert type(policy) is PlainWeights and policy.grad_links() == []
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_weights_a_strategy_keeps_are_neither_cast_nor_copied():
    model, _, policy = _policy("bf16-master", managed_elsewhere=True)
    assert type(policy) is PlainWeights
    assert all(p.dtype == torch.float32 for p in model.parameters())
