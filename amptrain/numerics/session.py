"""The telemetry of one run, for any loop: :class:`NumericsSession` is told when a step
begins and ends (by the Trainer's :class:`TrainerNumerics` callback, or by the Hugging Face
and Lightning callbacks) and does the rest -- attach on sampled steps, read, write.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from ..common.errors import AmptrainWarning

from ..common import clock
from .outputs import NumericsLog, scalars
from ..config.train import numerics_period
from .recorder import LayerRecorder, Schedule
from .stats import run_formats, unpack
from .trace import NonFiniteTrace, replay


class NumericsSession:
    """Sampled per-layer telemetry of ``model`` in a run of ``precision`` (a resolved mode
    name). ``every``: ``--numerics`` (``auto``, ``off`` or N). ``out``: the run directory
    (``numerics.jsonl``, ``numerics.png``, ``nonfinite.json``); ``tb(step, scalars)``:
    where TensorBoard scalars go; ``say(line)``: the user's output."""

    def __init__(self, model: nn.Module, precision: str, *, every: Any = "auto",
                 out: Path | None = None, rank: int = 0,
                 tb: Callable[[int, dict[str, float]], None] | None = None,
                 say: Callable[[str], None] = print) -> None:
        period = numerics_period(every)
        self.enabled = period is not None
        self.schedule = Schedule(period or 0)
        self.formats = run_formats(precision)
        self.recorder = LayerRecorder(model, self.formats.__getitem__)
        self.model = model
        self.out, self.rank, self.tb, self.say = out, rank, tb, say
        self.log = NumericsLog(out if rank == 0 else None)
        self.trace: NonFiniteTrace | None = None
        self._last_end: float | None = None

    # --------------------------------------------------------------- telemetry
    def start(self, step: int) -> None:
        """Before the run's first step, ``step`` (1-based)."""
        self._last_end = clock.now()
        self.before(step)

    def before(self, step: int) -> None:
        """Step ``step`` is next: hooks on if it is sampled (otherwise nothing at all)."""
        if self.enabled and self.schedule.is_sampled(step) and not self.recorder.attached:
            self.recorder.attach()

    def after(self, step: int) -> None:
        """Step ``step`` has ended: a sampled one is read and written."""
        if not self.enabled:
            return
        sampled = self.recorder.attached
        if sampled:
            self._write(step, self.recorder.collect())
        now = clock.now()
        seconds = now - self._last_end if self._last_end is not None else None
        self.schedule.timed(step, seconds, sampled)
        self._last_end = clock.now()  # our own writing is not the next step's time
        self.before(step + 1)

    def loss(self, loss: Any) -> None:
        """A step's loss tensor (recorded as module ``loss`` on sampled steps)."""
        if self.recorder.attached:
            self.recorder.loss(loss)

    def _write(self, step: int, rows: list[tuple[str, str, list[float]]]) -> None:
        records = [{"step": step, "module": module, "tensor": kind,
                    **unpack(vector, self.formats[kind])}
                   for module, kind, vector in rows]
        if self.rank == 0:
            self.log.write(records)
            if self.tb is not None and records:
                self.tb(step, scalars(records))

    def finish(self) -> Path | None:
        """The end of the run: hooks off, ``numerics.png`` drawn (None if nothing was
        sampled or there is no run directory)."""
        self.recorder.detach()
        return self.log.picture() if self.rank == 0 else None

    # ------------------------------------------------------------ non-finite
    def seen(self, step: int, module: str, phase: str, note: str) -> NonFiniteTrace:
        """A first non-finite value that a live watch already located (the callbacks'):
        written as ``nonfinite.json``, inputs unknown (a live watch keeps none)."""
        if self.trace is None:
            self.trace = NonFiniteTrace(step, self.rank, module, phase, None, True, note)
            self._write_trace()
        return self.trace

    def _write_trace(self) -> None:
        if self.out is None or self.trace is None:
            return
        try:
            self.trace.write(self.out)
        except OSError as exc:  # the line above said it; a full disk does not stop the run
            warnings.warn(f"numerics: nonfinite.json not written ({exc.strerror or exc})",
                          AmptrainWarning, stacklevel=3)

    def traced(self, step: int, micro_batches: Sequence[Any], run_one: Callable[[Any], None]
               | None, *, exact: bool, note: str = "", say: bool = True) -> NonFiniteTrace:
        """Trace the first non-finite step (``step``) once: replay its micro-batches with
        ``run_one`` (None: the step cannot be replayed, ``note`` says why), then say it
        and write ``nonfinite.json`` (unless ``say`` is False: the caller gathers every
        rank's trace and calls :meth:`publish`). Later calls return the first trace."""
        if self.trace is not None:
            return self.trace
        attached = self.recorder.attached
        self.recorder.detach()
        found = replay(self.model, micro_batches, run_one) if run_one is not None else None
        if found is None:
            note = note or ("the replayed forward and backward were finite: the loss "
                            "scale or the optimizer's arithmetic overflowed")
            trace = NonFiniteTrace(step, self.rank, None, None, None, exact, note)
        else:
            trace = NonFiniteTrace(step, self.rank, *found, exact, note)
        self.trace = trace
        if attached:
            self.recorder.attach()
        if say:
            self.say(trace.line())
            self._write_trace()
        return trace

    def publish(self, traces: Sequence[NonFiniteTrace]) -> NonFiniteTrace:
        """Every rank's trace of the same step (rank order): say the first that found the
        module (under DDP the other ranks' replays are finite: the all-reduce only carried
        it to them), and write this rank's, saying where it was found."""
        assert self.trace is not None
        found = next((t for t in traces if t.module is not None), self.trace)
        if self.trace.module is None and found is not self.trace:
            self.trace = dataclasses.replace(
                self.trace, note=f"this rank's replayed forward and backward were finite; "
                                 f"it began on rank {found.rank}, in module '{found.module}'")
        self.say(found.line())
        self._write_trace()
        return found
