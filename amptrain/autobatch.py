"""Memory-aware micro-batches: find the largest that fits, and shrink on out-of-memory.

The global batch (``--batch-size``) is fixed; only the way it is cut into micro-batches
changes, so the optimisation maths never does (see :mod:`amptrain.batches`):

* ``--micro-batch-size auto`` (:meth:`AutoBatch.find_micro_batch`) runs real training
  steps (forward, backward, optimizer step, in the run's precision, on the run's first
  batches) at candidate micro-batch sizes, keeps the largest that fits, and sets
  ``accumulate`` so that micro x accumulate x processes == batch. Candidates are the
  divisors of the per-device batch, so the batch is always met exactly. The weights,
  optimizer, loss scaler and RNG are restored after every probe: probing does not change
  training.
* Mid-training, an out-of-memory error in a forward/backward (:meth:`AutoBatch.run`)
  drops the partial gradients, frees memory, halves the micro-batch (doubling the
  accumulation) and redoes the same global batch, re-cut, from the same RNG and BatchNorm
  state; later steps keep the new split.
  Each failure at least halves the micro-batch, so a run can fail at most
  ``log2(micro-batch) + 1`` times before it stops with a clear error at micro-batch 1.

Measuring memory
----------------
"Fits" means: no out-of-memory error, and the probe's peak memory within the budget.

* CUDA: ``torch.cuda.max_memory_reserved`` after ``reset_peak_memory_stats`` (what the
  process took from the device); the budget is ``--memory-budget-gb`` when given, else the
  device itself (its out-of-memory error).
* CPU has no device limit, so ``--memory-budget-gb`` (default: the RAM in use plus the
  RAM available now) bounds the process's peak resident memory (RSS) during a step.
  ``getrusage``'s ``ru_maxrss`` is a lifetime peak that cannot be reset, which would make
  every probe after a large one look large. Linux can reset it: writing ``5`` to
  ``/proc/self/clear_refs`` sets the high-water mark ``VmHWM`` to the current RSS. Each
  probe therefore frees memory (``gc``, and glibc's ``malloc_trim`` so freed heap really
  leaves the process), resets ``VmHWM``, runs, and reads ``VmHWM``. This measures what
  the budget is about -- the whole process, Python heap and allocator slack included --
  where the alternatives do not: torch's profiler sees only tensors (and slows the step),
  and a child process per probe would need a picklable model and data (spawn) or is
  unsafe with OpenMP threads (fork). Where ``VmHWM`` cannot be reset (not Linux), probes
  run in ascending order only, so the never-decreasing ``ru_maxrss`` still reads each
  probe's own peak.

The search gallops upwards (each probe about twice the last) and then bisects between the
last size that fit and the first that did not: no probe is much larger than the answer,
which matters on CPU, where an oversized probe means swapping rather than a clean error.
For the same reason, once two probes have fit, a candidate whose linear extrapolation
exceeds the budget by more than :data:`PREDICTION_SLACK` is judged without running it.
"""
from __future__ import annotations

import copy
import ctypes
import gc
import logging
import math
import re
import resource
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from .batches import DatasetWindows, Window
from .config import write_yaml
from .errors import TrainingHalted, UserError

if TYPE_CHECKING:  # pragma: no cover
    from .trainer import Trainer

log = logging.getLogger("amptrain")

#: --memory-budget-gb counts decimal gigabytes.
GB = 10 ** 9
#: A candidate predicted above budget x this is not run (linear extrapolation of peaks).
PREDICTION_SLACK = 1.25
#: Error texts that mean "out of memory" without being torch.OutOfMemoryError / MemoryError:
#: the CPU allocator, and cuBLAS/cuDNN failing to get a workspace.
_OOM_TEXTS = ("out of memory", "can't allocate memory", "cublas_status_alloc_failed",
              "cudnn_status_alloc_failed")


class OutOfMemoryHalt(TrainingHalted):
    """Training cannot go on: out of memory even at micro-batch 1 (or with several processes)."""


