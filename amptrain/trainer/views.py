"""The Trainer's read-only views: what :meth:`Trainer.setup
<amptrain.trainer.Trainer.setup>` assembled (a :class:`~.parts.RunParts`, or the
:class:`~.parts.Prepared` of ``prepare()``), by name. Each is ``None`` (or empty) before a
set-up; the Trainer's loop and its callers read the parts through them.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..common.errors import UserError
from .parts import Prepared, RunParts

if TYPE_CHECKING:
    from ..config import TrainConfig
    from ..distributed import Strategy
    from .autobatch import MicroBatchSizer
    from .position import LoopPosition
    from .reporting import Reporter


class TrainerViews:
    """The parts of a set-up Trainer by name (the Trainer's base class)."""

    config: TrainConfig
    strategy: Strategy
    reporter: Reporter
    position: LoopPosition
    sizer: MicroBatchSizer
    _built: Prepared | None

    # ------------------------------------------------------- the parts, by name
    device = property(lambda self: self.strategy.device, doc="The training device.")
    step = property(lambda self: self.position.step, doc="Optimizer steps done.")
    epoch = property(lambda self: self.position.epoch, doc="The epoch in progress (from 0).")
    window_in_epoch = property(lambda self: self.position.window_in_epoch)
    callbacks = property(lambda self: self.reporter.callbacks, doc="The run's callbacks.")
    history = property(lambda self: self.reporter.history, doc="Every record of the run.")
    logger = property(lambda self: self.reporter.logger, doc="The run's RunLogger.")

    @property
    def out(self) -> Path | None:
        """The run directory (``out``), or None."""
        return Path(self.config.out) if self.config.out else None

    # What setup() assembled (None before it: see RunParts for each part).
    model = property(lambda self: self._built.model if self._built else None,
                     doc="The user's module, set up for the precision.")
    task = property(lambda self: self._built.task if self._built else None)
    evaluator = property(lambda self: self._built.evaluator if self._built else None)
    steps = property(lambda self: p.steps if (p := self._run_parts()) else None)
    train_windows = property(lambda self: p.windows if (p := self._run_parts()) else None,
                             lambda self, windows: self._ready().use_windows(windows))
    lr_schedule = property(lambda self: p.lr_schedule if (p := self._run_parts()) else None)
    run_length = property(lambda self: p.run_length if (p := self._run_parts()) else None)
    checkpointer = property(lambda self: p.checkpointer if (p := self._run_parts()) else None)
    step_context = property(lambda self: p.train_step if (p := self._run_parts()) else None,
                            doc="The TrainStep: the StepContext the step functions run "
                                "against (telemetry watches its loss).")
    total_steps = property(lambda self: p.run_length.total_steps
                           if (p := self._run_parts()) else 0)
    constant_lr = property(lambda self: bool((p := self._run_parts()) and p.constant_lr),
                           doc="The caller's optimizer without a schedule.")

    def _run_parts(self) -> RunParts | None:
        return self._built if isinstance(self._built, RunParts) else None

    last_eval = property(lambda self: self._built.evaluator.last if self._built else None,
                         doc="The last evaluation's result (None before one).")
    loss_fn = property(lambda self: self._built.evaluator.loss_fn if self._built else None,
                       doc="The loss of the supervised step and of evaluation.")
    parts = property(lambda self: p.steps.parts if (p := self._run_parts()) else {},
                     doc='The trained parts by name (one, "model", unless the task has several).')
    optimizers = property(lambda self: {n: p.optimizer for n, p in self.parts.items()})
    optimizer = property(lambda self: p.steps.only().optimizer if (p := self._run_parts())
                         else None, doc="The one optimizer (several parts: `optimizers`).")
    scheduler = property(lambda self: p.steps.only().scheduler if (p := self._run_parts())
                         else None)
    train_model = property(lambda self: p.steps.only().forward if (p := self._run_parts())
                           else None, doc="What the step calls (wrapped/compiled), one part.")
    micro_batch_size = property(lambda self: self._ready().windows.micro_batch,
                                doc="Samples per forward/backward on each device.")
    accumulate = property(lambda self: self.sizer.split.accumulate,
                          doc="Micro-batches per optimizer step on each device.")

    def _ready(self) -> RunParts:
        parts = self._run_parts()
        if parts is None:
            raise UserError("set the Trainer up first (setup() or fit())")
        return parts

