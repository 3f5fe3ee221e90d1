"""Several models, losses and optimizers on one Precision (issue 25): every pair trains,
each optimizer skips alone, one scale update per iteration, PyTorch's recipe to the bit,
resume to the bit, and today's one-pair state still loads."""
from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from amptrain.common.errors import UserError
from amptrain.precision import MODES, Precision

MODE_NAMES = list(MODES)
SCALING = [m for m in MODE_NAMES if MODES[m].loss_scaling]
#: Half weights without masters, with each update rule.
RULES = [("bf16-true", "kahan"), ("bf16-true", "stochastic"), ("16-true", "kahan")]


def _precision(name: str, **options) -> Precision:
    """A Precision in ``name`` on the CPU, or a skip naming why this machine refuses it."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # emulated modes say so; not what is tested
            return Precision(name, device="cpu", **options)
    except UserError as error:
        pytest.skip(f"{name} on this CPU: {error}")


def _parts(n: int, seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 4)) for _ in range(n)]


def _optimizers(parts: list[nn.Module]) -> list[torch.optim.Optimizer]:
    # Different optimizers on purpose: SGD with momentum first, then Adam.
    return [torch.optim.SGD(p.parameters(), lr=0.05, momentum=0.9) if i == 0
            else torch.optim.Adam(p.parameters(), lr=1e-2) for i, p in enumerate(parts)]


def _batch(iteration: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + iteration)
    x = torch.randn(16, 4, generator=g)
    return x, torch.tanh(x.flip(1))


def _losses(parts: list[nn.Module], autocast, x: torch.Tensor, y: torch.Tensor, i: int):
    """Part i's loss; part i also feeds on part i-1's output (not detached), so a later
    loss leaves gradients on an earlier part, as a GAN's generator loss does on D."""
    with autocast():
        h = x if i == 0 else parts[i - 1](x)
        return F.mse_loss(parts[i](h).float(), y)


class Loop:
    """The recipe: zero every gradient, then per part backward(loss_i, loss_id=i) and
    step(opt_i) (each zeroing its own gradients), then one update()."""

    def __init__(self, name: str, n: int, make_optimizers=_optimizers, **options) -> None:
        self.precision = _precision(name, **options)
        self.parts, self.optimizers = [], []
        parts = _parts(n)
        for part, optimizer in zip(parts, make_optimizers(parts)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                part, optimizer = self.precision.setup(part, optimizer)
            self.parts.append(part)
            self.optimizers.append(optimizer)
        self.iteration = 0
        self.losses: list[list[float]] = []

    def run(self, iterations: int, poison: dict[int, int] | None = None) -> list[list[bool]]:
        """``poison``: {iteration: part}: that part's first weight gets an inf gradient."""
        stepped = []
        for _ in range(iterations):
            x, y = _batch(self.iteration)
            for optimizer in self.optimizers:
                optimizer.zero_grad(set_to_none=True)
            for part in self.parts:
                part.zero_grad(set_to_none=True)
            bad = (poison or {}).get(self.iteration)
            hook = None if bad is None else self.parts[bad][0].weight.register_hook(
                lambda g: torch.full_like(g, math.inf))
            outcomes, losses = [], []
            for i, optimizer in enumerate(self.optimizers):
                loss = _losses(self.parts, self.precision.autocast, x, y, i)
                self.precision.backward(loss, loss_id=i)
                outcomes.append(self.precision.step_async(optimizer))
                optimizer.zero_grad(set_to_none=True)
                losses.append(loss.detach())
            self.precision.update()
            if hook is not None:
                hook.remove()
            stepped.append([self.precision.confirm(o) for o in outcomes])
            self.losses.append([float(v) for v in losses])
            self.iteration += 1
        return stepped

    def weights(self) -> list[dict[str, torch.Tensor]]:
        """Each part's fp32 weights (masters where kept), copied."""
        return [{k: v.clone() for k, v in self.precision.fp32_state_dict(p).items()}
                for p in self.parts]

    def optimizer_states(self) -> list[dict]:
        return [copy.deepcopy(o.state_dict()) for o in self.optimizers]


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        bits = (lambda t: t.reshape(-1).view(torch.uint8)) if a.is_floating_point() \
            else (lambda t: t)
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(bits(a), bits(b)))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


