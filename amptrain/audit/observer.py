"""The observer: patches torch's training entry points for the length of an audit, lets
each trap module watch the calls it cares about, and puts everything back on close.

Every wrapper calls torch's own function with the arguments it was given and returns its
result unchanged; measurements are made on copies. So an audited script computes exactly
what it computes without the audit (tests/audit checks its losses bit for bit).
"""
from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch

from .findings import AuditReport, user_location


class Trap(Protocol):
    """A group of related checks: installs its wrappers, then adds its findings on close."""

    def install(self, observer: Observer) -> None: ...

    def finish(self, report: AuditReport) -> None: ...


class Observer:
    """Watches optimizer steps, autocast regions and whatever the ``traps`` patch.

    ``steps``: call ``on_limit`` after that many optimizer steps (all optimizers together).
    """

    def __init__(self, traps: list[Trap], steps: int | None = None,
                 on_limit: Callable[[], None] | None = None) -> None:
        self.report = AuditReport()
        self.traps = traps
        self.steps = steps
        self.on_limit = on_limit
        #: > 0 while an optimizer's step runs (its own lerp_/mul_ are not the user's).
        self.in_step = 0
        #: (device type, dtype, user's file:line) of each enabled autocast region entered.
        self.autocasts: dict[tuple[str, torch.dtype], str] = {}
        self.step_pre: list[Callable[[torch.optim.Optimizer], None]] = []
        self.step_post: list[Callable[[torch.optim.Optimizer], None]] = []
        self._undo: list[Callable[[], None]] = []
        self._names: dict[int, str] = {}
        self._closed = False

    # -- patching ---------------------------------------------------------------------
    def patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        """Replace ``owner.name`` by ``make(original)`` until :meth:`close`."""
        original = getattr(owner, name)
        setattr(owner, name, make(original))
        self._undo.append(lambda: setattr(owner, name, original))

    def install(self) -> Observer:
        """Install the step hooks, the autocast watch and every trap's wrappers."""
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)
        pre = register_optimizer_step_pre_hook(self._before_step)
        post = register_optimizer_step_post_hook(self._after_step)
        self._undo += [pre.remove, post.remove]
        observer = self

        def watch_autocast(enter: Any) -> Any:
            def __enter__(self: Any) -> Any:
                if getattr(self, "_enabled", False):
                    key = (str(self.device), self.fast_dtype)
                    observer.autocasts.setdefault(key, user_location())
                return enter(self)
            return __enter__

        self.patch(torch.amp.autocast_mode.autocast, "__enter__", watch_autocast)
        for trap in self.traps:
            trap.install(self)
        return self

    def close(self) -> AuditReport:
        """Put torch back and let each trap add its findings; returns the report."""
        if not self._closed:
            self._closed = True
            while self._undo:
                self._undo.pop()()
            for trap in self.traps:
                trap.finish(self.report)
        return self.report

    # -- optimizer steps --------------------------------------------------------------
    def _before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.in_step += 1
        for hook in self.step_pre:
            hook(optimizer)

    def _after_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self.in_step = max(0, self.in_step - 1)
        for hook in self.step_post:
            hook(optimizer)
        self.report.steps += 1
        if self.steps is not None and self.report.steps >= self.steps and self.on_limit:
            self.on_limit()

    # -- names ------------------------------------------------------------------------
    def name_of(self, tensor: torch.Tensor) -> str:
        """The parameter's name in its model (``fc.weight``), found among the live modules
        the first time it is asked for; '' when no module holds it."""
        if id(tensor) not in self._names:
            modules = [m for m in gc.get_objects() if issubclass(type(m), torch.nn.Module)]
            children = {id(c) for m in modules for c in m.children()}
            for root in modules:
                if id(root) not in children:
                    for name, param in root.named_parameters():
                        self._names.setdefault(id(param), name)
            self._names.setdefault(id(tensor), "")
        return self._names[id(tensor)]

    def names(self, tensors: list[torch.Tensor], most: int = 3) -> str:
        """Up to ``most`` parameter names, and how many more."""
        named = [self.name_of(t) or "?" for t in tensors]
        more = f" (+{len(named) - most} more)" if len(named) > most else ""
        return ", ".join(named[:most]) + more


def weak_set() -> weakref.WeakSet[Any]:
    """A set that does not keep the script's objects alive."""
    return weakref.WeakSet()


def at(what: str, site: str) -> str:
    """A finding's ``where``: ``what (file:line)``."""
    return f"{what} ({site})" if what and site else what or site
