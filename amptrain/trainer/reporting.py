"""What the Trainer tells: log records (to the logger, the history and the callbacks), the
banner, the result, and where a halt began."""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..common.errors import UserError, flag
from ..common.forward import forward_batch
from .logs import RunLogger
from .memory import MemoryMeter
from ..common.nested import tensors
from ..precision.lowbit_settings import settings_shown
from ..precision.nonfinite import first_nonfinite_module
from ..precision import NonFiniteHalt, Precision, label
from ..tasks import Task
from .optimizers import OptimizerSteps
from .position import RunLength
from .result import FitResult
from .stepping import TrainStep


def loss_scales(precision: Precision) -> dict[str, float]:
    """``loss_scale/<id>`` for each loss's own scale (``separate_loss_scales``); nothing
    with one shared scale, which the record's ``loss_scale`` already is."""
    if not precision.separate_loss_scales:
        return {}
    return {f"loss_scale/{i}": scale for i, scale in sorted(precision.loss_scales().items())}


#: The first lines already shown inside :func:`banners_once` (None outside it).
_SHOWN: ContextVar[set[str] | None] = ContextVar("amptrain_banners_shown", default=None)


@contextmanager
def banners_once() -> Iterator[None]:
    """Inside, a Trainer's first line that was already shown is not shown again: a study
    (``compare``) sets up each precision several times, and says each one's line once."""
    token = _SHOWN.set(set())
    try:
        yield
    finally:
        _SHOWN.reset(token)


