"""``amptrain compare``: the A/B precision study.

Trains the same model in several precisions (and seeds) with identical initial weights
and identical data order, then answers "is it as accurate, and how much faster and
smaller?" in ``compare.json``, ``report.md``, ``report.html`` and ``compare.png``.

Three measurements, each done the fair way:

* **Accuracy** -- each precision x seed is a normal ``train`` run (``runner.run_training``)
  under ``DIR/runs/<precision>/seed-<s>/``. A probe checks, for every run, that the model
  the precision trains starts from the seed's weights and sees the seed's data order.
* **Speed** -- one fully set-up Trainer per precision in this process; timed optimizer
  steps alternate between them (``--interleave``) so machine drift hits all alike.
  Warm-up steps are excluded, each step is bracketed by a device sync, and the median
  step time is reported (samples/s = global batch / median step time).
* **Memory** -- model state (weights, buffers, optimizer state, master copies) plus the
  largest transient working set of a training step (activations, gradients, autocast
  copies) above it. On CUDA from ``torch.cuda.max_memory_allocated``; on CPU from the
  allocation events of PyTorch's CPU allocator recorded by the profiler, because the
  process's peak RSS only ever grows and cannot separate precisions run in one process.

The face is lazy (:mod:`amptrain.common.lazy`): ``compare --help`` reads :mod:`.options`
(torch-free) without importing the study's torch-using modules.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..common.lazy import lazy_exports

if TYPE_CHECKING:
    from .options import (
        CURVE_POINTS,
        MEMORY_STEPS,
        SUMMARY_FIELDS,
        CompareOptions,
        resolve_precisions,
    )
    from .pipeline import check_out, run_compare
    from .reliability import assess_timing
    from .runs import RunProbe, digest, first_step_loss_fp32, train_runs
    from .summary import summarise
    from .timing import (
        Contender,
        build_contender,
        measure_peak_memory,
        measure_speed_and_memory,
        memory_method,
        speed_figures,
        state_bytes,
        sync,
    )

_WHERE = {
    ".options": ("CURVE_POINTS", "MEMORY_STEPS", "SUMMARY_FIELDS", "CompareOptions",
                 "resolve_precisions"),
    ".pipeline": ("check_out", "run_compare"),
    ".reliability": ("assess_timing",),
    ".runs": ("RunProbe", "digest", "first_step_loss_fp32", "train_runs"),
    ".summary": ("summarise",),
    ".timing": ("Contender", "build_contender", "measure_peak_memory",
                "measure_speed_and_memory", "memory_method", "speed_figures", "state_bytes",
                "sync"),
}
__getattr__ = lazy_exports(__name__, {name: module for module, names in _WHERE.items()
                                      for name in names})

__all__ = ["CURVE_POINTS", "MEMORY_STEPS", "SUMMARY_FIELDS", "CompareOptions", "Contender",
           "RunProbe", "assess_timing", "build_contender", "check_out", "digest",
           "first_step_loss_fp32",
           "measure_peak_memory", "measure_speed_and_memory", "memory_method",
           "resolve_precisions", "run_compare", "speed_figures", "state_bytes", "summarise",
           "sync", "train_runs"]
