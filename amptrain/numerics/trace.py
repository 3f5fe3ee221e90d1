"""The first non-finite value, traced to its module: which module's forward output (or,
failing that, the gradient arriving at its output) first held inf/NaN in execution order,
whether that module's inputs were finite, the step and the rank -- one line for the user
and ``nonfinite.json`` in the run directory.

Nothing runs on healthy steps: the step that turned non-finite is replayed afterwards
(:func:`replay`) from references to its micro-batches, with hooks on every module, the
model's buffers and RNG put back afterwards and its gradients dropped.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..precision.nonfinite import floating_tensors

NONFINITE_JSON = "nonfinite.json"


@dataclass(frozen=True)
class NonFiniteTrace:
    """Where a step's first non-finite value appeared. ``module`` None: the replay was
    finite (the loss or the optimizer's arithmetic overflowed, or the step cannot be
    replayed: ``note`` says which). ``phase``: ``forward`` (the module's output) or
    ``backward`` (the gradient at its output). ``exact``: the replay ran on the weights the
    step itself used."""

    step: int
    rank: int
    module: str | None
    phase: str | None
    inputs_finite: bool | None
    exact: bool
    note: str = ""

    def line(self) -> str:
        """The one line shown in the output."""
        rank = f" on rank {self.rank}" if self.rank else ""
        if self.module is None:
            return f"amptrain: step {self.step}{rank} turned non-finite; {self.note}"
        inputs = "its inputs were finite" if self.inputs_finite \
            else "its inputs were already non-finite"
        what = "output" if self.phase == "forward" else "gradient at its output"
        return (f"amptrain: step {self.step}{rank} turned non-finite: first in module "
                f"'{self.module}' ({self.phase}: its {what} held inf/NaN; {inputs})")

    def write(self, out: Path) -> Path:
        """``nonfinite.json`` in ``out`` (rank > 0: ``nonfinite.rank<N>.json``)."""
        name = NONFINITE_JSON if not self.rank else f"nonfinite.rank{self.rank}.json"
        path = out / name
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path


def _finite(tensors: Sequence[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def first_nonfinite(model: nn.Module, run: Callable[[], Any]
                    ) -> tuple[str, str, bool] | None:
    """Run ``run()`` (a forward and a backward) with hooks on every module of ``model``:
    ``(module, phase, inputs finite)`` of the first module, in execution order, whose
    forward output held inf/NaN, else the first whose output's gradient did; None if all
    were finite. Reads the device in every hook: for the slow path only."""
    forward: list[tuple[str, str, bool]] = []
    backward: list[tuple[str, str, bool]] = []
    handles = []

    def hook(label: str) -> Callable:
        def on_forward(module: nn.Module, args: Any, output: Any) -> None:
            outputs = floating_tensors(output)
            inputs_finite = _finite(floating_tensors(args))
            if not forward and not _finite(outputs):
                forward.append((label, "forward", inputs_finite))
            for t in outputs:
                if t.requires_grad:
                    t.register_hook(lambda grad: backward.append(
                        (label, "backward", inputs_finite))
                        if not backward and not _finite([grad]) else None)
        return on_forward

    for name, module in model.named_modules():
        handles.append(module.register_forward_hook(hook(name or type(module).__name__)))
    try:
        run()
    except RuntimeError:
        pass  # a NaN may make a loss or a backward raise: the hooks saw it first
    finally:
        for handle in handles:
            handle.remove()
    found = forward or backward
    return found[0] if found else None


def replay(model: nn.Module, micro_batches: Sequence[Any],
           run_one: Callable[[Any], None]) -> tuple[str, str, bool] | None:
    """:func:`first_nonfinite` over a step's micro-batches (``run_one(batch)``: its forward
    and backward), stopping at the first that finds one. The model's buffers (BatchNorm
    statistics) and the RNG are as before afterwards; the caller drops the gradients."""
    buffers = list(model.buffers())
    saved = [b.detach().clone() for b in buffers]
    rng = torch.get_rng_state()
    try:
        for batch in micro_batches:
            found = first_nonfinite(model, functools.partial(run_one, batch))
            if found is not None:
                return found
        return None
    finally:
        torch.set_rng_state(rng)
        with torch.no_grad():
            for b, s in zip(buffers, saved):
                b.copy_(s)