def is_out_of_memory(exc: BaseException) -> bool:
    """True for CUDA's OutOfMemoryError, MemoryError, and allocator failures (CPU, cuBLAS)."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(t in text for t in _OOM_TEXTS)


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


# ----------------------------------------------------------------- memory meter
def free_memory(device: torch.device) -> None:
    """Collect garbage and hand cached memory back (CUDA cache, glibc heap)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    else:
        _malloc_trim()


def _malloc_trim() -> None:
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _proc_kib(path: str, key: str) -> int | None:
    try:
        with open(path) as f:
            match = re.search(rf"^{key}:\s+(\d+)\s*kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def _reset_rss_peak() -> bool:
    """Set the process's RSS high-water mark to its current RSS (Linux); False if impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _proc_kib("/proc/self/status", "VmHWM") is not None


def rss_bytes() -> int | None:
    """The process's resident memory now (Linux), or None."""
    return _proc_kib("/proc/self/status", "VmRSS")


def available_bytes() -> int | None:
    """RAM that can be taken without swapping (Linux MemAvailable), or None."""
    return _proc_kib("/proc/meminfo", "MemAvailable")


class PeakMemory:
    """The peak memory of one block of work on ``device`` (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        if device.type == "cuda":
            self.resettable, self.source = True, "CUDA max_memory_reserved"
        elif _reset_rss_peak():
            self.resettable, self.source = True, "peak RSS (VmHWM, reset before each probe)"
        else:
            self.resettable, self.source = False, "peak RSS (ru_maxrss; probes ascending)"

    def measure(self, work: Callable[[], None]) -> int:
        """Run ``work`` and return the peak bytes while it ran."""
        free_memory(self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            work()
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_reserved(self.device))
        if self.resettable:
            _reset_rss_peak()
            work()
            return int(_proc_kib("/proc/self/status", "VmHWM") or 0)
        work()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(peak if sys.platform == "darwin" else peak * 1024)


# ------------------------------------------------------------ probing support
@dataclass
class Probe:
    """One tried micro-batch size."""

    micro_batch_size: int
    fits: bool
    peak_bytes: int | None
    note: str  # "fits", "over budget", "out of memory: ...", "predicted over budget"


class _StepStart:
    """What a failed forward/backward changes besides gradients: RNG draws and module
    buffers (BatchNorm running statistics). Saved before every step so that a redo starts
    from exactly the same state; costs one multi-tensor copy and a 5 KB RNG copy per step,
    with no device sync."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self.device = device
        self.buffers = [b for b in model.buffers()]
        self.saved = [b.detach().clone() for b in self.buffers]
        self.cpu_rng: torch.Tensor | None = None
        self.cuda_rng: torch.Tensor | None = None

    def save(self) -> None:
        self.cpu_rng = torch.get_rng_state()
        if self.device.type == "cuda":
            self.cuda_rng = torch.cuda.get_rng_state(self.device)
        if self.buffers:
            torch._foreach_copy_(self.saved, self.buffers)

    def restore(self) -> None:
        torch.set_rng_state(self.cpu_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state(self.cuda_rng, self.device)
        if self.buffers:
            torch._foreach_copy_(self.buffers, self.saved)


class _TrainingState:
    """Weights (fp32, master copies included), optimizer, loss scaler and RNG, on the CPU.

    Copies live on the CPU so they do not count against the device memory being probed.
    """

    def __init__(self, trainer: "Trainer") -> None:
        self.weights = {k: v.detach().to("cpu", copy=True)
                        for k, v in trainer.precision.fp32_state_dict(trainer.model).items()}
        self.optimizer = _cpu_copy(trainer.optimizer.state_dict())
        self.precision = copy.deepcopy(trainer.precision.state_dict())
        self.device = trainer.device
        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" \
            else None

    def restore(self, trainer: "Trainer") -> None:
        trainer.model.zero_grad(set_to_none=True)
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.precision.load_fp32_state_dict(trainer.model, self.weights)
        # load_state_dict may keep references to the tensors it is given: hand it a copy.
        trainer.optimizer.load_state_dict(copy.deepcopy(self.optimizer))
        trainer.precision.load_state_dict(copy.deepcopy(self.precision))
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state(self.cuda_rng, self.device)


def _cpu_copy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _cpu_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu_copy(v) for v in value)
    return copy.deepcopy(value)


# ---------------------------------------------------------------- re-splitting
def resplit(window: Window, micro: int) -> Window:
    """The same samples in micro-batches of at most ``micro``, cut the way
    :class:`~amptrain.batches.GlobalBatchPlan` cuts them."""
    n = sum(window.micro_samples)
    count = min(math.ceil(n / micro), n)
    cuts = [i * n // count for i in range(count + 1)]
    whole = _concat(window.micro_batches)
    batches = [_slice(whole, cuts[i], cuts[i + 1]) for i in range(count)]
    return Window(batches, [cuts[i + 1] - cuts[i] for i in range(count)], window.global_samples)


def _concat(parts: list[Any]) -> Any:
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)
    if isinstance(first, Mapping):
        return {k: _concat([p[k] for p in parts]) for k in first}
    if isinstance(first, tuple):
        return tuple(_concat(list(fields)) for fields in zip(*parts))
    if isinstance(first, list):
        return [_concat(list(fields)) for fields in zip(*parts)]
    raise OutOfMemoryHalt(f"out of memory, and a batch holding a {type(first).__name__} cannot "
                          f"be cut into smaller micro-batches: set a smaller --micro-batch-size")


def _slice(batch: Any, start: int, stop: int) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[start:stop]
    if isinstance(batch, dict):
        return {k: _slice(v, start, stop) for k, v in batch.items()}
    return type(batch)(_slice(v, start, stop) for v in batch)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def _gb(value: int | None) -> str:
    return "?" if value is None else f"{value / GB:.2f} GB"


# --------------------------------------------------------------------- AutoBatch
class AutoBatch:
    """The Trainer's micro-batch sizing: ``auto`` search and out-of-memory recovery."""

    def __init__(self, trainer: "Trainer") -> None:
        self.trainer = trainer
        self.limit: int | None = None        # micro-batch cap after an out-of-memory error
        self.search: dict[str, Any] | None = None
        self.oom_events: list[dict[str, Any]] = []
        self._start: _StepStart | None = None

    # ------------------------------------------------------------- auto search
    def find_micro_batch(self, train_data: Any) -> tuple[int, int]:
        """(micro, accumulate) for ``--micro-batch-size auto``: the largest divisor of the
        per-device batch whose probe fits (see the module docstring)."""
        t = self.trainer
        per_device = t.config.batching.batch_size // t.strategy.world_size
        windows = t._windows(train_data, 1, per_device, shuffle=True)
        if not isinstance(windows, DatasetWindows):
            raise UserError("--micro-batch-size auto needs a dataset that amptrain batches itself; "
                            "a DataLoader's batch_size is its micro-batch: set it there instead")
        # The dataset as training will hold it (on the GPU when small enough), moved once.
        train_data = windows.dataset
        del windows
        meter = PeakMemory(t.device)
        budget = self._budget()
        probes: list[Probe] = []
        state = _TrainingState(t)

        def fits(micro: int) -> bool:
            probe = self._probe(train_data, micro, per_device, meter, budget, probes, state)
            probes.append(probe)
            return probe.fits

        try:
            # Start at the smallest candidate above 1: BatchNorm cannot train on one sample,
            # and where 2 does not fit the search still goes down to 1.
            micro = largest_fitting(divisors(per_device), fits, start=1,
                                    ascending=not meter.resettable)
        finally:
            state.restore(t)
            free_memory(t.device)
        self.search = {"micro_batch_size": micro,
                       "accumulate": per_device // micro if micro else None,
                       "memory_budget_bytes": budget, "measured_by": meter.source,
                       "probes": [asdict(p) for p in probes]}
        tried = ", ".join(f"{p.micro_batch_size}: {p.note}" +
                          (f" ({_gb(p.peak_bytes)})" if p.peak_bytes is not None else "")
                          for p in probes)
        if micro is None:
            first = min(probes, key=lambda p: p.micro_batch_size)
            hint = (f"raise --memory-budget-gb (now {budget / GB:g})" if budget is not None
                    and first.note.startswith("over") else "use a cheaper --precision "
                    "(e.g. bf16-mixed) or a smaller model")
            raise UserError(f"--micro-batch-size auto: even micro-batch 1 does not fit "
                            f"({first.note}, peak {_gb(first.peak_bytes)}"
                            f"{f' > budget {_gb(budget)}' if budget is not None else ''}); {hint}")
        accumulate = per_device // micro
        if t.strategy.is_main:
            where = f"budget {_gb(budget)}, " if budget is not None else ""
            log.info("auto micro-batch %d x accumulate %d%s = batch %d (%smeasured by %s; "
                     "tried %s)", micro, accumulate,
                     f" x {t.strategy.world_size} processes" if t.strategy.world_size > 1 else "",
                     t.config.batching.batch_size, where, meter.source, tried)
        return micro, accumulate

    def _budget(self) -> int | None:
        t = self.trainer
        if t.config.batching.memory_budget_gb is not None:
            return int(t.config.batching.memory_budget_gb * GB)
        if t.device.type == "cpu":
            rss, free = rss_bytes(), available_bytes()
            if rss is not None and free is not None:
                return rss + free  # what this process may grow to without swapping
        return None  # CUDA: the device's own limit (its out-of-memory error) decides

    def _probe(self, train_data: Any, micro: int, per_device: int, meter: PeakMemory,
               budget: int | None, probes: list[Probe], state: _TrainingState) -> Probe:
        predicted = _predict(micro, probes)
        if budget is not None and predicted is not None and predicted > PREDICTION_SLACK * budget:
            return Probe(micro, self._agree(False), predicted, "predicted over budget")
        t = self.trainer
        windows = t._windows(train_data, micro, per_device // micro, shuffle=True)
        failure, peak = None, None
        try:
            peak = meter.measure(lambda: self._real_steps(windows))
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is expected here
            if not is_out_of_memory(exc):
                raise
            failure = _first_line(exc)
        # Outside the except block: the traceback (and the activations its frames hold)
        # is gone.
        del windows
        state.restore(t)
        free_memory(t.device)
        if failure is not None:
            return Probe(micro, self._agree(False), None, f"out of memory: {failure}")
        if budget is not None and peak > budget:
            return Probe(micro, self._agree(False), peak, "over budget")
        ok = self._agree(True)
        return Probe(micro, ok, peak, "fits" if ok else "does not fit on another process")

    def _real_steps(self, windows: DatasetWindows) -> None:
        """Two micro-batches, each forward/backward + optimizer step, without zeroing the
        gradients in between: the second pass holds weights, gradients, optimizer state and
        activations at once, the steady-state peak of an accumulating step."""
        from .trainer import forward_batch  # the training loop's own forward (import cycle)

        t = self.trainer
        epoch = windows.epoch(0)
        window = next(epoch)
        epoch.close()
        batches = (window.micro_batches * 2)[:2]
        for batch in batches:
            # The unwrapped module: no process-group traffic (a rank that runs out of memory
            # must not leave the others waiting in a collective) and no torch.compile per
            # probed shape. Eager memory is at least the compiled one; DDP's gradient
            # buckets are not counted.
            with t.precision.autocast():
                loss, _, _ = forward_batch(t.model, batch, t.loss_fn)
            t.precision.backward(loss)
            if t.config.schedule.clip_grad_norm:
                t.precision.clip_grad_norm_(t.model.parameters(), t.config.schedule.clip_grad_norm)
            t.precision.step_async(t.optimizer)
        if t.device.type == "cuda":
            torch.cuda.synchronize(t.device)

    def _agree(self, fits: bool) -> bool:
        """True only when every process fits (all ranks must pick the same micro-batch)."""
        t = self.trainer
        if t.strategy.world_size == 1:
            return fits
        flag = torch.tensor(1.0 if fits else 0.0, device=t.device)
        return int(t.strategy.reduce_sum(flag).item()) == t.strategy.world_size

    # ------------------------------------------------------- out-of-memory recovery
    def run(self, window: Window, forward_backward: Callable[[Window], None]) -> Window:
        """Run ``forward_backward(window)``; on out-of-memory redo it in smaller micro-batches.

        Returns the window as it finally ran (re-cut after a recovery).
        """
        if self.limit is not None and max(window.micro_samples, default=0) > self.limit:
            window = resplit(window, self.limit)  # planned before the micro-batch shrank
        # A redo starts from the same RNG and BatchNorm statistics as the failed attempt,
        # as a run that used the smaller micro-batch from the start would.
        if self.trainer.strategy.world_size == 1:  # several processes halt instead of redoing
            if self._start is None:
                self._start = _StepStart(self.trainer.model, self.trainer.device)
            self._start.save()
        while True:
            failure = None
            try:
                forward_backward(window)
                return window
            except Exception as exc:  # noqa: BLE001 - anything else is re-raised
                if not is_out_of_memory(exc):
                    raise
                failure = _first_line(exc)
            # Outside the except block: the traceback (and the activations its frames
            # hold) is gone.
            window = self._shrink(window, failure)
            self._start.restore()

    def _shrink(self, window: Window, failure: str) -> Window:
        t = self.trainer
        # The failed attempt may have accumulated gradients from some micro-batches.
        t.model.zero_grad(set_to_none=True)
        t.optimizer.zero_grad(set_to_none=True)
        free_memory(t.device)
        failed = max(window.micro_samples)
        step = t.step + 1
        per_device = t.micro_batch_size * t.accumulate
        smaller = halve(failed, per_device)
        if smaller is None:
            raise OutOfMemoryHalt(
                f"out of memory at step {step} even with micro-batch 1 ({failure}): the model, "
                f"its optimizer state and one sample do not fit; use a cheaper --precision "
                f"(e.g. bf16-mixed), a smaller model, or a device with more memory")
        if t.strategy.world_size > 1:
            raise OutOfMemoryHalt(
                f"out of memory at step {step} with micro-batch {failed} ({failure}); one of "
                f"{t.strategy.world_size} processes cannot redo a step alone: restart with "
                f"--micro-batch-size {smaller} (or auto)")
        before = (t.micro_batch_size, t.accumulate)
        t.micro_batch_size, t.accumulate = smaller, math.ceil(per_device / smaller)
        plan = getattr(t.train_windows, "plan", None)
        if plan is not None:
            plan.micro_batch = smaller  # later epochs are planned with the new split
        self.limit = smaller
        self.oom_events.append({"step": step, "micro_batch_size": [before[0], smaller],
                                "accumulate": [before[1], t.accumulate], "error": failure})
        t.logger.message(f"amptrain: out of memory at step {step} with micro-batch {failed}; "
                         f"redoing the step as micro-batch {smaller} x accumulate {t.accumulate} "
                         f"(same global batch of {window.global_samples}) and keeping that split")
        if t.strategy.is_main and t.out is not None:
            write_yaml(t.resolved_config(), t.out / "config.yaml")
        return resplit(window, smaller)

    def report(self) -> dict[str, Any]:
        """What config.yaml records about micro-batch sizing."""
        out: dict[str, Any] = {}
        if self.search is not None:
            out["micro_batch_search"] = self.search
        if self.oom_events:
            out["oom_events"] = list(self.oom_events)
        return out


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
