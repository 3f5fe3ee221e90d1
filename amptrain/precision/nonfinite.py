"""Module hooks that find where a non-finite value first appears."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ..common import nested


def _tensors(value: Any) -> list[torch.Tensor]:
    # A model's output may be a dataclass of tensors: its attributes are looked into too.
    return nested.tensors(value, attributes=True)


def _nonfinite(value: Any) -> bool:
    return any(t.is_floating_point() and not bool(torch.isfinite(t).all())
               for t in _tensors(value))


def first_nonfinite_module(model: nn.Module, run: Callable[[], Any]) -> tuple[str, str] | None:
    """Run ``run()`` (a forward and, if it likes, a backward) with hooks on every module.

    Returns ``(qualified_name, "forward" | "backward")``: the first module, in execution
    order, whose output held inf/NaN, or else the first whose output's gradient did.
    Gradient hooks sit on output tensors rather than on modules, which keeps in-place
    activations (``ReLU(inplace=True)``) working.
    """
    forward: list[str] = []
    backward: list[str] = []
    handles = []
    for name, module in model.named_modules():
        label = name or type(module).__name__

        def on_grad(grad: torch.Tensor, label: str = label) -> None:
            if not backward and not bool(torch.isfinite(grad).all()):
                backward.append(label)

        # on_grad is bound as a default: a closure would see the loop's last on_grad.
        def forward_hook(mod: nn.Module, args: Any, output: Any, label: str = label,
                         on_grad: Any = on_grad) -> None:
            if not forward and _nonfinite(output):
                forward.append(label)
            for t in _tensors(output):
                if t.requires_grad and t.is_floating_point():
                    t.register_hook(on_grad)

        handles.append(module.register_forward_hook(forward_hook))
    try:
        run()
    except RuntimeError:
        pass  # a NaN may make the loss or backward raise; the hooks already saw it
    finally:
        for handle in handles:
            handle.remove()
    if forward:
        return forward[0], "forward"
    if backward:
        return backward[0], "backward"
    return None


def floating_tensors(value: Any) -> list[torch.Tensor]:
    """The floating-point tensors inside a module's inputs or outputs (nested containers too)."""
    return [t for t in _tensors(value) if t.is_floating_point()]


def extremes(tensor: torch.Tensor) -> torch.Tensor:
    """[min, max] of a non-empty tensor, on its device (inf/NaN propagate into them).

    One vectorised pass; ``linalg.vector_norm(t, inf)`` and ``isfinite(t).all()`` are
    about ten times slower on CPU.
    """
    return torch.stack(torch.aminmax(tensor.detach())).float()


@dataclass(frozen=True)
class NonFiniteEvent:
    """Where a non-finite value first appeared: module, phase, optimizer step (1-based),
    and the loss it belongs to (``loss_id`` of the backward that ran it or that followed
    the forward; None when unknown). ``part`` is the model part holding the module (the
    name in ``Task.models``), filled in by who knows the parts (diagnose)."""

    module: str
    phase: str           # "forward" (the module's output) or "backward" (its output's gradient)
    step: int
    loss_scale: float | None = None
    loss_id: int | None = None
    part: str | None = None


class NonFiniteWatch:
    """Hooks on every module that remember the first inf/NaN over many training steps.

    Unlike :func:`first_nonfinite_module` it never reads the device while training:
    each check queues one device-side reduction (the tensor's :func:`extremes`, which
    are inf/NaN exactly when the tensor holds one), and :meth:`first` reads them all
    once. ``step_of()`` tells the hooks which optimizer step is running (0-based);
    ``scale_of()`` may return the loss-scale tensor of that step; ``loss_of()`` the
    ``loss_id`` of the backward in flight (e.g. ``lambda: precision.backward_loss_id``),
    else None. A gradient's check is the in-flight loss's; a forward output's is the loss
    whose backward runs next (the loss that forward computed).
    """

    def __init__(self, model: nn.Module, step_of: Callable[[], int],
                 scale_of: Callable[[], torch.Tensor | None] = lambda: None,
                 loss_of: Callable[[], int | None] = lambda: None) -> None:
        self._step_of = step_of
        self._scale_of = scale_of
        self._loss_of = loss_of
        self._events: list[tuple[str, str, int]] = []
        self._losses: list[int | None] = []     # each event's loss_id
        self._unassigned = 0                    # first forward event with no loss yet
        self._peaks: list[torch.Tensor] = []
        self._scales: dict[int, torch.Tensor | None] = {}
        self._handles: list[Any] = []
        for name, module in model.named_modules():
            self._handles.append(module.register_forward_hook(
                self._forward_hook(name or type(module).__name__)))

    def _check(self, tensors: list[torch.Tensor], label: str, phase: str) -> None:
        if not tensors:
            return
        step = self._step_of()
        if self._scales.get(step) is None:
            # A GradScaler creates its scale at the first backward, after step 1's forward.
            scale = self._scale_of()
            self._scales[step] = scale.detach().clone() if scale is not None else None
        loss = self._loss_of() if phase == "backward" else None
        if loss is not None:  # the forwards since the last backward computed this loss
            for i in range(self._unassigned, len(self._losses)):
                if self._losses[i] is None and self._events[i][1] == "forward":
                    self._losses[i] = loss
            self._unassigned = len(self._losses)
        for t in tensors:
            if t.numel():
                self._peaks.append(extremes(t))
                self._events.append((label, phase, step))
                self._losses.append(loss)

    def _forward_hook(self, label: str) -> Callable:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            tensors = floating_tensors(output)
            self._check(tensors, label, "forward")
            for t in tensors:
                if t.requires_grad:
                    t.register_hook(lambda grad: self._check([grad], label, "backward"))
        return hook

    def remove(self) -> None:
        """Take the hooks off the model (the recorded events stay readable)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def reset(self) -> None:
        """Forget the checks queued so far (a long run reads and resets them in turns,
        so what is held stays bounded)."""
        self._events.clear()
        self._losses.clear()
        self._unassigned = 0
        self._peaks.clear()
        self._scales.clear()

    def first(self) -> NonFiniteEvent | None:
        """The first non-finite event seen, or None (reads the device once)."""
        if not self._peaks:
            return None
        device = self._peaks[0].device
        bad = ~torch.isfinite(torch.stack([p.to(device) for p in self._peaks])).all(dim=1)
        if not bool(bad.any()):
            return None
        index = int(bad.to(torch.uint8).argmax())
        label, phase, step = self._events[index]
        scale = self._scales.get(step)
        return NonFiniteEvent(label, phase, step + 1,
                              None if scale is None else float(scale.item()),
                              loss_id=self._losses[index])
