"""The ``half-loss`` trap: a loss, softmax or log-sum-exp whose result comes out in fp16 or
bf16, so its reduction ran in half precision.

Under autocast, the ops on autocast's fp32 list return float32 whatever their input; an op
that returns a half tensor therefore ran outside autocast or outside that list (a softmax
by hand on an fp16 model, a loss of a ``.half()`` model). The first call at each place is
measured against the same op in float32 (on copies; the script's own result is returned).
"""
from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from .findings import AuditReport, Finding, user_location
from .measure import is_half
from .observer import Observer, at

#: (module or class, attribute) of each watched reduction.
WATCHED: list[tuple[Any, str]] = [
    (F, name) for name in ("cross_entropy", "nll_loss", "mse_loss", "l1_loss",
                           "binary_cross_entropy_with_logits", "kl_div", "softmax", "log_softmax")]
WATCHED += [(torch, name) for name in ("softmax", "log_softmax", "logsumexp")]
WATCHED += [(torch.Tensor, name) for name in ("softmax", "log_softmax", "logsumexp")]


def _to_float(value: Any) -> Any:
    return value.float() if is_half(value) else value


class LossTraps:
    """Wraps the losses and softmax-like reductions of :data:`WATCHED`."""

    def __init__(self) -> None:
        self.inside = False
        self.found: dict[str, tuple[str, str, float, int]] = {}

    def install(self, observer: Observer) -> None:
        for owner, name in WATCHED:
            observer.patch(owner, name, functools.partial(self._wrap, name))

    def _wrap(self, name: str, original: Any) -> Any:
        def reduction(*args: Any, **kwargs: Any) -> Any:
            if self.inside:      # F.softmax calls Tensor.softmax: count the outer call only
                return original(*args, **kwargs)
            self.inside = True
            try:
                result = original(*args, **kwargs)
                if is_half(result) and args and is_half(args[0]):
                    site = user_location()
                    if site not in self.found:
                        self.found[site] = self._measure(name, original, result, args, kwargs)
            finally:
                self.inside = False
            return result
        return reduction

    @staticmethod
    def _measure(name: str, original: Any, result: torch.Tensor, args: Any,
                 kwargs: Any) -> tuple[str, str, float, int]:
        with torch.no_grad(), torch.autocast("cpu", enabled=False):
            reference = original(*[_to_float(a) for a in args],
                                 **{k: _to_float(v) for k, v in kwargs.items()})
            error = (result.detach().float() - reference).abs().max()
            scale = reference.abs().max().clamp_min(torch.finfo(torch.float32).tiny)
            return name, str(result.dtype), float(error / scale), result.numel()

    def finish(self, report: AuditReport) -> None:
        for site, (name, dtype, error, numel) in self.found.items():
            report.add(Finding(
                "half-loss", "warning", at(name, site),
                f"{name} computed and reduced in {dtype} ({numel:,} outputs): largest error "
                f"against float32 {error:.2e} of its largest value",
                f"call {name} on .float() inputs (or inside autocast, which runs it in fp32)"))
