"""Memory-aware micro-batches: find the largest that fits, and shrink on out-of-memory.

A sizer: it runs what it is given (a step at a micro-batch size, a forward/backward of a
window) and answers with a :class:`MicroBatchSplit`; it holds no training state of its own and
knows nothing of the Trainer, which applies each split in one place.

The global batch (``--batch-size``) is fixed; only the way it is cut into micro-batches
changes, so the optimisation maths never does (see :mod:`amptrain.trainer.windows`):

* ``--micro-batch-size auto`` (:meth:`MicroBatchSizer.search`) runs real training
  steps (forward, backward, optimizer step, in the run's precision, on the run's first
  batches) at candidate micro-batch sizes, keeps the largest that fits, and sets
  ``accumulate`` so that micro x accumulate x processes == batch. Candidates are the
  divisors of the per-device batch, so the batch is always met exactly. The weights,
  optimizer, loss scaler and RNG are restored after every probe: probing does not change
  training.
* Mid-training, an out-of-memory error in a forward/backward (:meth:`MicroBatchSizer.redo`)
  drops the partial gradients, frees memory, halves the micro-batch (doubling the
  accumulation) and redoes the same global batch, re-cut, from the same RNG and BatchNorm
  state; later steps keep the new split.
  Each failure at least halves the micro-batch, so a run can fail at most
  ``log2(micro-batch) + 1`` times before it stops with a clear error at micro-batch 1.

Measuring memory
----------------
"Fits" means: no out-of-memory error, and the probe's peak memory within the budget, as
:class:`~amptrain.trainer.memory.MemoryMeter` measures it in its ``"process"`` scope. CUDA's budget
is ``--memory-budget-gb`` when given, else the device itself (its out-of-memory error);
the CPU has no device limit, so ``--memory-budget-gb`` (default: the RAM in use plus the
RAM available now) bounds the process's peak resident memory during a step.

The search gallops upwards (each probe about twice the last) and then bisects between the
last size that fit and the first that did not: no probe is much larger than the answer,
which matters on CPU, where an oversized probe means swapping rather than a clean error.
For the same reason, once two probes have fit, a candidate whose linear extrapolation
exceeds the budget by more than :data:`PREDICTION_SLACK` is judged without running it.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..common import nested
from ..common.oom import is_out_of_memory
from .windows import StepBatch
from ..config.train import MicroBatchSplit
from ..common.errors import TrainingHalted, UserError, first_line, flag
from .memory import MemoryMeter, available_bytes, free_memory, rss_bytes
from ..precision.hardware.advice import less_memory

#: --memory-budget-gb counts decimal gigabytes.
GB = 10 ** 9
#: A candidate predicted above budget x this is not run (linear extrapolation of peaks).
PREDICTION_SLACK = 1.25
class OutOfMemoryHalt(TrainingHalted):
    """Training cannot go on: out of memory even at micro-batch 1 (or with several processes)."""


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in ascending order."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def halve(failed: int, per_device: int) -> int | None:
    """The micro-batch after ``failed`` ran out of memory: the largest divisor of the
    per-device batch that is at most half of it (None when ``failed`` is already 1)."""
    target = failed // 2
    if target < 1:
        return None
    return max(d for d in divisors(per_device) if d <= target)


def largest_fitting(candidates: list[int], fits: Callable[[int], bool], *, start: int = 0,
                    ascending: bool = False) -> int | None:
    """The largest candidate for which ``fits`` is true, assuming it is true below some size.

    Gallops up from the ``start``-th smallest candidate (each probe at least twice the
    last), then bisects between the last size that fit and the first that did not (below
    ``start`` when even that failed). ``ascending=True`` probes every candidate from the
    smallest up and never a size smaller than one already probed (for a peak meter that
    cannot be reset). Returns None when even the smallest candidate does not fit.
    """
    sizes = sorted(set(candidates))
    if not sizes:
        return None
    if ascending:
        best = None
        for size in sizes:
            if not fits(size):
                break
            best = size
        return best
    lo, hi = -1, len(sizes)  # sizes[lo] fits (-1: none known); sizes[hi] does not
    i = min(max(start, 0), len(sizes) - 1)
    while True:
        if not fits(sizes[i]):
            hi = i
            break
        lo = i
        if i == len(sizes) - 1:
            break
        i = next((j for j in range(i + 1, len(sizes)) if sizes[j] >= 2 * sizes[i]),
                 len(sizes) - 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(sizes[mid]):
            lo = mid
        else:
            hi = mid
    return sizes[lo] if lo >= 0 else None


@dataclass
class Probe:
    """One tried micro-batch size."""

    micro_batch_size: int
    fits: bool
    peak_bytes: int | None
    note: str  # "fits", "over budget", "out of memory: ...", "predicted over budget"


class MicroBatchSizer:
    """``--micro-batch-size auto`` search and out-of-memory recovery for one run.

    ``agree(fits)`` must return True only when every process fits (all ranks pick the same
    micro-batch); with one process it is the identity.
    """

    def __init__(self, device: torch.device, *, batch_size: int, world_size: int = 1,
                 memory_budget_gb: float | None = None,
                 agree: Callable[[bool], bool] = lambda fits: fits) -> None:
        self.device = device
        self.batch_size = batch_size
        self.world_size = world_size
        self.per_device = batch_size // world_size
        self.memory_budget_gb = memory_budget_gb
        self.agree = agree
        self.limit: int | None = None        # micro-batch cap after an out-of-memory error
        self._split: MicroBatchSplit | None = None
        self.search_report: dict[str, Any] | None = None
        self.oom_events: list[dict[str, Any]] = []
        self._events_told = 0

    @property
    def split(self) -> MicroBatchSplit:
        """The split the run uses now: set once at set-up (:meth:`use`), replaced only
        where a smaller one takes effect after out-of-memory; read by every step."""
        if self._split is None:
            raise UserError("set the Trainer up first (setup() or fit()): the batch split "
                            "is decided there")
        return self._split

    def use(self, split: MicroBatchSplit) -> MicroBatchSplit:
        """Make ``split`` the run's split (computed once, read by every step)."""
        self._split = split
        return split

    # ------------------------------------------------------------- auto search
    def search(self, run_steps: Callable[[int], None],
               restore: Callable[[], None]) -> MicroBatchSplit:
        """The largest divisor of the per-device batch whose probe fits.

        ``run_steps(micro)`` runs real training steps cut at ``micro``; ``restore()`` puts
        the training state back after each probe (see the module docstring).
        """
        meter = MemoryMeter(self.device, "process")
        budget = self.budget()
        probes: list[Probe] = []

        def fits(micro: int) -> bool:
            probe = self._probe(micro, run_steps, restore, meter, budget, probes)
            probes.append(probe)
            return probe.fits

        try:
            # Start at the smallest candidate above 1: BatchNorm cannot train on one sample,
            # and where 2 does not fit the search still goes down to 1.
            micro = largest_fitting(divisors(self.per_device), fits, start=1,
                                    ascending=not meter.resettable)
        finally:
            restore()
            free_memory(self.device)
        self.search_report = {"micro_batch_size": micro,
                              "accumulate": MicroBatchSplit.of(micro, self.per_device).accumulate
                              if micro else None,
                              "memory_budget_bytes": budget, "measured_by": meter.source,
                              "probes": [asdict(p) for p in probes]}
        tried = ", ".join(f"{p.micro_batch_size}: {p.note}" +
                          (f" ({_gb(p.peak_bytes)})" if p.peak_bytes is not None else "")
                          for p in probes)
        if micro is None:
            first = min(probes, key=lambda p: p.micro_batch_size)
            hint = (f"raise {flag('memory_budget_gb')} (now {budget / GB:g})"
                    if budget is not None and first.note.startswith("over")
                    else f"use {less_memory(self.device)} or a smaller model")
            raise UserError(f"{flag('micro_batch_size')} auto: even micro-batch 1 does not fit "
                            f"({first.note}, peak {_gb(first.peak_bytes)}"
                            f"{f' > budget {_gb(budget)}' if budget is not None else ''}); {hint}")
        split = MicroBatchSplit.of(micro, self.per_device)
        where = f"budget {_gb(budget)}, " if budget is not None else ""
        processes = f" x {self.world_size} processes" if self.world_size > 1 else ""
        self.search_report["summary"] = (
            f"auto micro-batch {split.micro_batch} x accumulate {split.accumulate}{processes} = "
            f"batch {self.batch_size} ({where}measured by {meter.source}; tried {tried})")
        return split

    def budget(self) -> int | None:
        """Bytes a step may use: --memory-budget-gb, else what the CPU can give (None:
        the CUDA device's own limit decides)."""
        if self.memory_budget_gb is not None:
            return int(self.memory_budget_gb * GB)
        if self.device.type == "cpu":
            rss, free = rss_bytes(), available_bytes()
            if rss is not None and free is not None:
                return rss + free  # what this process may grow to without swapping
        return None

    def _probe(self, micro: int, run_steps: Callable[[int], None], restore: Callable[[], None],
               meter: MemoryMeter, budget: int | None, probes: list[Probe]) -> Probe:
        predicted = _predict(micro, probes)
        if budget is not None and predicted is not None and predicted > PREDICTION_SLACK * budget:
            return Probe(micro, self.agree(False), predicted, "predicted over budget")
        failure, peak = None, None
        try:
            peak = meter.measure(lambda: run_steps(micro))
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is expected here
            if not is_out_of_memory(exc):
                raise
            failure = first_line(exc)
        # Outside the except block: the traceback (and the activations its frames hold)
        # is gone.
        restore()
        free_memory(self.device)
        if failure is not None:
            return Probe(micro, self.agree(False), None, f"out of memory: {failure}")
        if budget is not None and peak is not None and peak > budget:
            return Probe(micro, self.agree(False), peak, "over budget")
        ok = self.agree(True)
        return Probe(micro, ok, peak, "fits" if ok else "does not fit on another process")

    # ------------------------------------------------------- out-of-memory recovery
    def cut(self, window: StepBatch) -> StepBatch:
        """``window`` cut as this run cuts it now: re-cut when it was planned before the
        micro-batch shrank after out-of-memory."""
        if self.limit is not None and max(window.micro_samples, default=0) > self.limit:
            return resplit(window, self.limit)
        return window

    def redo(self, window: StepBatch, forward_backward: Callable[[StepBatch], None],
             failure: str, *, split: MicroBatchSplit, step: int,
             drop_gradients: Callable[[], None], step_start: Any = None
             ) -> tuple[StepBatch, MicroBatchSplit]:
        """After ``forward_backward(window)`` ran out of memory (``failure``: the error's
        line), redo it in smaller micro-batches until it fits.

        Returns the window as it finally ran (re-cut) and the split that later steps should
        use. ``step_start`` (a :class:`~amptrain.trainer.snapshot.StepStart`, saved by the
        caller) brings RNG and BatchNorm statistics back before a redo, as a run that used
        the smaller micro-batch from the start would have them.
        """
        while True:
            # The failed attempt may have accumulated some gradients.
            drop_gradients()
            free_memory(self.device)
            split = self._shrink(window, failure, split, step)
            window = resplit(window, split.micro_batch)
            if step_start is not None:
                step_start.restore()
            try:
                forward_backward(window)
                return window, split
            except Exception as exc:  # noqa: BLE001 - anything else is re-raised
                if not is_out_of_memory(exc):
                    raise
                failure = first_line(exc)
            # Here, outside the except block, the traceback (and the activations its
            # frames hold) is gone.

    def _shrink(self, window: StepBatch, failure: str, split: MicroBatchSplit,
                step: int) -> MicroBatchSplit:
        failed = max(window.micro_samples)
        per_device = split.per_device
        smaller = halve(failed, per_device)
        if smaller is None:
            raise OutOfMemoryHalt(
                f"out of memory at step {step} even with micro-batch 1 ({failure}): the model, "
                f"its optimizer state and one sample do not fit; use a cheaper "
                f"{flag('precision')} (e.g. bf16-mixed), a smaller model, or a device with "
                f"more memory")
        if self.world_size > 1:
            raise OutOfMemoryHalt(
                f"out of memory at step {step} with micro-batch {failed} ({failure}); one of "
                f"{self.world_size} processes cannot redo a step alone: restart with "
                f"{flag('micro_batch_size')} {smaller} (or auto)")
        new = MicroBatchSplit.of(smaller, per_device)
        self.limit = smaller
        self.oom_events.append({"step": step, "micro_batch_size": [split.micro_batch, smaller],
                                "accumulate": [split.accumulate, new.accumulate], "error": failure,
                                "message": f"out of memory at step {step} with micro-batch "
                                           f"{failed}; redoing the step as micro-batch {smaller} "
                                           f"x accumulate {new.accumulate} (same global batch "
                                           f"of {window.global_samples}) and keeping that split"})
        return new

    def new_events(self) -> list[dict[str, Any]]:
        """The out-of-memory events not returned before (each is told once)."""
        events = self.oom_events[self._events_told:]
        self._events_told = len(self.oom_events)
        return events

    def report(self) -> dict[str, Any]:
        """What config.yaml records about micro-batch sizing."""
        out: dict[str, Any] = {}
        if self.search_report is not None:
            out["micro_batch_search"] = {k: v for k, v in self.search_report.items()
                                         if k != "summary"}
        if self.oom_events:
            out["oom_events"] = [{k: v for k, v in e.items() if k != "message"}
                                 for e in self.oom_events]
        return out


