"""amptrain/precision/master.py: half-precision weights (norm layers and islands kept
fp32) and fp32 master copies owned by the optimizer (Apex O2 semantics)."""
from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torch import nn

from amptrain.common.errors import UserError
from amptrain.precision.master import MasterWeights, cast_model, modules_kept_fp32

HALF = [torch.float16, torch.bfloat16]
ODD = 1 + 2 ** -20  # an fp32 value that neither fp16 nor bf16 can hold


class WithBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("scale", torch.full((3,), ODD))
        self.register_buffer("count", torch.tensor(7))
        self.register_buffer("absent", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


def model_for_test() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(
        conv=nn.Conv2d(1, 2, 3), bn=nn.BatchNorm2d(2), flat=nn.Flatten(),
        ln=nn.LayerNorm(2 * 2 * 2),
        island=nn.Sequential(nn.Linear(8, 4), nn.Sequential(nn.Linear(4, 4))),
        head=nn.Linear(4, 3)))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(ODD - 1)  # every weight carries bits a half type drops
    return model


def same(a: list, b: list) -> bool:
    """The same objects in the same order (== on tensors would compare values)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def position(params: list, param: torch.Tensor) -> int:
    return next(i for i, p in enumerate(params) if p is param)


# ------------------------------------------------------------------ cast_model
def test_kept_modules_are_the_islands_subtrees_and_batch_norms():
    model = model_for_test()
    kept = modules_kept_fp32(model, [model.island])
    assert kept == {model.bn, model.island, model.island[0], model.island[1], model.island[1][0]}
    assert modules_kept_fp32(model, []) == {model.bn}  # LayerNorm has no running statistics
    sync = nn.SyncBatchNorm(2)
    assert sync in modules_kept_fp32(nn.Sequential(sync), [])


@pytest.mark.parametrize("half", HALF, ids=str)
def test_cast_model_keeps_norm_layers_and_islands_fp32_and_the_parameter_objects(half):
    model = model_for_test()
    params = dict(model.named_parameters())
    originals = {n: p.detach().clone() for n, p in params.items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    cast_model(model, half, modules_kept_fp32(model, [model.island]))
    for name, p in model.named_parameters():
        assert p is params[name], name  # the same Parameter: optimizers keep pointing at it
        fp32 = name.startswith(("bn.", "island."))
        assert p.dtype == (torch.float32 if fp32 else half), name
        expected = originals[name] if fp32 else originals[name].to(half)
        assert torch.equal(p.detach(), expected), name
    assert optimizer.param_groups[0]["params"][0] is model.conv.weight
    assert model.bn.running_var.dtype == torch.float32
    assert model.bn.num_batches_tracked.dtype == torch.long


def test_cast_model_casts_floating_buffers_only():
    module = WithBuffers()
    cast_model(module, torch.float16, set())
    assert module.scale.dtype == torch.float16 and module.scale[0].item() == 1.0  # rounded
    assert module.count.dtype == torch.long and module.count.item() == 7
    assert module.absent is None and module.lin.weight.dtype == torch.float16
    kept = WithBuffers()
    cast_model(kept, torch.float16, {kept})  # own parameters and buffers kept; children not
    assert kept.scale.dtype == torch.float32 and kept.lin.weight.dtype == torch.float16


# ------------------------------------------------------------------ MasterWeights
def setup_masters(half: torch.dtype):
    model = model_for_test()
    originals = [p.detach().clone() for p in model.parameters()]
    model.conv.bias.requires_grad_(False)  # a frozen parameter keeps being frozen
    optimizer = torch.optim.SGD([
        {"params": [model.conv.weight, model.conv.bias, *model.bn.parameters()], "lr": 0.5},
        {"params": [*model.ln.parameters(), *model.head.parameters()]},
    ], lr=0.1)
    kept = modules_kept_fp32(model, [])
    masters = MasterWeights(model, optimizer, half, kept)
    return model, optimizer, masters, originals


@pytest.mark.parametrize("half", HALF, ids=str)
def test_masters_are_fp32_clones_with_every_bit_and_replace_the_half_params(half):
    model, optimizer, masters, originals = setup_masters(half)
    casted = [model.conv.weight, model.conv.bias, model.ln.weight, model.ln.bias,
              model.head.weight, model.head.bias]
    assert same(masters.model_params, casted)
    by_name = dict(zip([n for n, _ in model.named_parameters()], originals))
    for param, master in zip(masters.model_params, masters.masters):
        name = next(n for n, p in model.named_parameters() if p is param)
        assert master is not param and isinstance(master, nn.Parameter)
        assert master.dtype == torch.float32 and torch.equal(master.detach(), by_name[name])
        assert param.dtype == half and torch.equal(param.detach(), by_name[name].to(half))
        assert master.requires_grad == param.requires_grad
    assert not masters.masters[1].requires_grad  # conv.bias was frozen
    first, second = optimizer.param_groups
    assert first["lr"] == 0.5 and second["lr"] == 0.1  # groups and their options stay
    assert same(first["params"], [masters.masters[0], masters.masters[1], model.bn.weight,
                                  model.bn.bias])  # the fp32 batch norm is not copied
    assert same(second["params"], masters.masters[2:])
    assert same(masters.map_params([model.head.weight, model.bn.weight, model.conv.weight]),
                [masters.masters[4], model.bn.weight, masters.masters[0]])


def test_grads_are_copied_up_and_the_half_grads_freed():
    model, _, masters, _ = setup_masters(torch.float16)
    grads = {}
    for param in masters.model_params:
        if param.requires_grad:
            grads[param] = torch.randn(param.shape).to(torch.float16)
            param.grad = grads[param].clone()
    model.ln.bias.grad = None  # a parameter that got no gradient
    stale = masters.masters[3]
    stale.grad = torch.ones_like(stale)
    masters.copy_grads_to_masters()
    for param, master in zip(masters.model_params, masters.masters):
        assert param.grad is None
        if param is model.ln.bias or not param.requires_grad:
            assert master.grad is None  # not a stale gradient from an earlier step
        else:
            assert master.grad.dtype == torch.float32
            assert torch.equal(master.grad, grads[param].float())


@pytest.mark.parametrize("half", HALF, ids=str)
def test_optimizer_updates_the_masters_and_copy_back_writes_rounded_values(half):
    model, optimizer, masters, originals = setup_masters(half)
    for param in masters.model_params:
        param.grad = torch.full(param.shape, 2 ** -16, dtype=half)  # below half resolution
    masters.copy_grads_to_masters()
    optimizer.step()
    masters.copy_masters_to_model()
    head = position(masters.model_params, model.head.weight)
    master = masters.masters[head]
    original = dict(zip([n for n, _ in model.named_parameters()], originals))["head.weight"]
    assert torch.equal(master.detach(), original - 0.1 * 2 ** -16)  # the fp32 update is kept
    assert not torch.equal(master.detach(), original)
    for param, master in zip(masters.model_params, masters.masters):
        assert param.dtype == half and torch.equal(param.detach(), master.detach().to(half))
    # BN was no master: the optimizer updated the model's own fp32 parameter.
    assert model.bn.weight.dtype == torch.float32 and model.bn.weight.grad is None


def test_load_fp32_sets_masters_by_model_parameter_id():
    model, _, masters, _ = setup_masters(torch.bfloat16)
    before = [m.detach().clone() for m in masters.masters]
    value = torch.full(model.head.weight.shape, ODD)
    masters.load_fp32({id(model.head.weight): value, id(model.bn.weight): torch.zeros(2)})
    head = position(masters.model_params, model.head.weight)
    for i, master in enumerate(masters.masters):
        assert torch.equal(master.detach(), value if i == head else before[i])
    assert masters.masters[head].dtype == torch.float32 and masters.masters[head][0, 0] == ODD
    assert model.bn.weight.abs().sum() > 0  # not a master: left alone
    assert model.head.weight[0, 0].item() != ODD  # the model changes at copy-back only
    masters.copy_masters_to_model()
    assert torch.equal(model.head.weight.detach(), value.to(torch.bfloat16))


def test_masters_must_be_made_before_the_first_step():
    model = nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    with pytest.raises(UserError, match="before the optimizer's first step"):
        MasterWeights(model, optimizer, torch.float16, set())
    assert model.weight.dtype == torch.float32  # nothing was cast


class _Tied(nn.Module):
    """An embedding and an output layer sharing one weight (a language model's head)."""

    def __init__(self) -> None:
        super().__init__()
        self.token = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.token.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.token(ids))


@pytest.mark.parametrize("precision", ["bf16-true", "bf16-master"])
def test_an_fp32_island_with_a_tied_half_weight_is_refused(precision):
    from amptrain.precision import Precision

    model = _Tied()
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(UserError, match="keep_fp32: 'head' shares its weight with 'token'"):
        Precision(precision, keep_fp32=["head"], device="cpu").setup(model, optimizer)
    # fp32 weights: nothing to refuse, and the tie holds
    model, _ = Precision("bf16-mixed", keep_fp32=["head"], device="cpu").setup(
        _Tied(), torch.optim.AdamW(_Tied().parameters()))
    assert model.head.weight is model.token.weight


def test_masters_by_name_are_the_fp32_copies():
    from amptrain.precision import Precision

    model = nn.Sequential(nn.Linear(3, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = Precision("bf16-master", device="cpu")
    model, optimizer = precision.setup(model, optimizer)
    state = precision.fp32_state_dict(model)
    assert model[0].weight.dtype == torch.bfloat16 and state["0.weight"].dtype == torch.float32
    assert torch.equal(state["0.weight"],
                       precision.policy_of(optimizer).master.masters[0].detach())
