"""Per-layer telemetry on sampled steps: which modules are watched, the hooks that queue
their statistics, and when to sample (:class:`Schedule`, ``--numerics auto|off|N``).

Hooks exist only while a sampled step runs (:meth:`LayerRecorder.attach` before it,
:meth:`LayerRecorder.collect` after it): every other step runs the user's model untouched,
with no host sync and no work of ours. A sampled step queues each module's tensors (their
abs-max and a bounded copy of their rows, on the device) and, after the step, computes
every statistic for all of them at once (:func:`~.stats.many_stats`) and reads them in
one transfer.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..precision.nonfinite import floating_tensors
from .stats import abs_max, as_rows, many_stats

#: The module kinds watched (besides any whose class name says attention or norm).
WATCHED = (nn.Linear, nn.Bilinear, nn.modules.conv._ConvNd, nn.Embedding, nn.EmbeddingBag,
           nn.MultiheadAttention, nn.modules.batchnorm._NormBase, nn.LayerNorm,
           nn.GroupNorm, nn.RMSNorm)
#: ``auto``: the share of step time sampling may cost (the promise is 2 %; the period is
#: chosen for 1.5 %, so that one noisy measurement of a sampled step keeps within it).
AUTO_BUDGET = 0.015
#: ``auto``: the shortest period (a sampled step measured as no dearer than a plain one
#: is a noisy measurement, not a free sample).
AUTO_MIN_PERIOD = 10
#: ``auto``: plain steps timed (after step 1) before the first sampled step.
AUTO_BASELINE = 8
TENSORS = ("activation", "weight", "gradient")


def watched(module: nn.Module) -> bool:
    """Whether a module's numbers are recorded: Linear, conv, norm, attention, embedding."""
    name = type(module).__name__.lower()
    return isinstance(module, WATCHED) or "attention" in name or name.endswith("norm")


class Schedule:
    """Which steps are sampled. ``every``: a fixed period (steps N, 2N, ...); 0 (``auto``):
    the first :data:`AUTO_BASELINE` steps after step 1 (a warm-up step) are timed plain,
    the next one is sampled, and from then on the period is chosen from measured times so
    that sampling costs at most :data:`AUTO_BUDGET` of step time -- (sampled step - plain
    step) / period <= 1.5 % of a plain step -- again after each sampled step. Times are the
    intervals between step ends on the run's clock (:mod:`amptrain.common.clock`)."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.plain: list[float] = []      # the last plain steps' times
        self.sampled: list[float] = []    # the sampled steps' times
        self.next: int = every if every else AUTO_BASELINE + 2
        self.period: int | None = every or None

    def is_sampled(self, step: int) -> bool:
        return step == self.next

    def timed(self, step: int, seconds: float | None, sampled: bool) -> None:
        """Step ``step`` ended ``seconds`` after the previous one (None: unknown)."""
        if seconds is not None and step > 1:   # step 1 warms up: not a plain step's time
            (self.sampled if sampled else self.plain).append(seconds)
            del self.plain[:-32]
        if sampled:
            if not self.every and self.plain and self.sampled:
                self.period = self.choose()
            self.next = step + (self.period or AUTO_BASELINE)

    def choose(self) -> int:
        """The smallest period whose extra cost is at most the budget (at least
        :data:`AUTO_MIN_PERIOD`); the sampled time is the median of the last three."""
        plain = statistics.median(self.plain)
        extra = max(0.0, statistics.median(self.sampled[-3:]) - plain)
        if plain <= 0:
            return 1000
        return max(AUTO_MIN_PERIOD, math.ceil(extra / (AUTO_BUDGET * plain)))


class LayerRecorder:
    """Hooks on the watched modules of ``model`` while one step is sampled.

    ``own(tensor)`` names the run's format for a tensor kind. Per module it queues the
    first micro-batch's output (``activation``), the weight as the forward used it
    (``weight``) and the gradient arriving at the output (``gradient``); a loss given to
    :meth:`loss` is recorded as module ``loss``.
    """

    def __init__(self, model: nn.Module, own: Callable[[str], str]) -> None:
        self.model = model
        self.own = own
        self.modules = [(name or type(m).__name__, m) for name, m in model.named_modules()
                        if watched(m)]
        self.order: dict[str, int] = {name: i for i, (name, _) in enumerate(self.modules)}
        self.pending: dict[tuple[str, str], tuple[torch.Tensor, torch.Tensor, str]] = {}
        self._handles: list[Any] = []

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def attach(self) -> None:
        """Hook every watched module for the next step."""
        self.pending = {}
        for name, module in self.modules:
            self._handles.append(module.register_forward_hook(self._hook(name)))

    def _add(self, name: str, kind: str, tensor: torch.Tensor) -> None:
        key = (name, kind)
        if key not in self.pending and tensor.numel():  # the first micro-batch's
            # amax over the whole tensor, the rows (a bounded fp32 copy) kept for collect()
            self.pending[key] = (abs_max(tensor), as_rows(tensor, kind == "weight"),
                                 self.own(kind))

    def _hook(self, name: str) -> Callable:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            outputs = floating_tensors(output)
            if outputs:
                self._add(name, "activation", outputs[0])
                if outputs[0].requires_grad and (name, "gradient") not in self.pending:
                    outputs[0].register_hook(
                        lambda grad: self._add(name, "gradient", grad) if self._handles
                        else None)
            weight = getattr(module, "weight", None)
            if isinstance(weight, torch.Tensor) and weight.is_floating_point():
                self._add(name, "weight", weight)
        return hook

    def loss(self, loss: torch.Tensor) -> None:
        """Record a loss (its value as ``activation``) while attached."""
        if self._handles:
            self._add("loss", "activation", loss)

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def collect(self) -> list[tuple[str, str, list[float]]]:
        """Detach, and read every queued vector (one transfer): ``(module, tensor,
        vector)`` in execution order, the loss last."""
        self.detach()
        if not self.pending:
            return []
        keys = sorted(self.pending, key=lambda k: (self.order.get(k[0], len(self.order)),
                                                   TENSORS.index(k[1])))
        values = many_stats([self.pending[k] for k in keys]).cpu().tolist()
        self.pending = {}
        return [(name, kind, vector) for (name, kind), vector in zip(keys, values)]