# ------------------------------------------------------------------ every pair trains
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("name", MODE_NAMES)
def test_every_model_trains(name, n):
    loop = Loop(name, n)
    before = loop.weights()
    assert all(loop.run(30)[-1])
    after = loop.weights()
    for i in range(n):
        assert not _same(before[i], after[i]), f"part {i} never moved"
        first, last = loop.losses[0][i], sum(r[i] for r in loop.losses[-5:]) / 5
        assert last < first, f"part {i}: loss {first} -> {last}"


@pytest.mark.parametrize("name,rule", RULES)
def test_every_model_trains_with_a_weight_rule(name, rule):
    loop = Loop(name, 2, weight_update=rule)
    before = loop.weights()
    loop.run(20)
    after = loop.weights()
    assert all(not _same(b, a) for b, a in zip(before, after))
    assert loop.losses[-1][0] < loop.losses[0][0] and loop.losses[-1][1] < loop.losses[0][1]
    rules = [loop.precision.policy_of(o).rule for o in loop.optimizers]
    assert all(r is not None for r in rules) and rules[0] is not rules[1]


# ----------------------------------------------------------- each optimizer skips alone
@pytest.mark.parametrize("bad", ["first", "last"])
@pytest.mark.parametrize("name", MODE_NAMES)
def test_inf_in_one_optimizer_skips_only_that_one(name, bad):
    loop = Loop(name, 3, init_scale=2.0 ** 10, backoff_factor=0.25)
    loop.run(2)   # real steps first: every optimizer has its state
    part = 0 if bad == "first" else 2
    weights, states = loop.weights(), loop.optimizer_states()
    scale = loop.precision.loss_scale
    stepped = loop.run(1, poison={2: part})[0]
    assert stepped == [i != part for i in range(3)]
    after, after_states = loop.weights(), loop.optimizer_states()
    for i in range(3):
        untouched = _same(weights[i], after[i]) and _same(states[i], after_states[i])
        assert untouched == (i == part), f"part {i}"
    assert [loop.precision.skipped_steps_of(o) for o in loop.optimizers] == \
        [int(i == part) for i in range(3)]
    assert loop.precision.skipped_steps == 1
    if scale is not None:   # one backoff for the iteration
        assert loop.precision.loss_scale == scale * 0.25
    assert all(loop.run(1)[0])   # and the next iteration steps them all


# ----------------------------------------------------------------- the loss scale
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("name", SCALING)
def test_one_scale_update_per_iteration(name, n):
    loop = Loop(name, n, init_scale=2.0 ** 4, growth_interval=1)
    loop.run(3)
    assert loop.precision.loss_scale == 2.0 ** 7   # grew once per iteration, not per step
    loop.run(1, poison={3: n - 1})
    assert loop.precision.loss_scale == 2.0 ** 6   # one backoff


def test_with_one_optimizer_step_updates_and_update_is_a_no_op():
    loop = Loop("16-mixed", 1, init_scale=2.0 ** 4, growth_interval=1)
    x, y = _batch(0)
    prec, optimizer = loop.precision, loop.optimizers[0]
    prec.backward(_losses(loop.parts, prec.autocast, x, y, 0))
    prec.step(optimizer)
    assert prec.loss_scale == 2.0 ** 5
    prec.update()
    assert prec.loss_scale == 2.0 ** 5


@pytest.mark.parametrize("name", ["16-mixed", "bf16-mixed"])
def test_stepping_one_of_several_optimizers_twice_without_update_is_refused(name):
    loop = Loop(name, 2)
    prec, optimizer = loop.precision, loop.optimizers[0]
    x, y = _batch(0)
    for _ in range(2):
        prec.backward(_losses(loop.parts, prec.autocast, x, y, 0))
        if _ == 0:
            prec.step(optimizer)
    with pytest.raises(UserError, match=r"came twice without precision.update\(\)"):
        prec.step(optimizer)
    with pytest.raises(UserError, match="pass the optimizer explicitly"):
        prec.step()


