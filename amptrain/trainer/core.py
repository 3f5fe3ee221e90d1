"""The training loop. It owns no precision logic and no task logic: every precision difference
lives in :class:`~amptrain.precision.Precision` (its mode decided once, before), every task
difference in the :class:`~amptrain.tasks.Task`, every process-group one in the strategy.

The Trainer owns LoopPosition, LogInterval, Reporter and the MicroBatchSizer from the
start and keeps what :meth:`Trainer.setup` assembles as one :class:`~.parts.RunParts`
(OptimizerSteps, TrainStep, Evaluator, Checkpointer, the train windows); every part with
state is registered with the Checkpointer under its section (docs/architecture.md).

One optimizer step ("step") is one global batch: ``accumulate`` micro-batches per rank.
``--max-steps``, ``--log-every``, ``--save-every`` and the LR schedule count steps.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from .. import checkpoint
from . import datacheck, preemption
from ..common import clock, outdir
from .autobatch import MicroBatchSizer, MicroBatchSplit
from ..config import TrainConfig, write_yaml
from ..distributed import Strategy, build_strategy
from ..common.errors import UserError, flag
from ..common.forward import LossFn
from ..precision import NonFiniteHalt, Precision, ResolvedPrecision
from ..precision.outcome import diagnose_hint
from .streams import as_dataset
from ..tasks import EvalResult, Task, resolve_task
from ..tasks.base import EvaluationStopped
from ..tasks.step import StepContext
from .batching import agreement
from .assembly import assemble_parts, begin_run, placed
from .checkpointing import resolved_config
from .evaluation import Evaluator
from .loop import TaskLoop
from .metrics import LogInterval
from .parts import Prepared, RunParts
from .position import LoopPosition
from .reporting import Reporter
from .result import FitResult
from .stepping import StepFn
from .telemetry import TrainerNumerics
from .views import TrainerViews

log = logging.getLogger("amptrain")


class Trainer(TrainerViews):
    """The whole training loop: accumulation, clipping, logging, evaluation, checkpoints.

    ``Trainer(precision="bf16-mixed", accumulate=4, clip_grad_norm=1.0, out="runs/x")``
    takes any option of :class:`TrainConfig` by its flat name, or a ready ``config``.
    ``callbacks`` are objects with any of ``on_fit_start(trainer)``,
    ``on_step_end(trainer)``, ``on_log(trainer, record)`` and ``on_fit_end(trainer)``.
    """

    def __init__(self, config: TrainConfig | None = None, *, strategy: Strategy | None = None,
                 callbacks: Iterable[Any] = (), run_info: dict[str, Any] | None = None,
                 print_every: int | None = None, precision_mode: ResolvedPrecision | None = None,
                 **options: Any) -> None:
        # The keywords join the options the config carries as given (config.given).
        self.config: TrainConfig = (config or TrainConfig()).with_given_options(**options)
        c = self.config
        self.strategy = strategy or build_strategy(c.distributed.strategy, c.device)
        # The numerics telemetry runs first: its step-end read precedes other callbacks'.
        self._numerics = TrainerNumerics(c.logging.numerics)
        self.reporter = Reporter(self.device, [self._numerics, *callbacks], print_every)
        self.run_info = dict(run_info or {})
        self._reset(precision_mode)

    def _reset(self, mode: ResolvedPrecision | None = None) -> None:
        """A fresh precision and loop state: each fit trains its model from step 0."""
        c = self.config
        self.precision = Precision.from_config(c.precision, device=self.device, mode=mode)
        self.reporter.reset()
        self.position = LoopPosition()
        self.log_interval = LogInterval(self.device)
        # --micro-batch-size auto and out-of-memory recovery.
        self.sizer = MicroBatchSizer(self.device, batch_size=c.batching.batch_size,
                                         world_size=self.strategy.world_size,
                                         memory_budget_gb=c.batching.memory_budget_gb,
                                         agree=agreement(self.strategy))
        # What prepare() (a Prepared) or setup() (RunParts) built; None: neither ran yet.
        self._built: Prepared | None = None
        self.stop_requested: str | None = None  # set by a signal handler
        self._stopping: str | None = None        # the stop all ranks agreed on
        self.resumed_finished = False

    # ---------------------------------------------------------------- public
    def fit(self, model: nn.Module, train_data: Dataset | DataLoader | Iterable,
            val_data: Dataset | DataLoader | Iterable | None = None, *,
            optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
            loss_fn: LossFn | None = None, class_names: list[str] | None = None,
            task: Task | None = None, training_step: StepFn | None = None) -> FitResult:
        """Train ``model`` on ``train_data``; evaluate on ``val_data`` each epoch and at the end.

        Data may be a map-style Dataset (amptrain then owns batching, shuffling, sharding
        and exact resume) or a DataLoader / iterable of batches (each batch is one
        micro-batch; ``accumulate`` of them make a step). The task (loss and metrics) is
        the ``task`` option (``auto``: regression for float targets, ``lm`` for text data,
        else classification), or a :class:`~amptrain.tasks.Task` object given here.
        ``scheduler`` is a ``torch.optim.lr_scheduler`` object of ``optimizer``, stepped once
        per epoch (as in Lightning and pytorch/examples), or a dict ``{"scheduler": s,
        "interval": "epoch" | "step", "frequency": n}``; the run's first line says which.
        ``training_step(ctx)`` replaces the task's step (a
        :class:`~amptrain.tasks.step.StepContext` is its whole view of the Trainer).
        The user's module keeps no patched forward afterwards, also when fit raises.
        """
        self.setup(model, train_data, val_data, optimizer=optimizer, scheduler=scheduler,
                   loss_fn=loss_fn, class_names=class_names, task=task,
                   training_step=training_step)
        return self.run()

    def setup(self, model: nn.Module, train_data: Any, val_data: Any = None, *,
              optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
              loss_fn: LossFn | None = None, class_names: list[str] | None = None,
              task: Task | None = None, training_step: StepFn | None = None) -> None:
        """Everything :meth:`fit` does before its first step (resume included).

        Split out so that tools (``compare``'s interleaved timing) can drive single steps
        with :meth:`train_step` on a fully prepared Trainer. A set-up that fails leaves the
        model without patched forwards.
        """
        names = datacheck.check_fit_arguments(model, train_data, val_data, optimizer=optimizer,
                                              loss_fn=loss_fn, class_names=class_names,
                                              task=task)
        if training_step is not None and not callable(training_step):
            raise UserError(f"training_step must be a function of one StepContext (got "
                            f"{type(training_step).__name__})")
        if self._built is not None:  # a second fit: a new model, trained from step 0
            self._reset(self.precision.mode)
        try:
            self._built = assemble_parts(
                model, train_data, val_data, config=self.config, strategy=self.strategy,
                precision=self.precision, sizer=self.sizer, position=self.position,
                interval=self.log_interval, out=self.out, run_info=self.run_info,
                resolved=self.resolved_config, optimizer=optimizer,
                scheduler=scheduler, loss_fn=loss_fn, class_names=names, task=task,
                training_step=training_step)
            self._built.train_step.on_split = self._use_split  # after out-of-memory
            self.resumed_finished = begin_run(
                self._built, config=self.config, strategy=self.strategy, out=self.out,
                precision=self.precision, reporter=self.reporter, position=self.position,
                sizer=self.sizer, resolved=self.resolved_config, run_info=self.run_info)
        except BaseException:
            self._teardown()
            self._reset(self.precision.mode)  # a failed set-up may have used it: a fresh one
            raise

    def run(self) -> FitResult:
        """The training loop on a Trainer prepared by :meth:`setup`."""
        parts = self._ready()
        train_step, windows, checkpointer = parts.train_step, parts.windows, parts.checkpointer
        position, interval = self.position, self.log_interval
        self.reporter.emit(self, "on_fit_start")
        try:
            with preemption.stop_on_signals(self):
                # Inside: a second signal while the last checkpoint is written still exits.
                try:
                    self.reporter.memory.start()
                    interval.start(position.step)
                    if parts.task.iteration.owns:  # PPO's updates: the task iterates (loop.py)
                        parts.task.iteration.iterate(TaskLoop(self))
                    while not self._done() and not parts.task.iteration.owns:
                        fresh = self._start_epoch(windows)
                        for window in interval.timed(windows.epoch(position.epoch,
                                                                   position.window_in_epoch)):
                            with train_step.on(window, position.step + 1) as step_function:
                                step_function(train_step)
                            position.advance()
                            self._after_step()
                            if self._done():
                                break
                        if self._end_of_epoch(windows, fresh):
                            break
                    self._end_of_run()
                except BaseException as exc:
                    checkpointer.wait(failing=exc)
                    raise
                checkpointer.wait()
        except NonFiniteHalt as halt:
            raise self._explain_halt(halt) from None
        finally:
            self.logger.close()
            # The user's model gets its own forward back (islands, fp16 convs): it must
            # behave as before fit, also after an error. evaluate() reinstates them.
            self._teardown()
        self.reporter.emit(self, "on_fit_end")
        result = self.reporter.result(self.precision, steps=self.step, epochs=self.epoch,
                                      last_eval=self.last_eval, out=self.out,
                                      task=self.task)
        bad = result.nonfinite_metrics()
        if bad:
            log.warning("training finished with non-finite %s: the model diverged (lower %s, "
                        "set %s, or run %s)", " and ".join(bad), flag("lr"),
                        flag("clip_grad_norm"), diagnose_hint())
        return result

    def train_step(self, window: Any) -> None:
        """One optimizer step of every part on ``window`` (a
        :class:`~amptrain.trainer.windows.StepBatch` on the device), without the loop's bookkeeping
        (logging, evaluation, checkpoints, step counter)."""
        train_step = self._ready().train_step
        with train_step.on(window, self.step + 1) as step_function:
            step_function(train_step)

    def finish_step(self) -> None:
        """Wait for the last step and account for it (skip flags, LR schedules)."""
        if isinstance(self._built, RunParts):
            self._built.steps.settle()

    def evaluate(self, model: nn.Module | None = None, data: Any = None, *,
                 write_dir: str | Path | None = None, full: bool = False) -> EvalResult:
        """The loss and the task's metrics on ``data`` under the training autocast.

        With ``write_dir`` the task's eval reports go there (rank 0 only). With the
        ``eval_batches`` option only a fixed sample of that many batches is read, unless
        ``full``.
        """
        built = self._built
        model = model if model is not None else built.model if built is not None else None
        # Data given here enters as fit's does: a list of samples becomes a dataset, once.
        data = as_dataset(data, "data") if data is not None \
            else built.evaluator.val_data if built is not None else None
        if model is None or data is None or built is None:
            raise UserError("evaluate() needs a model and data after prepare() or fit()")
        return built.evaluator.evaluate(model, data, logger=self.logger, write_dir=write_dir,
                                        full=full)

    def prepare(self, model: nn.Module, class_names: list[str] | None = None,
                task: Task | None = None) -> nn.Module:
        """Set a model up for this precision and device without training (for evaluation);
        ``task`` defaults to the ``task`` option's (classification over ``class_names``
        when the option is ``auto``)."""
        task = task or resolve_task(self.config.task, None, loss=self.config.loss,
                                    class_names=class_names)
        evaluator = Evaluator(self.config, self.strategy, self.precision, task, task.loss)
        model, _ = self.precision.setup(placed(model, self.device, self.config), None)
        model.eval()
        self._built = Prepared(model=model, task=task, evaluator=evaluator)
        return model

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Load fp32 weights (a checkpoint's ``model`` entry) into the prepared model."""
        if self._built is None:
            raise UserError("load_weights() needs a model: call prepare() or setup() first")
        checkpoint.load_weights(self._built.model, state, self.strategy, self.precision)

    def save_checkpoint(self, path: str | Path | None = None) -> Path | None:
        """Write the full training state (rank 0) to ``path`` or ``OUT/checkpoints/last.pt``;
        returns once the file is complete (a background write in flight is waited for first)."""
        return self._save(path, background=False)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: the parts' state (weights in fp32)."""
        return self._ready().checkpointer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into a prepared Trainer (after model/optimizer setup)."""
        self._ready().checkpointer.load_state_dict(state)

    def resolved_config(self) -> dict[str, Any]:
        """The config as run: precision resolved, batching and learning rate derived."""
        parts = self._run_parts()
        return resolved_config(
            self.config, precision=self.precision.name, device=self.device,
            world_size=self.strategy.world_size, lr_schedule=parts.lr_schedule if parts else None,
            micro=parts.windows.micro_batch if parts is not None else None,
            accumulate=self.accumulate if parts is not None else None,
            sizer_report=self.sizer.report(), run_info=self.run_info)

    def _teardown(self) -> None:
        """The user's module gets its own forwards back (evaluate() reinstates them), and
        ``out`` its lock (outdir.make_run_dir took it)."""
        outdir.release(self.out)
        self._numerics.close()  # no telemetry hook stays on the user's modules
        self.precision.teardown()
        if self._built is not None:
            self._built.evaluator.patches_removed = True
            self._built.task.close()  # its environments (async workers) end with the run

    # ------------------------------------------------------------------ loop
    def _start_epoch(self, windows: Any) -> int | None:
        """The epoch's progress bar; the step it starts at when it starts fresh."""
        position = self.position
        # Epochs count from 0, as in metrics.jsonl and the log lines: "epoch 0 (0-2)".
        self.logger.bar(len(windows), self._ready().run_length.epoch_label(position.epoch),
                        position.window_in_epoch)
        return position.step if position.window_in_epoch == 0 else None

    def _end_of_epoch(self, windows: Any, fresh: int | None, *, saves: bool = True) -> bool:
        """After an epoch's windows ran out or the run stopped: True when the loop must
        end although its length is not reached (a stream whose epoch gave nothing).
        ``saves``: whether the epoch's end is a checkpoint point (a task's loop says)."""
        position = self.position
        # A stream (amptrain.trainer.streams) has no length: its epoch ends when it runs out.
        if position.window_in_epoch >= len(windows) or windows.ended:
            position.next_epoch()
            self._ready().steps.epoch_ended()  # a per-epoch schedule steps
            self._epoch_ended(saves=saves)
            return position.step == fresh  # a whole epoch gave nothing: a stream read once
        return False

    def _end_of_run(self) -> None:
        if self._stopping is not None and not self.complete():
            raise self._preempted()
        self.finish_step()
        if self.position.step != self.log_interval.start_step:
            self._log_train()
        self.logger.close_bar()
        if self._has_val():
            # A finished run that was resumed has its final record already.
            self._evaluate_and_log(final=True, record=not self.resumed_finished)
        if self.out is not None and not self._ready().checkpointer.saved_at(self.step):
            self.save_checkpoint()

    def _done(self) -> bool:
        return self.complete() or self._stopping is not None

    def complete(self) -> bool:
        """Whether the run's length (:class:`RunLength`) is reached."""
        parts = self._run_parts()
        return parts is not None and parts.run_length.reached(self.position)

    def _agree_on_stop(self) -> None:
        self._stopping = preemption.agreed_stop(self.stop_requested, self._stopping, self.step,
                                                self.config.logging.log_every, self.strategy)

    def _after_step(self) -> None:
        self.logger.advance()
        c = self.config
        if self.step % c.logging.log_every == 0:
            self.finish_step()
            self._log_train()
        self.reporter.emit(self, "on_step_end")
        if c.logging.eval_every and self.step % c.logging.eval_every == 0 \
                and self._has_val():
            self._evaluate_and_log()
        if c.checkpointing.save_every and self.step % c.checkpointing.save_every == 0 \
                and self.out is not None:
            self._save(background=True)
        self._agree_on_stop()

    def _epoch_ended(self, *, saves: bool = True) -> None:
        if self._done():
            return  # the final evaluation and checkpoint follow right away
        if not self.config.logging.eval_every and self._has_val():
            self._evaluate_and_log()
        if saves and self.out is not None \
                and not self._ready().checkpointer.saved_at(self.step):
            self._save(background=True)

    def _has_val(self) -> bool:
        return self._built is not None and self._built.evaluator.val_data is not None

    def _use_split(self, split: MicroBatchSplit) -> None:
        """The one place a smaller micro-batch takes effect (after out-of-memory)."""
        self.sizer.use(split)
        self._ready().windows.resize(split.micro_batch)  # later epochs are cut the new way
        for event in self.sizer.new_events():
            self.logger.message(f"amptrain: {event['message']}")
        if self.strategy.is_main and self.out is not None:
            write_yaml(self.resolved_config(), self.out / "config.yaml")

    # --------------------------------------------------------- records, saves
    def _log_train(self) -> None:
        parts = self._ready()
        self.reporter.record(self, self.reporter.train_record(
            step=self.step, epoch=self.position.step_epoch, task=parts.task,
            window=self.log_interval.read(self.strategy, self.step), steps=parts.steps,
            grad_norms=self.log_interval.grad_norms, precision=self.precision))

    def _evaluate_and_log(self, final: bool = False, record: bool = True) -> None:
        parts = self._ready()
        self.finish_step()
        started = clock.now()
        try:
            result = parts.evaluator.at_step(parts.model, self.step, logger=self.logger,
                                             final=final, out=self.out,
                                             stopping=self._stop_now)
        except EvaluationStopped:
            # A signal during a long evaluation (many long episodes): stop now with the
            # checkpoint, as after any step, instead of after the whole pass.
            self._stopping = self.stop_requested
            if final:
                raise self._preempted() from None
            return
        if result is not None and record:
            self.reporter.record(self, {"step": self.step, "epoch": self.position.step_epoch,
                                        **result.record()})
            self.logger.images(self.step, result.details.get("images") or {})
        # Evaluation time is not training time: keep it out of samples_per_s.
        self.log_interval.pause(clock.now() - started)

    def _stop_now(self) -> bool:
        """Whether an evaluation pass is abandoned: a signal arrived, and this process
        alone decides (several must agree at a step: they finish the pass together)."""
        return self.stop_requested is not None and self.strategy.world_size == 1

    def _save(self, path: str | Path | None = None, *, background: bool) -> Path | None:
        """:meth:`save_checkpoint`; ``background``: the file is written on a thread."""
        return self._ready().checkpointer.save_run(self.step, path, background=background)

    def _preempted(self) -> Exception:
        """Checkpoint after a stop request (a signal) and build the exception that ends the run.

        No log record and no evaluation: the grace period before SIGKILL is short, and the
        log interval in progress is saved, so the resumed run logs what this one would.
        """
        assert self._stopping is not None  # only called once all ranks agreed to stop
        path = None
        if self.out is not None:
            path = self.out / checkpoint.CHECKPOINT_DIR / checkpoint.LAST \
                if self._ready().checkpointer.saved_at(self.step) else self.save_checkpoint()
        else:
            self.finish_step()
        return preemption.preempted(self._stopping, self.step, path)

    def _explain_halt(self, halt: NonFiniteHalt) -> NonFiniteHalt:
        """Add the first module that produced a non-finite value to a halt message."""
        parts = self._run_parts()
        if parts is None:
            return halt
        return Reporter.explain_halt(halt, parts.train_step, parts.model, self.precision)


__all__ = ["StepContext", "Trainer"]
