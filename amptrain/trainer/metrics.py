"""The ``--log-every`` interval: what a training record averages, kept on the device between
records (no host sync per step) and read once per record. (A "window" is one step's
batch, :mod:`amptrain.trainer.windows`; the steps between two records are a log interval.)"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import torch

from ..checkpoint import plain_tensor
from ..common import clock
from ..distributed import Strategy

T = TypeVar("T")


class LogInterval:
    """Device-side sums of every logged key (weighted by samples) and their sample counts,
    the global samples trained, the host time spent waiting for data, the clock, and the
    last gradient norm of each part, since the last record. Its checkpoint section is
    ``log_interval`` (:class:`~amptrain.checkpoint.stateful.Stateful`)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}
        self.samples = 0           # global samples trained in the interval
        self.data_wait_s = 0.0     # host time spent waiting for step windows in it
        self.started = 0.0         # clock.now() at the interval's start
        self.start_step = 0        # the loop's step at the interval's start
        self.grad_norms: dict[str, torch.Tensor | None] = {}

    def start(self, step: int) -> None:
        """The interval starts now, at ``step`` (the loop's start)."""
        self.started = clock.now()
        self.start_step = step

    def add(self, logged: Iterable[tuple[str, torch.Tensor, int]], samples: int) -> None:
        """A finished step: its logged ``(key, per-sample mean, samples)`` values and the
        global samples it trained (counted once, after any redo of the step)."""
        for key, value, n in logged:
            total = self.sums.get(key)
            if total is None:
                total = self.sums[key] = torch.zeros((), device=self.device)
                self.counts[key] = 0
            total.add_(value, alpha=n)
            self.counts[key] += n
        self.samples += samples

    def timed(self, windows: Iterable[T]) -> Iterator[T]:
        """``windows``, adding the host time spent waiting for each to :attr:`data_wait_s`.

        Host clock only, no device sync: on an accelerator the host runs ahead of the
        device, so this is the time the loop could not queue work because data was not
        ready -- what ``data_wait_frac`` reports (0: the input pipeline keeps up).
        """
        iterator = iter(windows)
        while True:
            started = clock.now()
            try:
                window = next(iterator)
            except StopIteration:
                return
            self.data_wait_s += clock.now() - started
            yield window

    def pause(self, seconds: float) -> None:
        """Leave ``seconds`` (an evaluation) out of the interval's training time."""
        self.started += seconds

    def read(self, strategy: Strategy, step: int) -> dict[str, Any]:
        """The interval's means over all ranks (reads the device), speeds, and a fresh interval.

        Returns ``{"means": {key: mean}, "samples_per_s": ..., "data_wait_frac": ...}``.
        """
        means = {}
        for key, total in self.sums.items():
            loss_sum = strategy.reduce_sum(total.detach().double())
            count = strategy.reduce_sum(torch.tensor(float(self.counts[key]),
                                                     device=self.device, dtype=torch.float64))
            if float(count.item()) == 0:  # logged in no step of this window (PPO's
                continue                  # episodes end at rollouts only): no value, not 0
            means[key] = float((loss_sum / count).item())
        elapsed = clock.now() - self.started
        out = {"means": means,
               "samples_per_s": self.samples / elapsed if elapsed > 0 else None,
               # Share of the training time spent waiting for the next window (host clock).
               "data_wait_frac": min(1.0, self.data_wait_s / elapsed) if elapsed > 0 else None}
        for total in self.sums.values():
            total.zero_()
        self.counts = dict.fromkeys(self.counts, 0)
        self.samples = 0
        self.data_wait_s = 0.0
        self.start(step)
        return out

    # ------------------------------------------- its checkpoint section (Stateful)
    section = "log_interval"
    format_version = 1

    def state_dict(self) -> dict[str, Any]:
        """The interval in progress, so a resumed run logs the same means: the samples, and
        every logged key's sum and count and every part's last gradient norm."""
        def cpu(value: torch.Tensor | None) -> torch.Tensor | None:
            # A plain host tensor, also for a DTensor (a grad norm under FSDP), so that the
            # checkpoint loads with weights_only where torch.distributed is not imported.
            return None if value is None else plain_tensor(value)

        return {"samples_since_log": self.samples,
                "sums": {k: cpu(v) for k, v in self.sums.items()}, "counts": dict(self.counts),
                "grad_norms": {k: cpu(v) for k, v in self.grad_norms.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (every rank restores rank 0's sums)."""
        self.samples = int(state["samples_since_log"])
        self.sums = {k: torch.zeros((), device=self.device).copy_(v)
                     for k, v in state["sums"].items()}
        self.counts = {k: int(state["counts"][k]) for k in self.sums}
        self.grad_norms = {k: None if v is None else v.to(self.device)
                           for k, v in state["grad_norms"].items()}

    def migrate(self, state: dict[str, Any], version: int) -> dict[str, Any]:
        """Version 0 (a whole file of format 1) kept the interval as ``log_window``: for a
        one-part run that logs only ``loss`` as ``loss_sum``, ``loss_samples`` and
        ``grad_norm``, else as today; absent, the interval starts empty."""
        window = state.get("log_window") or {}
        if "sums" in window:
            return {k: window[k] for k in ("samples_since_log", "sums", "counts", "grad_norms")}
        if not window:
            return {"samples_since_log": 0, "sums": {}, "counts": {}, "grad_norms": {}}
        norm = window.get("grad_norm")
        return {"samples_since_log": window["samples_since_log"],
                "sums": {"loss": window["loss_sum"]}, "counts": {"loss": window["loss_samples"]},
                "grad_norms": {"model": norm} if norm is not None else {}}
