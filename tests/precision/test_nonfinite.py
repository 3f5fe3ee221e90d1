"""amptrain/probe.py: where a non-finite value first appears (forward output or output
gradient), per call (first_nonfinite_module) or over many steps (NonFiniteWatch)."""
from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace

import torch
from torch import nn

from amptrain.models.range_demos import Scale
from amptrain.precision.nonfinite import (NonFiniteEvent, NonFiniteWatch, extremes,
                                       first_nonfinite_module, floating_tensors)
from amptrain.precision import Precision


class Sqrt(nn.Module):
    """Finite forward, but an infinite gradient wherever its input is exactly 0."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sqrt(x)


def overflowing(factor: float = 1e39) -> nn.Module:
    """tanh outputs times ``factor``: +-inf in fp32 from ``amplify`` on."""
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(
        body=nn.Sequential(nn.Linear(4, 8), nn.Tanh()), amplify=Scale(factor),
        head=nn.Linear(8, 2)))


def root_of_relu() -> nn.Module:
    """Finite forward; the gradient of ``relu``'s output is inf where it is 0."""
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(lin=nn.Linear(4, 4), relu=nn.ReLU(), root=Sqrt(),
                                      head=nn.Linear(4, 2)))
    with torch.no_grad():
        model.lin.bias[0] = -100.0  # unit 0 is always 0 after the ReLU
    return model


def hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) for m in model.modules())


X = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))


# ------------------------------------------------------------ first_nonfinite_module
def test_first_nonfinite_module_names_the_module_whose_output_overflowed():
    model = overflowing()
    where = first_nonfinite_module(model, lambda: model(X).sum().backward())
    assert where == ("amplify", "forward")  # not head or the whole model, which follow it
    assert hook_count(model) == 0  # hooks removed


def test_first_nonfinite_module_finds_a_gradient_that_overflowed():
    model = root_of_relu()
    out = model(X)
    assert torch.isfinite(out).all()
    assert first_nonfinite_module(model, lambda: model(X).sum().backward()) == ("relu", "backward")


def test_first_nonfinite_module_none_when_finite_and_root_named_by_class():
    model = overflowing(factor=2.0)
    assert first_nonfinite_module(model, lambda: model(X).sum().backward()) is None
    assert first_nonfinite_module(Scale(1e39), lambda: Scale(1e39)(X)) is None  # not hooked
    alone = Scale(1e39)
    assert first_nonfinite_module(alone, lambda: alone(X)) == ("Scale", "forward")


def test_first_nonfinite_module_survives_a_raising_run_and_inplace_activations():
    model = overflowing()

    def run() -> None:
        model(X)
        raise RuntimeError("loss is NaN")

    assert first_nonfinite_module(model, run) == ("amplify", "forward")
    assert hook_count(model) == 0
    torch.manual_seed(0)
    inplace = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 2))
    assert first_nonfinite_module(inplace, lambda: inplace(X).sum().backward()) is None
    assert inplace[0].weight.grad is not None


# ---------------------------------------------------------------- helpers
def test_floating_tensors_searches_nested_outputs():
    a, b, c = torch.ones(1), torch.zeros(2, dtype=torch.float16), torch.arange(3)
    output = {"logits": a, "rest": [(b, c), SimpleNamespace(loss=a, ids=c)], "name": "x"}
    found = floating_tensors(output)
    assert len(found) == 3 and found[0] is a and found[1] is b and found[2] is a
    assert floating_tensors(nn.Linear(1, 1)) == []  # a module's parameters are not outputs


def test_extremes_are_min_and_max_and_carry_inf_and_nan():
    assert torch.equal(extremes(torch.tensor([3.0, -2.0, 5.0])), torch.tensor([-2.0, 5.0]))
    half = extremes(torch.tensor([1.0, 2.0], dtype=torch.float16))
    assert half.dtype == torch.float32 and half.tolist() == [1.0, 2.0]
    assert extremes(torch.tensor([1.0, float("inf")])).tolist() == [1.0, float("inf")]
    assert extremes(torch.tensor([[1.0, float("-inf")]])).tolist() == [float("-inf"), 1.0]
    assert torch.isnan(extremes(torch.tensor([1.0, float("nan"), 2.0]))).all()
    assert extremes(torch.ones(2, requires_grad=True)).requires_grad is False