class Reporter:
    """The run's logger, callbacks, history of records and memory meter.

    ``callbacks`` are objects with any of ``on_fit_start(trainer)``,
    ``on_step_end(trainer)``, ``on_log(trainer, record)`` and ``on_fit_end(trainer)``.
    """

    def __init__(self, device: torch.device, callbacks: Iterable[Any],
                 print_every: int | None) -> None:
        self.callbacks = list(callbacks)
        self.print_every = print_every  # console lines (without a bar): every N steps
        self.memory = MemoryMeter(device, "running")
        self.logger = RunLogger(None, enabled=False)
        self.history: list[dict[str, Any]] = []

    def reset(self) -> None:
        """A new fit: no records yet, no logger."""
        self.logger = RunLogger(None, enabled=False)
        self.history = []

    def open(self, out: Path | None, *, enabled: bool, progress: bool, resumed_at: int | None,
             loggers: Any, params: dict[str, Any] | None, task: Task | None = None) -> None:
        """The run's logger (metrics.jsonl, trackers, the bar); ``task``'s own fields shown."""
        self.logger = RunLogger(out, enabled=enabled, progress=progress, resumed_at=resumed_at,
                                print_every=self.print_every, loggers=loggers, params=params,
                                shown=task.logs.shown_fields if task is not None else (),
                                speeds=task.logs.speed_units if task is not None else None)

    def record(self, trainer: Any, record: dict[str, Any]) -> None:
        """Log ``record`` and keep it; callbacks' ``on_log(trainer, record)`` see it."""
        self.history.append(record)
        self.logger.log(record)
        for cb in self.callbacks:
            if hasattr(cb, "on_log"):
                cb.on_log(trainer, record)

    def emit(self, trainer: Any, event: str) -> None:
        """Call every callback's ``event(trainer)``."""
        for cb in self.callbacks:
            hook = getattr(cb, event, None)
            if hook is not None:
                hook(trainer)

    def announce(self, text: str) -> None:
        """Show the run's first line (:meth:`banner`), unless :func:`banners_once` has."""
        shown = _SHOWN.get()
        if shown is not None:
            if text in shown:
                return
            shown.add(text)
        self.logger.message(text)

    @staticmethod
    def banner(precision: Precision, *, device: torch.device, world_size: int,
               run_length: RunLength, batch_size: int, micro: int, accumulate: int,
               task_words: str, constant_lr: bool) -> str:
        """The run's first line: precision, how many steps and why, batch split, task, LR
        note."""
        p = precision
        chosen = f" (auto: {p.name})" if p.requested == "auto" else ""
        processes = f" x {world_size} processes" if world_size > 1 else ""
        constant = ("; your optimizer keeps its learning rate (no schedule)"
                    if constant_lr else "")
        task = f"; {task_words}" if task_words else ""
        name = label(p.name, p.given)  # the user's spelling beside: 16-mixed (mixed_float16)
        # what runs: the mode's summary, and the low-bit settings it reads away from their
        # defaults (nvfp4 ... ; without rht)
        summary = "; ".join([p.spec.summary, *settings_shown(p.spec, p.config)])
        return (f"amptrain: precision {name}{chosen} [{summary}] on {device}; "
                f"{run_length.total_steps} step{'s' * (run_length.total_steps != 1)} "
                f"({run_length.why}) of {batch_size} samples "
                f"({micro} x {accumulate} accumulated{processes}){task}{constant}")

    def train_record(self, *, step: int, epoch: int, window: dict[str, Any],
                     grad_norms: dict[str, torch.Tensor | None], steps: OptimizerSteps,
                     precision: Precision, task: Task) -> dict[str, Any]:
        """A training record (reads the device): the logged means of the window, each
        part's LR, gradient norm and skips (one part: ``lr``, ``grad_norm``), the loss
        scale (and ``loss_scale/<id>`` per loss with separate scales), speeds and memory."""
        norms = {("grad_norm" if steps.single else f"grad_norm/{name}"):
                 float(norm.item()) if (norm := grad_norms.get(name)) is not None else None
                 for name in steps.parts}
        record = {"step": step, "epoch": epoch, **window["means"], **steps.records(),
                  "loss_scale": precision.loss_scale, **loss_scales(precision), **norms,
                  "skipped_steps": precision.skipped_steps, **steps.skipped_records(),
                  "samples_per_s": window["samples_per_s"],
                  "data_wait_frac": window["data_wait_frac"], "peak_mem_bytes": self.memory.peak()}
        record.update(task.logs.throughput(record["samples_per_s"]))  # the task's speeds
        return record

    @staticmethod
    def explain_halt(halt: NonFiniteHalt, train_step: TrainStep, model: nn.Module,
                     precision: Precision) -> NonFiniteHalt:
        """Add the first module that produced a non-finite value to a halt message: the
        supervised step's last batch, run again (a task's own step is not rerun)."""
        window = train_step.last_window
        if train_step.training_step is not None or window is None:
            return halt
        batch, loss_fn = window.micro_batches[0], train_step.loss_fn
        if any(t.is_floating_point() and not bool(torch.isfinite(t).all())
               for micro in window.micro_batches for t in tensors(micro)):
            # Only now, on the slow path: the data is at fault, not the learning rate.
            which = flag("data") if flag("data").startswith("--") else "train_data"
            raise UserError(f"the training data ({which}) is not finite: the batch of "
                            f"the step that stopped training holds NaN or infinite values; "
                            f"check the data (lowering {flag('lr')} will not help)")

        def rerun() -> None:
            with precision.autocast():
                loss, _, _ = forward_batch(model, batch, loss_fn)
            precision.scale_loss(loss).backward()

        where = first_nonfinite_module(model, rerun)
        train_step.steps.zero_grad(optimizers=True)
        if where is None:
            return halt
        module, phase = where
        return NonFiniteHalt(f"{halt}. First non-finite value: module '{module}' ({phase})",
                             halt.step)

    def result(self, precision: Precision, *, steps: int, epochs: int, last_eval: Any,
               out: Path | None, task: Task | None) -> FitResult:
        """What ``fit`` returns, from the history (with the medians of ``task``'s speeds)."""
        train = [r for r in self.history if "samples_per_s" in r]
        speeds = [r["samples_per_s"] for r in train if r.get("samples_per_s")]
        units = dict(task.logs.speed_units) if task is not None else {}
        medians = {key: float(np.median(values)) for key in units
                   if (values := [r[key] for r in train if r.get(key)])}
        waits = [r["data_wait_frac"] for r in train if r.get("data_wait_frac") is not None]
        return FitResult(
            precision=precision.name, steps=steps, epochs_completed=epochs,
            final_loss=train[-1].get("loss") if train else None,
            val_loss=last_eval.loss if last_eval else None,
            val_metrics=dict(last_eval.metrics) if last_eval else {},
            skipped_steps=precision.skipped_steps,
            samples_per_s=float(np.median(speeds)) if speeds else None,
            speeds=medians, speed_units={key: units[key] for key in medians},
            data_wait_frac=float(np.median(waits)) if waits else None,
            peak_mem_bytes=self.memory.peak(),
            out=str(out) if out else None, history=list(self.history),
            learning_note=last_eval.task.wording.learning_note(last_eval)
            if last_eval is not None and last_eval.task is not None else None)