def test_separate_loss_scales_back_off_only_the_overflowing_loss():
    loop = Loop("16-mixed", 2, init_scale=2.0 ** 10, separate_loss_scales=True)
    loop.run(1)
    assert loop.precision.loss_scales() == {0: 2.0 ** 10, 1: 2.0 ** 10}
    # Part 0's weight gets an inf gradient from loss 0 (and from loss 1, through part 0):
    # both losses overflow, part 0 skips, part 1 steps.
    assert loop.run(1, poison={1: 0})[0] == [False, True]
    assert loop.precision.loss_scales() == {0: 2.0 ** 9, 1: 2.0 ** 9}
    # Only loss 1's backward overflows (a hook on part 1's weight): only scale 1 backs off.
    assert loop.run(1, poison={2: 1})[0] == [True, False]
    assert loop.precision.loss_scales() == {0: 2.0 ** 9, 1: 2.0 ** 8}
    assert loop.precision.loss_scale == 2.0 ** 9


@pytest.mark.parametrize("name", SCALING)
def test_separate_scales_equal_the_shared_scale_while_nothing_overflows(name):
    # Powers of two scale and unscale exactly: unscaling after each backward (separate)
    # gives the same bits as unscaling at the step (shared), masters included.
    shared, separate = Loop(name, 3), Loop(name, 3, separate_loss_scales=True)
    shared.run(4)
    separate.run(4)
    assert _same(shared.weights(), separate.weights())
    assert _same(shared.optimizer_states(), separate.optimizer_states())


# ---------------------------------------------------------------- PyTorch's recipe
@pytest.mark.parametrize("fused", [False, True])
def test_16_mixed_equals_pytorchs_recipe_to_the_bit(fused):
    """PyTorch's "Working with Multiple Models, Losses, and Optimizers": one GradScaler,
    scaler.scale(loss_i).backward(), scaler.step(opt_i), one scaler.update()."""
    prec = _precision("16-mixed")
    if prec.emulated_fast:
        pytest.skip("16-mixed is emulated on this CPU (its autocast is amptrain's, not torch's)")
    options = dict(init_scale=2.0 ** 12, growth_interval=2)
    poison = {3: 1, 5: 0}

    def optimizers(parts):
        return [torch.optim.Adam(p.parameters(), lr=1e-2, fused=fused) for p in parts]

    ours = Loop("16-mixed", 2, make_optimizers=optimizers, **options)
    ref_parts = _parts(2)
    ref_opts = optimizers(ref_parts)
    ours.run(8, poison=poison)

    scaler = torch.amp.GradScaler("cpu", **options)
    scales = []
    for iteration in range(8):
        x, y = _batch(iteration)
        for o in ref_opts:
            o.zero_grad(set_to_none=True)
        hook = ref_parts[poison[iteration]][0].weight.register_hook(
            lambda g: torch.full_like(g, math.inf)) if iteration in poison else None
        for i, o in enumerate(ref_opts):
            loss = _losses(ref_parts, lambda: torch.autocast("cpu", dtype=torch.float16),
                           x, y, i)
            scaler.scale(loss).backward()
            scaler.step(o)
            o.zero_grad(set_to_none=True)
        scaler.update()
        scales.append(scaler.get_scale())
        if hook is not None:
            hook.remove()
    assert _same([p.state_dict() for p in ours.parts], [p.state_dict() for p in ref_parts])
    assert _same(ours.optimizer_states(), [copy.deepcopy(o.state_dict()) for o in ref_opts])
    assert ours.precision.loss_scale == scales[-1]
    assert [ours.precision.skipped_steps_of(o) for o in ours.optimizers] == [1, 1]


def test_32_true_equals_a_plain_loop_to_the_bit():
    ours = Loop("32-true", 3)
    ours.run(6)
    parts = _parts(3)
    optimizers = _optimizers(parts)
    for iteration in range(6):
        x, y = _batch(iteration)
        for o in optimizers:
            o.zero_grad(set_to_none=True)
        for i, o in enumerate(optimizers):
            _losses(parts, torch.enable_grad, x, y, i).backward()
            o.step()
            o.zero_grad(set_to_none=True)
    assert _same([p.state_dict() for p in ours.parts], [p.state_dict() for p in parts])
    assert _same(ours.optimizer_states(), [copy.deepcopy(o.state_dict()) for o in optimizers])


# ------------------------------------------------------------------------- resume
def _resume_cases():
    for name in MODE_NAMES:
        yield pytest.param(name, {}, id=name)
    for name in SCALING:
        yield pytest.param(name, {"separate_loss_scales": True}, id=f"{name}-separate")
    for name, rule in RULES:
        yield pytest.param(name, {"weight_update": rule}, id=f"{name}-{rule}")


