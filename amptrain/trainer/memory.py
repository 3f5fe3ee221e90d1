"""The one memory meter: how much memory a block of work, or a run so far, took.

What "memory" means depends on the question, so :class:`MemoryMeter` has a scope:

* ``"process"`` -- what the process holds, the thing a budget limits (``--micro-batch-size
  auto``): CUDA ``max_memory_reserved`` after ``reset_peak_memory_stats``; on the CPU the
  resident-set high-water mark. ``getrusage``'s ``ru_maxrss`` is a lifetime peak that
  cannot be reset; Linux can reset ``VmHWM`` (write ``5`` to ``/proc/self/clear_refs``),
  so each measurement frees memory (``gc`` and glibc's ``malloc_trim``), resets it, runs,
  and reads it. Where it cannot be reset, only ascending measurements are meaningful
  (:attr:`MemoryMeter.resettable`).
* ``"tensors"`` -- what tensors took above the level at the start, the thing a precision
  changes (``compare``): CUDA ``max_memory_allocated`` minus the allocation at entry; on
  the CPU the running sum of the CPU allocator's allocation and free events recorded by
  ``torch.profiler`` (the process RSS only ever grows in one process, so it cannot tell
  precisions apart).
* ``"running"`` -- the cheap peak a training log can read every ``--log-every`` steps:
  CUDA ``max_memory_allocated`` since :meth:`MemoryMeter.start`, the process's peak RSS
  on the CPU (no profiler on the hot path).
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import re
import resource
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

SCOPES = ("process", "tensors", "running")


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


def _lifetime_rss_peak() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB


def rss_bytes() -> int | None:
    """The process's resident memory now (Linux), or None."""
    return _proc_kib("/proc/self/status", "VmRSS")


def available_bytes() -> int | None:
    """RAM that can be taken without swapping (Linux MemAvailable), or None."""
    return _proc_kib("/proc/meminfo", "MemAvailable")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class MemoryMeter:
    """Peak memory on ``device`` in one of :data:`SCOPES` (see the module docstring)."""

    def __init__(self, device: torch.device, scope: str) -> None:
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES} (got {scope!r})")
        self.device = device
        self.scope = scope
        self.resettable = device.type == "cuda" or scope == "tensors" or _reset_rss_peak()
        self.source = self._source()

    def _source(self) -> str:
        cuda = self.device.type == "cuda"
        if self.scope == "process":
            return "CUDA max_memory_reserved" if cuda else \
                "peak RSS (VmHWM, reset before each probe)" if self.resettable else \
                "peak RSS (ru_maxrss; probes ascending)"
        if self.scope == "tensors":
            return "torch.cuda.max_memory_allocated" if cuda else \
                "the CPU allocator's allocation events recorded by torch.profiler"
        return "torch.cuda.max_memory_allocated" if cuda else "peak RSS of the process"

    # ------------------------------------------------------------ a block of work
    def measure(self, work: Callable[[], Any]) -> int:
        """Run ``work`` and return its peak bytes."""
        with self.span() as result:
            work()
        return result["bytes"]

    @contextlib.contextmanager
    def span(self) -> Iterator[dict[str, int]]:
        """The peak of the ``with`` block, in ``result["bytes"]`` once it has left."""
        result = {"bytes": 0}
        if self.scope == "tensors":
            with self._tensor_span(result):
                yield result
            return
        free_memory(self.device)
        if self.device.type == "cuda":
            _sync(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            yield result
            _sync(self.device)
            result["bytes"] = int(torch.cuda.max_memory_reserved(self.device))
        elif self.resettable:
            _reset_rss_peak()
            yield result
            result["bytes"] = int(_proc_kib("/proc/self/status", "VmHWM") or 0)
        else:
            yield result
            result["bytes"] = _lifetime_rss_peak()

    @contextlib.contextmanager
    def _tensor_span(self, result: dict[str, int]) -> Iterator[None]:
        if self.device.type == "cuda":
            _sync(self.device)
            start = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            yield
            _sync(self.device)
            result["bytes"] = max(0, torch.cuda.max_memory_allocated(self.device) - start)
            return
        from torch.profiler import ProfilerActivity, profile

        with _native_stderr_silenced(), \
                profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            yield
        result["bytes"] = _peak_of_allocation_events(prof)

    # ------------------------------------------------------------ a whole run
    def start(self) -> None:
        """Begin a new running peak (CUDA only: a process's peak RSS cannot be reset)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        """The running peak since :meth:`start` (``"running"`` scope)."""
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return _lifetime_rss_peak()


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Hide the profiler's native start/stop lines (written straight to file descriptor 2)."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # pragma: no cover - no usable descriptor 2
        yield
        return
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _peak_of_allocation_events(prof: Any) -> int:
    """Running sum of the profiler's CPU allocation (+) and free (-) events; its maximum.

    The raw events carry every allocation with its size and time; the per-operator view
    only keeps each operator's net change, which would hide peaks inside an operator.
    """
    raw = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if raw is not None:
        events = [(e.start_ns(), e.nbytes()) for e in raw.events()
                  if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")]
    else:  # pragma: no cover - older profilers: per-operator net changes (a lower bound)
        events = [(e.time_range.start, e.self_cpu_memory_usage) for e in prof.events()]
    level = peak = 0
    for _, nbytes in sorted(events):
        level += nbytes
        peak = max(peak, level)
    return peak