# ---------------------------------------------------------------- NonFiniteWatch
def test_watch_reports_the_first_forward_event_with_its_step_and_scale():
    model = overflowing()
    step = {"now": 0}
    scale = torch.tensor(1024.0)
    watch = NonFiniteWatch(model, lambda: step["now"], lambda: scale)
    model(X * 0).sum().backward()  # step 0: tanh(bias) * 1e39 is inf already
    step["now"] = 1
    scale.fill_(512.0)
    model(X).sum().backward()
    event = watch.first()
    assert event == NonFiniteEvent("amplify", "forward", 1, 1024.0)  # 1-based, that step's scale
    watch.remove()
    assert hook_count(model) == 0 and watch.first() == event  # events stay readable


def test_watch_skips_finite_steps_and_finds_a_later_gradient_event():
    model = root_of_relu()
    with torch.no_grad():
        model.lin.bias.fill_(100.0)  # first steps: nothing is 0 after the ReLU
    step = {"now": 0}
    watch = NonFiniteWatch(model, lambda: step["now"])
    for now in range(2):
        step["now"] = now
        model(X.abs()).sum().backward()
    assert watch.first() is None
    with torch.no_grad():
        model.lin.bias[0] = -100.0
    step["now"] = 2
    model(X).sum().backward()
    assert watch.first() == NonFiniteEvent("relu", "backward", 3, None)
    watch.remove()


def test_watch_without_any_checks_and_a_scale_that_appears_at_the_first_backward():
    model = overflowing()
    watch = NonFiniteWatch(model, lambda: 0)
    assert watch.first() is None
    watch.remove()
    scaler = {"scale": None}
    late = NonFiniteWatch(model, lambda: 0, lambda: scaler["scale"])
    out = model(X)  # forward: no scale yet (a GradScaler creates it at the first backward)
    scaler["scale"] = torch.tensor(8.0)
    out.sum().backward()
    assert late.first() == NonFiniteEvent("amplify", "forward", 1, 8.0)
    late.remove()


def two_losses(first: nn.Module, second: nn.Module) -> tuple[nn.Module, Precision]:
    """Two parts, each with its optimizer, each loss backpropagated by the Precision with
    its own loss_id (0: ``first``'s, 1: ``second``'s), as a GAN's step does."""
    model = nn.ModuleDict({"first": first, "second": second})
    precision = Precision("32-true", device="cpu")
    for part in (first, second):
        precision.setup(part, torch.optim.SGD(part.parameters(), lr=0.0))
    return model, precision


def test_watch_names_the_loss_of_the_backward_in_flight():
    finite = nn.Linear(4, 2)
    model, precision = two_losses(finite, root_of_relu())
    watch = NonFiniteWatch(model, lambda: 0, loss_of=lambda: precision.backward_loss_id)
    precision.backward(model["first"](X).sum(), loss_id=0)
    assert watch.first() is None and precision.backward_loss_id is None  # only during backward
    precision.backward(model["second"](X).sum(), loss_id=1)
    assert watch.first() == NonFiniteEvent("second.relu", "backward", 1, None, loss_id=1)
    watch.remove()


def test_watch_gives_a_forward_event_the_loss_whose_backward_follows():
    model, precision = two_losses(nn.Linear(4, 2), overflowing())
    watch = NonFiniteWatch(model, lambda: 0, loss_of=lambda: precision.backward_loss_id)
    precision.backward(model["first"](X).sum(), loss_id=0)
    out = model["second"](X)  # inf from second.amplify on: the forward of loss 1
    precision.backward(out.sum(), loss_id=1)
    assert watch.first() == NonFiniteEvent("second.amplify", "forward", 1, None, loss_id=1)
    watch.remove()