@pytest.mark.parametrize("name,options", list(_resume_cases()))
def test_state_dict_mid_run_then_continuing_equals_the_uninterrupted_run(name, options):
    options = {"init_scale": 2.0 ** 10, "growth_interval": 2, **options}
    poison = {1: 0, 4: 1}
    straight = Loop(name, 2, **options)
    straight.run(6, poison=poison)

    first = Loop(name, 2, **options)
    first.run(3, poison=poison)
    saved = copy.deepcopy({"precision": first.precision.state_dict(),
                           "models": first.weights(), "optimizers": first.optimizer_states()})
    resumed = Loop(name, 2, **options)
    for part, optimizer, weights, state in zip(resumed.parts, resumed.optimizers,
                                               saved["models"], saved["optimizers"]):
        resumed.precision.load_fp32_state_dict(part, weights)
        optimizer.load_state_dict(state)
    resumed.precision.load_state_dict(saved["precision"])
    resumed.iteration = 3
    resumed.run(3, poison=poison)

    assert _same(straight.weights(), resumed.weights())
    assert _same([p.state_dict() for p in straight.parts], [p.state_dict() for p in resumed.parts])
    assert _same(straight.optimizer_states(), resumed.optimizer_states())
    assert straight.precision.loss_scales() == resumed.precision.loss_scales()
    assert [straight.precision.skipped_steps_of(o) for o in straight.optimizers] == \
        [resumed.precision.skipped_steps_of(o) for o in resumed.optimizers] == [1, 1]
    assert _same(straight.precision.weight_rule_buffers(),
                 resumed.precision.weight_rule_buffers())


@pytest.mark.parametrize("name,rule", [("16-mixed", "plain"), ("bf16-true", "kahan")])
def test_todays_one_pair_state_loads(name, rule):
    loop = Loop(name, 1, weight_update=rule, init_scale=2.0 ** 10)
    loop.run(3, poison={1: 0})
    state = loop.precision.state_dict()
    old = {k: state[k] for k in ("name", "scaler", "skipped_steps", "consecutive_skips")}
    old["weight_update"] = state["pairs"][0]["weight_update"]   # the format before issue 25
    other = Loop(name, 1, weight_update=rule, init_scale=2.0 ** 3)
    # a file of that format has no section version (0): its one migration brings it up
    other.precision.load_state_dict(other.precision.migrate({"precision": copy.deepcopy(old)}, 0))
    assert other.precision.skipped_steps == 1
    assert other.precision.skipped_steps_of(other.optimizers[0]) == 1
    assert other.precision.loss_scales() == loop.precision.loss_scales()
    assert _same(other.precision.weight_rule_buffers(), loop.precision.weight_rule_buffers())
    assert [{k: p[k] for k in ("skipped_steps", "consecutive_skips")} for p in state["pairs"]] \
        == [{"skipped_steps": 1, "consecutive_skips": 0}]


@pytest.mark.parametrize("name", ["16-master", "bf16-master"])
def test_in_master_modes_optimizer_zero_grad_clears_the_half_models_gradients(name):
    # G's loss leaves half gradients on D, whose optimizer holds D's masters: zero_grad()
    # must clear them, or D's next step would add them to its own (Apex O2 does the same).
    loop = Loop(name, 2)
    x, y = _batch(0)
    loop.precision.backward(_losses(loop.parts, loop.precision.autocast, x, y, 1), loss_id=1)
    assert loop.parts[0][0].weight.grad is not None
    loop.optimizers[0].zero_grad()
    assert all(p.grad is None for p in loop.parts[0].parameters())
    loop.precision.teardown()
    assert "zero_grad" not in vars(loop.optimizers[0])


def test_stepping_an_optimizer_whose_model_got_no_gradient_is_amptrains_error():
    # D's loss sees G's output detached: stepping G before G's own loss is a user's slip.
    loop = Loop("16-mixed", 2)
    x, y = _batch(0)
    with loop.precision.autocast():
        loss = F.mse_loss(loop.parts[1](loop.parts[0](x).detach()).float(), y)
    loop.precision.backward(loss)
    with pytest.raises(UserError, match="no parameter of this SGD has a gradient"):
        loop.precision.step(loop.optimizers[0])
