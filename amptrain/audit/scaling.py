"""Traps of the loss scaler: ``clip-before-unscale``, ``scheduler-on-skipped-step``,
``checkpoint-without-scaler``, ``scaler-with-bf16`` and ``fp16-without-scaler``.

The observer follows each iteration as GradScaler sees it: ``scale`` opens it, ``unscale_``
marks an optimizer's gradients as true values, ``step`` either steps the optimizer or skips
it (the optimizer's step hooks did not fire), ``update`` closes it.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from .findings import AuditReport, Finding, user_location
from .observer import Observer, at


def _mentions(obj: Any, test: Any, depth: int = 3) -> bool:
    """Whether ``obj`` or a dict/list/tuple value inside it (to ``depth``) passes ``test``."""
    if test(obj):
        return True
    if depth and isinstance(obj, dict):
        return any(_mentions(v, test, depth - 1) for v in obj.values())
    if depth and isinstance(obj, (list, tuple)):
        return any(_mentions(v, test, depth - 1) for v in obj)
    return False


def _is_optimizer_state(obj: Any) -> bool:
    return isinstance(obj, torch.optim.Optimizer) or (
        isinstance(obj, dict) and "state" in obj and "param_groups" in obj)


def _is_model_state(obj: Any) -> bool:
    return isinstance(obj, torch.nn.Module) or (
        isinstance(obj, dict) and bool(obj) and all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()))


def _is_scaler_state(obj: Any) -> bool:
    return isinstance(obj, torch.amp.GradScaler) or (
        isinstance(obj, dict) and "scale" in obj and "_growth_tracker" in obj)


class ScalerTraps:
    """Watches GradScaler, gradient clipping, LR schedulers and checkpoint saves."""

    def __init__(self) -> None:
        self.observer: Observer | None = None
        self.scaling = False        # an enabled scaler scaled a loss
        self.scaler_site = ""       # where it first did
        self.scaler: Any = None     # the scaler that scaled the loss under way (its scale
        #                             is read only where a finding needs it: no host read per step)
        self.pending = False        # a loss was scaled and update() not called yet
        self.unscaled: set[int] = set()
        self.stepped: set[int] = set()
        self.skipped: dict[int, bool] = {}
        self.clips: dict[str, tuple[float, float, float]] = {}
        self.late_schedules: dict[str, list[int]] = {}
        self.saves: list[str] = []
        self.half_params: set[str] = set()

    def install(self, observer: Observer) -> None:
        self.observer = observer
        observer.step_post.append(self._stepped)
        scaler = torch.amp.grad_scaler.GradScaler
        observer.patch(scaler, "scale", self._wrap_scale)
        observer.patch(scaler, "unscale_", self._wrap_unscale)
        observer.patch(scaler, "step", self._wrap_step)
        observer.patch(scaler, "update", self._wrap_update)
        for owner in (torch.nn.utils, torch.nn.utils.clip_grad):
            observer.patch(owner, "clip_grad_norm_", self._wrap_clip)
        observer.patch(torch.optim.lr_scheduler.LRScheduler, "step", self._wrap_schedule)
        observer.patch(torch, "save", self._wrap_save)
        try:
            import torch.distributed.checkpoint as dcp  # deferred: optional, and slow to import
        except ImportError:  # pragma: no cover - builds without torch.distributed
            return
        observer.patch(dcp, "save", self._wrap_save)

    def scale(self) -> float:
        """The loss scale of the iteration under way (a host read: only for a finding)."""
        return float(self.scaler.get_scale()) if self.scaler is not None else 0.0

    # -- GradScaler ---------------------------------------------------------------------
    def _wrap_scale(self, original: Any) -> Any:
        def scale(scaler: Any, outputs: Any) -> Any:
            if scaler.is_enabled():
                if not self.scaling:
                    self.scaling, self.scaler_site = True, user_location()
                self.pending = True
                self.scaler = scaler
            return original(scaler, outputs)
        return scale

    def _wrap_unscale(self, original: Any) -> Any:
        def unscale_(scaler: Any, optimizer: Any) -> Any:
            self.unscaled.add(id(optimizer))
            return original(scaler, optimizer)
        return unscale_

    def _wrap_step(self, original: Any) -> Any:
        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            self.stepped.discard(id(optimizer))
            result = original(scaler, optimizer, *args, **kwargs)
            if scaler.is_enabled():
                self.skipped[id(optimizer)] = id(optimizer) not in self.stepped
            return result
        return step

    def _wrap_update(self, original: Any) -> Any:
        def update(scaler: Any, *args: Any, **kwargs: Any) -> Any:
            self.pending = False
            self.unscaled.clear()
            return original(scaler, *args, **kwargs)
        return update

    def _stepped(self, optimizer: torch.optim.Optimizer) -> None:
        self.stepped.add(id(optimizer))
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.dtype == torch.bfloat16 and self.observer is not None and \
                        len(self.half_params) < 3:
                    self.half_params.add(self.observer.name_of(p) or "?")

    # -- clipping, schedules, saves -----------------------------------------------------
    def _wrap_clip(self, original: Any) -> Any:
        def clip_grad_norm_(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> Any:
            early = self.pending and not self.unscaled
            norm = original(parameters, max_norm, *args, **kwargs)
            if early:    # kept: the first measurement with a finite norm (step 1 may overflow)
                site, measured = user_location(), float(norm)
                if site not in self.clips or not math.isfinite(self.clips[site][1]):
                    self.clips[site] = (float(max_norm), measured, self.scale())
            return norm
        return clip_grad_norm_

    def _wrap_schedule(self, original: Any) -> Any:
        def step(scheduler: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(scheduler, "_step_count", 0) > 0:     # not the constructor's own call
                key = id(scheduler.optimizer)
                site = user_location()
                counts = self.late_schedules.setdefault(site, [0, 0])
                counts[1] += 1
                if self.skipped.pop(key, False):
                    counts[0] += 1
            return original(scheduler, *args, **kwargs)
        return step

    def _wrap_save(self, original: Any) -> Any:
        def save(obj: Any, *args: Any, **kwargs: Any) -> Any:
            # Model and optimizer in one file, as a resume needs them; an optimizer saved
            # alone (transformers' optimizer.pt, beside scaler.pt) is not judged.
            if self.scaling and _mentions(obj, _is_optimizer_state) \
                    and _mentions(obj, _is_model_state) and not _mentions(obj, _is_scaler_state):
                self.saves.append(user_location())
            return original(obj, *args, **kwargs)
        return save

    # -- findings -----------------------------------------------------------------------
    def finish(self, report: AuditReport) -> None:
        for site, (max_norm, norm, scale) in self.clips.items():
            report.add(Finding(
                "clip-before-unscale", "error", at("clip_grad_norm_", site),
                f"gradients clipped to max_norm={max_norm:g} while they still carried the loss "
                f"scale {scale:g}: measured norm {norm:.4g}, i.e. {norm / (scale or 1):.4g} "
                "unscaled, so the clip acts on the wrong numbers",
                "call scaler.unscale_(optimizer) before clip_grad_norm_"))
        for site, (late, total) in self.late_schedules.items():
            if late:
                report.add(Finding(
                    "scheduler-on-skipped-step", "warning", at("lr_scheduler.step", site),
                    f"{late} of {total} scheduler steps followed an optimizer step that the "
                    "GradScaler skipped (non-finite gradients): the LR schedule runs ahead "
                    "of the weights",
                    "step the scheduler only when scaler.step() stepped (the scale did not drop)"))
        for site in dict.fromkeys(self.saves):
            report.add(Finding(
                "checkpoint-without-scaler", "warning", at("save", site),
                "a checkpoint of model and optimizer was saved while a GradScaler is in "
                "use, without the scaler's state: a resume starts from the initial scale "
                "again and skips steps until it has come down",
                "save scaler.state_dict() in the checkpoint and load it on resume"))
        observer = self.observer
        if observer is None or not self.scaling:
            if observer is not None and report.steps:
                for (device, dtype), site in observer.autocasts.items():
                    if dtype == torch.float16:
                        report.add(Finding(
                            "fp16-without-scaler", "warning", at(f"autocast({device})", site),
                            f"autocast to float16 ran for {report.steps} optimizer steps with "
                            "no GradScaler: gradients below 6e-8 flush to zero in fp16",
                            "scale the loss with torch.amp.GradScaler, or autocast to bfloat16"))
            return
        dtypes = {dtype for _device, dtype in observer.autocasts}
        if torch.float16 not in dtypes and (torch.bfloat16 in dtypes or self.half_params):
            why = ("autocast ran in bfloat16" if torch.bfloat16 in dtypes else
                   f"the weights are bfloat16 ({', '.join(sorted(self.half_params))})")
            report.add(Finding(
                "scaler-with-bf16", "warning", at("GradScaler", self.scaler_site),
                f"a GradScaler scales the loss (scale {self.scale():g}) but {why} and no fp16 "
                "autocast ran: bf16 has fp32's range, the scaler only costs time and can skip "
                "steps",
                "drop the GradScaler with bf16 (or autocast to float16 if fp16 was meant)"))
