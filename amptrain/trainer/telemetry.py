"""The Trainer's side of ``--numerics`` and of the first non-finite's trace: a callback
that tells a :class:`~amptrain.numerics.session.NumericsSession` when steps begin and end,
hands it each step's loss, and replays the first step whose loss or gradients turned
non-finite (a skipped step, with or without a loss scaler)."""
from __future__ import annotations

from typing import Any

from ..common.forward import forward_batch
from ..config.train import numerics_period
from ..numerics.session import NumericsSession


class TrainerNumerics:
    """Callback (first in the Trainer's list) for ``numerics`` (``auto``, ``off``, N)."""

    def __init__(self, every: Any) -> None:
        numerics_period(every)  # a wrong value fails before the run starts
        self.every = every
        self.session: NumericsSession | None = None
        self._windows: dict[int, Any] = {}
        self._skipped = 0

    def on_fit_start(self, trainer: Any) -> None:
        main = trainer.strategy.is_main
        self.session = NumericsSession(
            trainer.model, trainer.precision.name, every=self.every,
            out=trainer.out, rank=trainer.strategy.rank,
            tb=trainer.logger.scalars if main else None, say=trainer.logger.message)
        self._windows.clear()
        self._skipped = trainer.precision.skipped_steps
        trainer.step_context.watch_loss = self.session.loss if self.session.enabled else None
        self.session.start(trainer.step + 1)

    def on_step_end(self, trainer: Any) -> None:
        session = self.session
        if session is None:
            return
        step = trainer.step
        # References only (no copy): the windows of this step and the one before, in case
        # either turns out to have been skipped.
        self._windows[step] = trainer.step_context.last_window
        self._windows.pop(step - 2, None)
        session.after(step)
        if trainer.precision.skipped_steps > self._skipped and session.trace is None:
            self._trace(trainer, step)
        self._skipped = trainer.precision.skipped_steps

    def _trace(self, trainer: Any, step: int) -> None:
        # A step's skip flag is read at the next step's optimizer step, or at once on a
        # log step (finish_step): which step that was follows from where we are.
        settled_now = step % trainer.config.logging.log_every == 0
        skipped = step if settled_now else step - 1
        window = self._windows.get(skipped)
        context = trainer.step_context
        assert self.session is not None
        if trainer.strategy.world_size > 1 and not trainer.precision.skips_agreed:
            # Only this rank may have skipped: a replay (its backward all-reduces) and the
            # gathering of traces are collectives the other ranks would not join.
            self.session.traced(skipped, [], None, exact=False, note="the ranks do not agree "
                                "on skipped steps, so the step is not replayed")
            return
        if window is None or context.training_step is not None:
            why = "the task's own training step is not replayed" \
                if context.training_step is not None else "its batch is no longer held"
            trace = self.session.traced(skipped, [], None, exact=False, note=why, say=False)
        else:
            model, precision, loss_fn = trainer.model, trainer.precision, context.loss_fn

            def run_one(batch: Any) -> None:
                with precision.autocast():
                    loss, _, _ = forward_batch(model, batch, loss_fn)
                precision.scale_loss(loss).backward()

            try:
                # Exact when nothing stepped since: the skipped step left the weights as they
                # were.
                trace = self.session.traced(skipped, window.micro_batches, run_one,
                                            exact=settled_now, say=False)
            finally:
                context.steps.zero_grad(optimizers=True)
        # Every rank skipped this step and traced it (a collective: the skip is agreed).
        self.session.publish(trainer.strategy.gather_objects(trace))

    def on_fit_end(self, trainer: Any) -> None:
        if self.session is not None:
            self.session.finish()
            trainer.step_context.watch_loss = None

    def close(self) -> None:
        """Take any hook off the model (the run ended, also by an error)."""
        if self.session is not None:
            self.session.recorder.detach()
