"""precision/loss_scales.py: one loss scale shared by every loss, or one per loss, on real
GradScalers and real gradients (CPU)."""
from __future__ import annotations

import torch

from amptrain.precision.loss_scales import LossScales
from amptrain.precision.modes import MODES
from amptrain.precision.policies import PlainWeights
from amptrain.precision.options import ScalerSettings

SETTINGS = ScalerSettings(init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5,
                          growth_interval=1000)


def _weight() -> tuple[torch.nn.Parameter, torch.optim.SGD]:
    w = torch.nn.Parameter(torch.ones(4))
    return w, torch.optim.SGD([w], lr=0.5)


def test_shared_scales_every_loss_by_one_scale():
    scales = LossScales("cpu", MODES["16-mixed"], SETTINGS)
    loss = torch.tensor(3.0)
    assert scales.scale(loss).item() == 3.0 * 1024 and scales.scale(loss, loss_id=1).item() == 3072
    assert scales.scales() == {0: 1024.0} and not scales.separate
    assert scales.scale_tensor is not None and scales.scale_tensor.item() == 1024.0
    assert set(scales.state_dict()) == {"scaler"}


def test_a_mode_without_loss_scaling_passes_the_loss_through_and_keeps_no_scale():
    scales = LossScales("cpu", MODES["bf16-mixed"], SETTINGS, separate=True)
    loss = torch.tensor(3.0)
    assert scales.scale(loss) is loss
    assert not scales.separate  # only fp16 modes scale, so only they can scale apart
    assert scales.scales() == {} and scales.scale_tensor is None
    assert scales.state_dict() == {"scaler": {}}


def test_shared_step_unscales_then_steps_with_the_true_gradient():
    scales = LossScales("cpu", MODES["16-mixed"], SETTINGS)
    w, optimizer = _weight()
    scales.backward((2.0 * w).sum(), 0, [(w, w)], [PlainWeights(optimizer)])
    assert torch.equal(w.grad, torch.full((4,), 2048.0))  # scaled
    scales.unscale_(optimizer, PlainWeights(optimizer))
    found = scales.step_guard.step(optimizer, own_flag=False)
    scales.update()
    assert found.item() == 0.0
    assert torch.equal(w.detach(), torch.zeros(4))  # 1 - 0.5 * 2: the true gradient stepped


def test_shared_overflow_skips_the_step_and_backs_the_scale_off():
    scales = LossScales("cpu", MODES["16-mixed"], SETTINGS)
    w, optimizer = _weight()
    scales.backward((w * float("inf")).sum(), 0, [(w, w)], [PlainWeights(optimizer)])
    scales.unscale_(optimizer, PlainWeights(optimizer))
    found = scales.step_guard.step(optimizer, own_flag=False)
    scales.update()
    assert found.item() == 1.0 and torch.equal(w.detach(), torch.ones(4))  # skipped
    assert scales.scales() == {0: 512.0}


def test_separate_scales_unscale_each_loss_at_once_and_sum_true_gradients():
    scales = LossScales("cpu", MODES["16-mixed"], SETTINGS, separate=True)
    w, optimizer = _weight()
    policy = PlainWeights(optimizer)
    scales.backward((3.0 * w).sum(), 0, policy.grad_links(), [policy])
    assert torch.equal(w.grad, torch.full((4,), 3.0))  # unscaled right after its backward
    scales.backward((2.0 * w).sum(), 1, policy.grad_links(), [policy])
    assert torch.equal(w.grad, torch.full((4,), 5.0))  # both losses' true gradients
    scales.update()
    assert scales.scales() == {0: 1024.0, 1: 1024.0}


def test_one_loss_overflowing_backs_off_only_its_own_scale():
    scales = LossScales("cpu", MODES["16-mixed"], SETTINGS, separate=True)
    w, optimizer = _weight()
    policy = PlainWeights(optimizer)
    scales.backward((w * float("inf")).sum(), 0, policy.grad_links(), [policy])
    scales.backward((2.0 * w).sum(), 1, policy.grad_links(), [policy])
    scales.unscale_(optimizer, policy)
    found = scales.step_guard.step(optimizer, own_flag=False)
    scales.update()
    assert found.item() == 1.0 and torch.equal(w.detach(), torch.ones(4))  # the step skipped
    assert scales.scales() == {0: 512.0, 1: 1024.0}


def test_state_round_trips_per_loss_and_an_older_layout_restores_the_first():
    scales = LossScales("cpu", MODES["16-mixed"], SETTINGS, separate=True)
    w, optimizer = _weight()
    policy = PlainWeights(optimizer)
    scales.backward((w * float("inf")).sum(), 0, policy.grad_links(), [policy])
    scales.backward((2.0 * w).sum(), 1, policy.grad_links(), [policy])
    scales.update()
    state = scales.state_dict()
    assert set(state) == {"scaler", "loss_scalers"} and set(state["loss_scalers"]) == {"0", "1"}

    again = LossScales("cpu", MODES["16-mixed"], SETTINGS, separate=True)
    again.load_state_dict(state)
    assert again.scales() == {0: 512.0, 1: 1024.0}

    shared = LossScales("cpu", MODES["16-mixed"], SETTINGS)
    shared.load_state_dict(state)  # a shared scaler takes the first loss's scale
    assert shared.scales() == {0: 512.0}
    apart = LossScales("cpu", MODES["16-mixed"], SETTINGS, separate=True)
    apart.load_state_dict(shared.state_dict())  # and separate ones a shared file's
    assert apart.scales() == {0: 512.0}


def test_loading_into_a_mode_without_a_scaler_changes_nothing():
    scales = LossScales("cpu", MODES["32-true"], SETTINGS)
    scales.load_state_dict({"scaler": {"scale": 8.0}})
    assert scales.scales() == {} and scales.state_dict() == {"scaler": {}}
