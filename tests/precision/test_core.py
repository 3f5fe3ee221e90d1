"""The precision layer: loss scaling, skipping, master weights, fp32 islands."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from amptrain import Precision
from amptrain.common.errors import TrainingHalted, UserError
from tests.conftest import tiny_classification, tiny_mlp


def _setup(name: str, **options):
    model = tiny_mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    precision = Precision(name, device="cpu", **options)
    model, optimizer = precision.setup(model, optimizer)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    return precision, model, optimizer, scheduler


def _backward(precision, model, data, inject_inf: bool = False):
    x, y = data.tensors[0][:32], data.tensors[1][:32]
    with precision.autocast():
        loss = F.cross_entropy(model(x), y)
    if inject_inf:
        # Poison exactly one parameter's gradient, as an fp16 overflow would.
        model.head.weight.register_hook(lambda g: torch.full_like(g, float("inf")))
    precision.backward(loss)


def _snapshot(model, optimizer):
    return ([p.detach().clone() for p in model.parameters()],
            copy.deepcopy(optimizer.state_dict()["state"]))


def test_fp16_inf_skips_step_backs_off_scale_and_keeps_lr():
    data = tiny_classification()
    precision, model, optimizer, scheduler = _setup("16-mixed", init_scale=1024.0,
                                                    backoff_factor=0.25)
    for _ in range(2):  # real steps first, so optimizer state exists
        _backward(precision, model, data)
        assert precision.step(optimizer)
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    params, state = _snapshot(model, optimizer)
    lr = optimizer.param_groups[0]["lr"]
    scale = precision.loss_scale

    handle_model = model  # the hook is registered on a parameter and fires once
    _backward(precision, handle_model, data, inject_inf=True)
    precision.clip_grad_norm_(model.parameters(), 1.0)
    stepped = precision.step(optimizer)
    if stepped:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)

    assert stepped is False
    assert precision.skipped_steps == 1
    assert precision.loss_scale == scale * 0.25
    assert optimizer.param_groups[0]["lr"] == lr
    for before, after in zip(params, model.parameters()):
        assert torch.equal(before, after)
    after_state = optimizer.state_dict()["state"]
    for key in state:
        for name, value in state[key].items():
            assert torch.equal(value, after_state[key][name]), name


def test_fp16_scale_grows_after_growth_interval_clean_steps():
    data = tiny_classification()
    precision, model, optimizer, _ = _setup("16-mixed", init_scale=256.0, growth_interval=3,
                                            growth_factor=4.0)
    scales = []
    for _ in range(7):
        _backward(precision, model, data)
        precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        scales.append(precision.loss_scale)
    assert scales == [256.0, 256.0, 1024.0, 1024.0, 1024.0, 4096.0, 4096.0]


def test_scale_floor_stops_with_advice():
    data = tiny_classification()
    precision, model, optimizer, _ = _setup("16-mixed", init_scale=4.0, min_scale=1.0)
    with pytest.raises(TrainingHalted) as err:
        for _ in range(5):
            model.head.weight.register_hook(lambda g: torch.full_like(g, float("nan")))
            _backward(precision, model, data)
            precision.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
    message = str(err.value)
    assert "bf16-mixed" in message and "diagnose" in message and "\n" not in message


def test_bf16_nonfinite_is_skipped_counted_then_halts_with_one_line():
    data = tiny_classification()
    precision, model, optimizer, _ = _setup("bf16-mixed", max_bad_steps=3)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = data.tensors[0][:16].clone(), data.tensors[1][:16]
    x[0, 0] = float("nan")
    for _ in range(2):
        with precision.autocast():
            loss = F.cross_entropy(model(x), y)
        precision.backward(loss)
        assert precision.step(optimizer) is False
        optimizer.zero_grad(set_to_none=True)
    assert precision.skipped_steps == 2 and precision.loss_scale is None
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with precision.autocast():
        loss = F.cross_entropy(model(x), y)
    precision.backward(loss)
    with pytest.raises(TrainingHalted) as err:
        precision.confirm(precision.step_async(optimizer), step=7)
    assert "3 consecutive steps" in str(err.value) and "step 7" in str(err.value)
    assert "\n" not in str(err.value)


def test_nonfinite_skip_with_non_fused_optimizer():
    model = tiny_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # no found_inf support
    precision = Precision("32-true", device="cpu")
    model, optimizer = precision.setup(model, optimizer)
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.full((2, 8), float("inf"))).sum()
    precision.backward(loss)
    assert precision.step(optimizer) is False
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("name,half", [("16-master", torch.float16),
                                       ("bf16-master", torch.bfloat16)])
def test_master_modes_keep_fp32_masters_and_half_model(name, half):
    data = tiny_classification()
    precision, model, optimizer, _ = _setup(name)
    assert all(p.dtype == half for p in model.parameters())
    masters = [p for g in optimizer.param_groups for p in g["params"]]
    assert masters and all(p.dtype == torch.float32 for p in masters)
    for _ in range(3):
        _backward(precision, model, data)
        assert precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
    # The half model is the rounded master: updates below half resolution are kept in fp32.
    for p, m in zip(model.parameters(), masters):
        assert torch.equal(p, m.to(half))
        assert p.grad is None
    state = precision.fp32_state_dict(model)
    assert all(v.dtype == torch.float32 for v in state.values())
    assert torch.equal(state["head.weight"], masters[-2])


@pytest.mark.parametrize("name,half", [("16-true", torch.float16), ("bf16-true", torch.bfloat16)])
def test_true_half_modes_have_no_masters(name, half):
    precision, model, optimizer, _ = _setup(name)
    assert all(p.dtype == half for g in optimizer.param_groups for p in g["params"])


def test_half_modes_keep_batchnorm_fp32():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 36, 2))
    optimizer = torch.optim.AdamW(model.parameters())
    precision = Precision("bf16-master", device="cpu")
    model, optimizer = precision.setup(model, optimizer)
    assert model[0].weight.dtype == torch.bfloat16
    assert model[1].weight.dtype == torch.float32 and model[1].running_var.dtype == torch.float32
    with precision.autocast():
        loss = model(torch.randn(4, 1, 8, 8)).float().sum()
    precision.backward(loss)
    assert precision.step(optimizer)


@pytest.mark.parametrize("name", ["16-mixed", "bf16-mixed", "bf16-true"])
def test_keep_fp32_head_outputs_fp32_under_autocast(name):
    model = tiny_mlp()
    precision = Precision(name, device="cpu", keep_fp32=["head"])
    model, _ = precision.setup(model, torch.optim.AdamW(model.parameters()))
    with precision.autocast():
        hidden = model.body(torch.randn(4, 8))
        out = model(torch.randn(4, 8))
    assert hidden.dtype != torch.float32
    assert out.dtype == torch.float32
    assert model.head.weight.dtype == torch.float32


def test_keep_fp32_unknown_pattern_is_a_user_error():
    precision = Precision("bf16-mixed", device="cpu", keep_fp32=["decoder.*"])
    with pytest.raises(UserError, match="--keep-fp32 'decoder.\\*' matches no module"):
        precision.setup(tiny_mlp(), None)


def test_cpu_fp16_conv_backward_matches_reference_kernel():
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 5, 3, padding=1)
    reference = copy.deepcopy(conv)
    x = torch.randn(2, 3, 6, 6)
    precision = Precision("16-mixed", device="cpu")
    precision.setup(conv, None)
    with precision.autocast():
        out = conv(x)
    out.float().square().sum().backward()
    with torch.autocast("cpu", dtype=torch.float16):
        ref_out = reference(x)
    ref_out.float().square().sum().backward()
    assert out.dtype == ref_out.dtype == torch.float16
    assert torch.equal(out, ref_out)
    # Same maths; our backward accumulates in fp32 (like a GPU) so it may differ by rounding.
    torch.testing.assert_close(conv.weight.grad, reference.weight.grad, rtol=2e-3, atol=2e-3)
    torch.testing.assert_close(conv.bias.grad, reference.bias.grad, rtol=2e-3, atol=2e-3)


def test_state_dict_round_trip_restores_scale():
    data = tiny_classification()
    precision, model, optimizer, _ = _setup("16-mixed", init_scale=512.0)
    _backward(precision, model, data, inject_inf=True)
    precision.step(optimizer)
    state = precision.state_dict()
    other = Precision("16-mixed", device="cpu")
    other.setup(tiny_mlp(), None)
    other.load_state_dict(state)
    _backward(other, tiny_mlp(), data)  # scale is created lazily on first use
    assert other.loss_scale == 256.0 and other.skipped_steps == 1


# ------------------------------------------- misuse by a library caller (issue 28, class 4)
def _pair(precision: Precision):
    model = nn.Linear(4, 2)
    return precision.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))


@pytest.mark.parametrize("name", ["32-true", "16-mixed", "bf16-master"])
def test_step_without_backward_is_amptrains_error(name):
    precision = Precision(name, device="cpu")
    model, optimizer = _pair(precision)
    with pytest.raises(UserError, match=r"step\(\) came without a backward\(\)"):
        precision.step(optimizer)
    with precision.autocast():
        loss = model(torch.randn(3, 4)).float().mean()
    precision.backward(loss)
    precision.step(optimizer)  # the right order works, and a second step needs a backward
    with pytest.raises(UserError, match="without a backward"):
        precision.step(optimizer)


def test_a_loss_that_is_not_one_number_is_refused():
    precision = Precision("16-mixed", device="cpu")
    model, _ = _pair(precision)
    with pytest.raises(UserError, match=r"scalar loss \(one number\), got shape \(3,\)"):
        precision.backward(model(torch.randn(3, 4)).sum(1))
    with pytest.raises(UserError, match="needs the loss as a torch.Tensor"):
        precision.backward(1.5)


@pytest.mark.parametrize("name", ["bf16-master", "16-master", "bf16-mixed"])
def test_a_second_model_and_optimizer_get_their_own_masters(name):
    # Issue 25 replaced the refusal of a second pair in master-weight modes (issue 28):
    # each pair keeps its own fp32 masters (tests/precision/test_pairs.py trains them).
    precision = Precision(name, device="cpu")
    first, first_opt = _pair(precision)
    second, second_opt = _pair(precision)
    masters = [precision.policy_of(o).stepped_params(m.parameters())
               for m, o in ((first, first_opt), (second, second_opt))]
    assert not {id(t) for t in masters[0]} & {id(t) for t in masters[1]}
    assert all(t.dtype == torch.float32 for ts in masters for t in ts)


def test_the_same_optimizer_twice_is_refused():
    precision = Precision("bf16-mixed", device="cpu")
    model, optimizer = _pair(precision)
    with pytest.raises(UserError, match="this optimizer is set up already"):
        precision.setup(model, optimizer)