# ---------------------------------------------------------------- re-splitting
def resplit(window: StepBatch, micro: int) -> StepBatch:
    """The same samples in micro-batches of at most ``micro``, cut the way
    :class:`~amptrain.trainer.windows.SampleOrder` cuts them."""
    n = sum(window.micro_samples)
    count = min(math.ceil(n / micro), n)
    cuts = [i * n // count for i in range(count + 1)]
    try:
        whole = nested.concat(window.micro_batches)
    except TypeError as exc:
        raise OutOfMemoryHalt(f"out of memory, and {exc}: set a smaller "
                              f"--micro-batch-size") from None
    batches = [nested.slice_rows(whole, cuts[i], cuts[i + 1]) for i in range(count)]
    return StepBatch(batches, [cuts[i + 1] - cuts[i] for i in range(count)], window.global_samples)


def _gb(value: int | None) -> str:
    return "?" if value is None else f"{value / GB:.2f} GB"


def _predict(micro: int, probes: list[Probe]) -> int | None:
    """Peak memory at ``micro`` extrapolated from the two largest probes that fit."""
    measured = sorted((p.micro_batch_size, p.peak_bytes) for p in probes
                      if p.fits and p.peak_bytes is not None)
    if len(measured) < 2:
        return None
    (m1, p1), (m2, p2) = measured[-2:]
    slope = (p2 - p1) / (m2 - m1)
    if slope <= 0 or micro <= m2:
        return None
    return int(p2 + slope * (micro - m2))
