"""Module hooks that find where a non-finite value first appears."""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if hasattr(value, "__dict__") and not isinstance(value, nn.Module):
        return [t for v in vars(value).values() for t in _tensors(v)]
    return []


def _nonfinite(value: Any) -> bool:
    return any(t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in _tensors(value))


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

        def forward_hook(mod: nn.Module, args: Any, output: Any, label: str = label) -> None:
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
