"""Traps of half-precision weights: ``half-optimizer-state``, ``update-below-ulp`` and
``half-ema``.

``update-below-ulp`` is measured, not guessed: on sampled steps the observer copies each
fp16/bf16 parameter before the optimizer steps, and counts the elements whose gradient was
non-zero (so the update was meant to move them) and which came out of the step unchanged:
their update was under half an ulp of the weight and rounded away.

``half-ema`` is measured the same way on an averaged copy of the weights kept in fp16/bf16:
elements where the model's weight differs from the copy (the average should move) and the
copy did not move. Two forms of EMA are watched: ``torch.optim.swa_utils.AveragedModel``
(``update_parameters``) and an in-place ``lerp_`` / ``torch._foreach_lerp_`` into a
half-precision tensor that is not being trained (no gradient), outside an optimizer's step.
A hand-written ``ema.mul_(d).add_(p, alpha=1 - d)`` is not recognised.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .findings import AuditReport, Finding, user_location
from .measure import Lost, is_half, sampled, share_text
from .observer import Observer, at

#: Share of lost updates from which a finding is made.
LOST_SHARE = 0.01


class WeightTraps:
    """Watches optimizer steps over half-precision weights, and EMA copies."""

    def __init__(self) -> None:
        self.observer: Observer | None = None
        self.seen: set[int] = set()
        self.half_state: list[tuple[str, str, str, str]] = []
        self.step_site: dict[int, str] = {}
        self.steps: dict[int, int] = {}
        self.before: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.ulp: dict[int, Lost] = {}
        self.ema: dict[str, Lost] = {}
        self.ema_calls: dict[str, int] = {}
        self.ulp_names: dict[int, str] = {}
        self.measuring = False

    def install(self, observer: Observer) -> None:
        self.observer = observer
        observer.step_pre.append(self._before_step)
        observer.step_post.append(self._after_step)
        from torch.optim import swa_utils  # deferred: only for its class, to patch
        observer.patch(swa_utils.AveragedModel, "update_parameters", self._wrap_averaged)
        observer.patch(torch.Tensor, "lerp_", self._wrap_lerp)
        observer.patch(torch, "_foreach_lerp_", self._wrap_foreach_lerp)

    # -- optimizer steps ----------------------------------------------------------------
    def _before_step(self, optimizer: torch.optim.Optimizer) -> None:
        count = self.steps[id(optimizer)] = self.steps.get(id(optimizer), 0) + 1
        if id(optimizer) not in self.step_site:
            self.step_site[id(optimizer)] = user_location()
        self.before = []
        if sampled(count):
            self.before = [(p, p.detach().clone(), p.grad.detach() != 0)
                           for group in optimizer.param_groups for p in group["params"]
                           if is_half(p) and p.grad is not None]

    def _after_step(self, optimizer: torch.optim.Optimizer) -> None:
        with torch.no_grad():
            for param, old, should in self.before:
                if id(param) not in self.ulp and self.observer is not None:
                    self.ulp_names[id(param)] = self.observer.name_of(param)
                lost = self.ulp.setdefault(id(param), Lost(dtype=str(param.dtype)))
                lost.count(param.detach() != old, should)
        self.before = []
        if id(optimizer) not in self.seen:
            self.seen.add(id(optimizer))
            self._check_state(optimizer)

    def _check_state(self, optimizer: torch.optim.Optimizer) -> None:
        half = []
        dtypes = set()
        for group in optimizer.param_groups:
            for p in group["params"]:
                state = optimizer.state.get(p, {})
                moments = [v for v in state.values() if isinstance(v, torch.Tensor)
                           and v.is_floating_point() and v.numel() == p.numel() and v.numel() > 1]
                if is_half(p) and moments and all(is_half(v) for v in moments):
                    half.append(p)
                    dtypes |= {str(v.dtype) for v in moments}
        if half and self.observer is not None:
            total = sum(len(g["params"]) for g in optimizer.param_groups)
            self.half_state.append((
                type(optimizer).__name__, self.observer.names(half),
                self.step_site.get(id(optimizer), ""),
                f"{len(half)} of {total} parameters and their optimizer state "
                f"({', '.join(sorted(dtypes))}) are half precision, with no fp32 master copy"))

    # -- EMA ----------------------------------------------------------------------------
    def _measure(self, site: str, targets: Sequence[torch.Tensor], ends: Sequence[torch.Tensor],
                 apply: Any) -> Any:
        count = self.ema_calls[site] = self.ema_calls.get(site, 0) + 1
        pairs = [(t, e) for t, e in zip(targets, ends) if is_half(t)]
        if self.measuring or not pairs or not sampled(count):
            return apply()
        self.measuring = True
        with torch.no_grad():
            olds = [t.detach().clone() for t, _ in pairs]
            should = [e.detach().to(t.dtype) != o for (t, e), o in zip(pairs, olds)]
        try:
            result = apply()
        finally:
            self.measuring = False
        with torch.no_grad():
            lost = self.ema.setdefault(site, Lost(dtype=str(pairs[0][0].dtype)))
            for (t, _), old, want in zip(pairs, olds, should):
                lost.count(t.detach() != old, want)
        return result

    def _is_ema_target(self, tensor: Any) -> bool:
        return (self.observer is not None and not self.observer.in_step and is_half(tensor)
                and not tensor.requires_grad)

    def _wrap_lerp(self, original: Any) -> Any:
        def lerp_(tensor: torch.Tensor, end: Any, weight: Any) -> Any:
            if not (self._is_ema_target(tensor) and isinstance(end, torch.Tensor)):
                return original(tensor, end, weight)
            return self._measure(user_location(), [tensor], [end],
                                 lambda: original(tensor, end, weight))
        return lerp_

    def _wrap_foreach_lerp(self, original: Any) -> Any:
        def _foreach_lerp_(tensors: Any, ends: Any, weight: Any) -> Any:
            tensors, ends = list(tensors), list(ends)
            if not (tensors and self._is_ema_target(tensors[0])):
                return original(tensors, ends, weight)
            return self._measure(user_location(), tensors, ends,
                                 lambda: original(tensors, ends, weight))
        return _foreach_lerp_

    def _wrap_averaged(self, original: Any) -> Any:
        def update_parameters(averaged: Any, model: torch.nn.Module) -> Any:
            if int(averaged.n_averaged) == 0:
                return original(averaged, model)
            site = user_location()
            ours = list(averaged.module.parameters())
            theirs = list(model.parameters())
            return self._measure(site, ours, theirs, lambda: original(averaged, model))
        return update_parameters

    # -- findings -----------------------------------------------------------------------
    def finish(self, report: AuditReport) -> None:
        for name, params, site, detail in self.half_state:
            report.add(Finding(
                "half-optimizer-state", "error", at(f"{name} over {params}", site), detail,
                "keep fp32 weights and optimizer state (autocast for compute), or an fp32 "
                "master copy"))
        losses = {i: lost for i, lost in self.ulp.items() if lost.total}
        if losses:
            whole = Lost(sum(x.lost for x in losses.values()),
                         sum(x.total for x in losses.values()))
            if whole.share >= LOST_SHARE:
                worst = sorted(losses.items(), key=lambda kv: -kv[1].share)[:3]
                names = ", ".join(f"{self.ulp_names.get(i) or '?'} {100 * x.share:.0f} %"
                                  for i, x in worst)
                dtypes = ", ".join(sorted({x.dtype for x in losses.values()}))
                site = next(iter(self.step_site.values()), "")
                report.add(Finding(
                    "update-below-ulp", "warning",
                    at(self.ulp_names.get(worst[0][0]) or "", site),
                    f"{share_text(whole)} of the updates to {dtypes} weights were under half "
                    f"an ulp and rounded away (sampled steps; worst: {names})",
                    "keep fp32 master weights (autocast for compute), or raise the update "
                    "(lr) relative to the weights"))
        for site, lost in self.ema.items():
            if lost.total and lost.share >= LOST_SHARE:
                report.add(Finding(
                    "half-ema", "warning", at("EMA", site),
                    f"the averaged copy is {lost.dtype}: {share_text(lost)} of its element "
                    "updates were lost to rounding (sampled updates)",
                    "keep the EMA/averaged weights in float32"))
