"""The training loop. It owns no precision logic and no task logic: every precision
difference lives in :class:`~amptrain.precision.Precision`, every task difference in the
:class:`~amptrain.tasks.Task`, every process-group difference in the strategy.

One optimizer step ("step") is one global batch: ``accumulate`` micro-batches per rank.
``--max-steps``, ``--log-every``, ``--save-every`` and the LR schedule count steps.
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from .. import checkpoint
from . import datacheck, outdir, preemption
from ..autobatch import MicroBatchSplit, MicroBatchPlanner
from ..batches import StepBatch
from ..config import TrainConfig, build_config, to_dict, write_yaml
from ..distributed import Strategy, build_strategy
from ..errors import UserError, flag
from .evaluation import evaluate as evaluate_pass
from ..inapplicable import warn_inapplicable
from ..logs import RunLogger
from ..optim import LrPlan, plan_lr
from ..memory import MemoryMeter
from ..models import is_conv_net
from ..optim import build_optimizer, build_scheduler
from ..precision import NonFiniteHalt, Precision, StepOutcome
from ..reproducibility import seed_everything, tune_backends
from .snapshot import StepStart
from ..forward import LossFn, forward_batch
from ..streams import as_dataset
from ..tasks import ClassificationTask, EvalResult, Task, resolve_task
from .batching import BatchPlanningMixin
from .checkpointing import CheckpointingMixin
from .data import DataMixin
from .reporting import ReportingMixin
from .result import FitResult

log = logging.getLogger("amptrain")


class Trainer(CheckpointingMixin, ReportingMixin, BatchPlanningMixin, DataMixin):
    """The whole training loop: accumulation, clipping, logging, evaluation, checkpoints.

    ``Trainer(precision="bf16-mixed", accumulate=4, clip_grad_norm=1.0, out="runs/x")``
    takes any option of :class:`TrainConfig` by its flat name, or a ready ``config``.
    ``callbacks`` are objects with any of ``on_fit_start(trainer)``,
    ``on_step_end(trainer)``, ``on_log(trainer, record)`` and ``on_fit_end(trainer)``.
    """

    def __init__(self, config: TrainConfig | None = None, *, strategy: Strategy | None = None,
                 callbacks: Iterable[Any] = (), run_info: dict[str, Any] | None = None,
                 print_every: int | None = None, **options: Any) -> None:
        base = to_dict(config) if config is not None else {}
        base.update(options)
        defaults = to_dict(TrainConfig())
        #: Options the caller chose (not left at their defaults).
        self.given_options = set(options) | {k for k, v in base.items()
                                             if k in defaults and v != defaults[k]}
        self.config: TrainConfig = build_config(type(config) if config is not None
                                                else TrainConfig, base)
        c = self.config
        self.strategy = strategy or build_strategy(c.distributed.strategy, c.device)
        self.device = self.strategy.device
        self.memory = MemoryMeter(self.device, "running")
        self.callbacks = list(callbacks)
        self.print_every = print_every  # console lines (without a bar): every N steps
        self.run_info = dict(run_info or {})
        self.out = Path(c.out) if c.out else None
        self._reset()

    def _reset(self) -> None:
        """A fresh precision and loop state: each fit trains its model from step 0."""
        c = self.config
        self.precision = Precision.from_config(c.precision, device=self.device)
        self._torn_down = False
        self.logger = RunLogger(None, enabled=False)
        # Loop position: optimizer steps done, current epoch, windows done in that epoch.
        self.step = 0
        self.epoch = 0
        self.window_in_epoch = 0
        self.history: list[dict[str, Any]] = []
        self.model: nn.Module | None = None          # the user's module, set up for precision
        self.train_model: nn.Module | None = None    # what the loop calls (wrapped/compiled)
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        self.lr_plan: LrPlan | None = None
        self.task: Task = ClassificationTask()
        self.loss_fn: LossFn = self.task.loss
        self.last_eval: EvalResult | None = None
        # --micro-batch-size auto and out-of-memory recovery; the plan in use lives here.
        self.planner = MicroBatchPlanner(self.device, batch_size=c.batching.batch_size,
                                         world_size=self.strategy.world_size,
                                         memory_budget_gb=c.batching.memory_budget_gb,
                                         agree=self._all_fit)
        self.batch_plan: MicroBatchSplit | None = None
        self._oom_events_told = 0
        self._step_start: StepStart | None = None
        self._val_data: Any = None
        self._pending: StepOutcome | None = None
        self._last_window: StepBatch | None = None
        self._grad_norm: torch.Tensor | None = None
        self._loss_sum = torch.zeros((), device=self.device)
        self._loss_samples = 0
        self._samples_since_log = 0
        self._data_wait_s = 0.0  # host time spent waiting for windows since the last log
        self._last_log_time = 0.0
        self._last_log_step = 0
        self._last_saved_step: int | None = None
        self._last_eval_step: int | None = None
        self._step_epoch = 0  # epoch of the last trained step (for records)
        self.stop_requested: str | None = None  # set by a signal handler
        self._stopping: str | None = None        # the stop all ranks agreed on
        self._check_outputs: Callable[[Any, Any], None] | None = None  # first batch only
        self._resumed_finished = False
        self.constant_lr = False  # the caller's optimizer without a schedule (set up in fit)
        self._writes = checkpoint.BackgroundWriter()

    # ---------------------------------------------------------------- public
    def fit(self, model: nn.Module, train_data: Dataset | DataLoader | Iterable,
            val_data: Dataset | DataLoader | Iterable | None = None, *,
            optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
            loss_fn: LossFn | None = None, class_names: list[str] | None = None,
            task: Task | None = None) -> FitResult:
        """Train ``model`` on ``train_data``; evaluate on ``val_data`` each epoch and at the end.

        Data may be a map-style Dataset (amptrain then owns batching, shuffling, sharding
        and exact resume) or a DataLoader / iterable of batches (each batch is one
        micro-batch; ``accumulate`` of them make a step). The task (loss and metrics) is
        the ``task`` option (``auto``: regression for float targets, ``lm`` for text data,
        else classification), or a :class:`~amptrain.tasks.Task` object given here.
        """
        self.setup(model, train_data, val_data, optimizer=optimizer, scheduler=scheduler,
                   loss_fn=loss_fn, class_names=class_names, task=task)
        return self.run()

    def setup(self, model: nn.Module, train_data: Any, val_data: Any = None, *,
              optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
              loss_fn: LossFn | None = None, class_names: list[str] | None = None,
              task: Task | None = None) -> None:
        """Everything :meth:`fit` does before its first step (resume included).

        Split out so that tools (``compare``'s interleaved timing) can drive single steps
        with :meth:`train_step` on a fully prepared Trainer.
        """
        c = self.config
        names = datacheck.check_fit_arguments(model, train_data, val_data, optimizer=optimizer,
                                              loss_fn=loss_fn, class_names=class_names,
                                              task=task)
        if self.model is not None:  # a second fit: a new model, trained from step 0
            self._reset()
        # A list of samples is a dataset (streams stay streams: see amptrain.streams).
        train_data = as_dataset(train_data, "train_data")
        val_data = as_dataset(val_data, "val_data") if val_data is not None else None
        self.task = task or resolve_task(c.task, train_data, loss=c.loss, class_names=names)
        self.loss_fn = loss_fn or self.task.loss
        if loss_fn is None:  # a caller's own loss may take other targets
            for data, keyword in ((train_data, "train_data"), (val_data, "val_data")):
                if data is not None:
                    self.task.check_data(data, keyword)
        self.task.fit(train_data)
        if isinstance(train_data, Dataset) and hasattr(train_data, "__len__"):
            datacheck.check_batch_size(len(train_data), c.batching.batch_size)
        if self.out is not None:
            outdir.check_on_main(self.out, resume=bool(c.checkpointing.resume),
                                 is_main=self.strategy.is_main,
                                 broadcast=self.strategy.broadcast_object)
        warn_inapplicable(c, self.given_options, loss_scaling=self.precision.spec.loss_scaling,
                          precision=self.precision.name, own_optimizer=optimizer is not None)
        seed_everything(c.seed, c.deterministic)
        tune_backends(self.device, c.deterministic)
        self._prepare_model(model, optimizer)
        assert self.optimizer is not None  # _prepare_model built one when none was given
        self.batch_plan = MicroBatchSplit(*c.batching.split(self.strategy.world_size))
        if c.batching.auto:
            self.batch_plan = self._search_micro_batch(train_data)
        self.train_windows = self._windows(train_data, self.micro_batch_size, self.accumulate,
                                           shuffle=True)
        if len(self.train_windows) == 0:
            raise UserError("train_data gives no batch for this process: it is empty or "
                            f"smaller than the {self.strategy.world_size} processes")
        self._val_data = val_data
        total = len(self.train_windows) * c.schedule.epochs
        self.total_steps = min(total, c.schedule.max_steps) if c.schedule.max_steps else total
        self.lr_plan = plan_lr(c, len(self.train_windows), self.total_steps)
        # The caller's own optimizer keeps the learning rate it was built with unless a
        # schedule is asked for: a default cosine decay to 0 would be a surprise.
        self.constant_lr = optimizer is not None and scheduler is None \
            and "scheduler" not in self.given_options
        self.scheduler = scheduler if scheduler is not None else None if self.constant_lr \
            else build_scheduler(self.lr_plan.scheduler_config(c), self.optimizer,
                                 self.total_steps)
        if loss_fn is None:
            self._check_model_outputs(train_data)
        if self.strategy.is_main and self.out is not None:
            outdir.prepare(self.out, resume=bool(c.checkpointing.resume))
        self._resume_if_requested()
        if self.strategy.is_main and self.out is not None:
            write_yaml(self.resolved_config(), self.out / "config.yaml")
        self.logger = RunLogger(self.out, enabled=self.strategy.is_main,
                                progress=not c.logging.no_progress,
                                resumed_at=self.step if self.step > 0 else None,
                                print_every=self.print_every, loggers=c.logging.logger,
                                params=self.resolved_config() if self.out is not None else None)
        self.logger.message(self._banner())
        lr_note = self.lr_plan.describe(c)
        if lr_note:
            self.logger.message(f"amptrain: {lr_note}")

    def run(self) -> FitResult:
        """The training loop on a Trainer prepared by :meth:`setup`."""
        self._emit("on_fit_start")
        try:
            with preemption.stop_on_signals(self):
                # Inside: a second signal while the last checkpoint is written still exits.
                try:
                    self._loop()
                except BaseException as exc:
                    self._wait_for_writes(failing=exc)
                    raise
                self._wait_for_writes()
        except NonFiniteHalt as halt:
            raise self._explain_halt(halt) from None
        finally:
            self.logger.close()
            # The user's model gets its own forward back (islands, fp16 convs): it must
            # behave as before fit, also after an error. evaluate() reinstates them.
            self.precision.teardown()
            self._torn_down = True
        self._emit("on_fit_end")
        result = self._result()
        bad = result.nonfinite_metrics()
        if bad:
            log.warning("training finished with non-finite %s: the model diverged (lower %s, "
                        "set %s, or run `amptrain diagnose`)", " and ".join(bad), flag("lr"),
                        flag("clip_grad_norm"))
        return result

    def train_step(self, window: StepBatch) -> None:
        """One optimizer step on ``window`` (micro-batches on the device), without the
        loop's bookkeeping (logging, evaluation, checkpoints, step counter)."""
        self._train_step(window)

    def finish_step(self) -> None:
        """Wait for the last step and account for it (skip flag, LR schedule)."""
        self._resolve_pending()

    def evaluate(self, model: nn.Module | None = None, data: Any = None, *,
                 write_dir: str | Path | None = None, full: bool = False) -> EvalResult:
        """The loss and the task's metrics on ``data`` under the training autocast.

        With ``write_dir`` the task's eval reports go there (rank 0 only). With the
        ``eval_batches`` option only a fixed sample of that many batches is read, unless
        ``full``.
        """
        model = model if model is not None else self.model
        data = data if data is not None else self._val_data
        if model is None or data is None:
            raise UserError("evaluate() needs a model and data (or a finished fit)")
        micro, accumulate = self.config.batching.split(self.strategy.world_size)
        # No gradients to hold: one pass per per-device batch.
        sample = None if full else self.config.logging.eval_batches
        windows = self._windows(data, micro * accumulate, 1, shuffle=False,
                                sample_batches=sample)
        with self.precision.installed() if self._torn_down else contextlib.nullcontext():
            result = evaluate_pass(model, windows, precision=self.precision, task=self.task,
                                   strategy=self.strategy, logger=self.logger,
                                   loss_fn=self.loss_fn)
        if write_dir is not None and self.strategy.is_main:
            result.write(write_dir)
        return result

    def prepare(self, model: nn.Module, class_names: list[str] | None = None,
                task: Task | None = None) -> nn.Module:
        """Set a model up for this precision and device without training (for evaluation);
        ``task`` defaults to classification over ``class_names``."""
        self.task = task or ClassificationTask(class_names)
        self.loss_fn = self.task.loss
        self.model, _ = self.precision.setup(self._placed(model), None)
        self.model.eval()
        return self.model

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Load fp32 weights (a checkpoint's ``model`` entry) into the prepared model."""
        assert self.model is not None, "prepare() or setup() first"
        checkpoint.load_weights(self.model, state, self.strategy, self.precision)

    # ----------------------------------------------------------------- setup
    def _placed(self, model: nn.Module) -> nn.Module:
        """``model`` on the device (channels-last for a conv net when asked)."""
        model = model.to(self.device)
        if self.config.channels_last and is_conv_net(model):
            # Module.to takes memory_format at run time; torch's overloads leave it out.
            model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        return model

    def _prepare_model(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        model = self.strategy.prepare_model(self._placed(model), self.precision, optimizer)
        fused = self.precision.allows_fused(self.config.schedule.optimizer)
        optimizer = optimizer or build_optimizer(self.config, model, fused_allowed=fused)
        self.model, self.optimizer = self.precision.setup(model, optimizer)
        train_model = self.strategy.wrap(self.model)
        if self.config.compile:
            # A compiled module is an OptimizedModule (an nn.Module); torch.compile's
            # signature only says Callable.
            train_model = cast(nn.Module, torch.compile(train_model))
        self.train_model = train_model
        self.model.train()

    # ------------------------------------------------------------------ loop
    def _loop(self) -> None:
        c = self.config
        self.memory.start()
        self._last_log_time = time.perf_counter()
        self._last_log_step = self.step
        while self.epoch < c.schedule.epochs and not self._done():
            start = self.window_in_epoch
            # Epochs count from 0, as in metrics.jsonl and the log lines: "epoch 0 (0-2)".
            self.logger.bar(len(self.train_windows),
                            f"epoch {self.epoch} (0-{c.schedule.epochs - 1})", start)
            for window in self._timed(self.train_windows.epoch(self.epoch, start)):
                self._train_step(window)
                self._step_epoch = self.epoch
                self.step += 1
                self.window_in_epoch += 1
                self.logger.advance()
                self._after_step()
                self._agree_on_stop()
                if self._done():
                    break
            # A stream (amptrain.streams) has no length: its epoch ends when it runs out.
            if self.window_in_epoch >= len(self.train_windows) \
                    or getattr(self.train_windows, "ended", False):
                self.epoch += 1
                self.window_in_epoch = 0
                self._end_of_epoch()
        if self._stopping is not None and not self._complete():
            raise self._preempted()
        self._resolve_pending()
        if self.step != self._last_log_step:
            self._log_train()
        self.logger.close_bar()
        if self._val_data is not None:
            # A finished run that was resumed has its final record already.
            self._evaluate_and_log(final=True, record=not self._resumed_finished)
        if self.out is not None and not self._saved_at_current_step():
            self.save_checkpoint()

    def _done(self) -> bool:
        max_steps = self.config.schedule.max_steps
        return bool(max_steps and self.step >= max_steps) or self._stopping is not None

    def _complete(self) -> bool:
        max_steps = self.config.schedule.max_steps
        return self.epoch >= self.config.schedule.epochs or bool(max_steps
                                                                 and self.step >= max_steps)

    def _agree_on_stop(self) -> None:
        self._stopping = preemption.agreed_stop(self.stop_requested, self._stopping, self.step,
                                                self.config.logging.log_every, self.strategy)

    def _forward_backward(self, window: StepBatch) -> None:
        """Forward and backward of every micro-batch of ``window``; gradients accumulate."""
        assert self.train_model is not None, "set up first"
        world = self.strategy.world_size
        last = len(window.micro_batches) - 1
        losses = []
        check, self._check_outputs = self._check_outputs, None  # the run's first batch only
        for i, (batch, n) in enumerate(zip(window.micro_batches, window.micro_samples)):
            with self.strategy.accumulation_context(self.train_model, boundary=i == last):
                with self.precision.autocast():
                    loss, _, _ = forward_batch(self.train_model, batch, self.loss_fn,
                                               check if i == 0 else None)
                # The loss is a mean over this micro-batch, so its share of the step is
                # n / N (N = samples in the global batch). DDP then averages gradients over
                # ranks, which the factor `world` undoes: the sum over all ranks and
                # micro-batches is exactly the mean over the global batch. A share of
                # exactly 1 (no accumulation) is not multiplied in: that would cost a
                # kernel in the forward and one in the backward of every step, for nothing.
                share = n * world / window.global_samples
                self.precision.backward(loss if share == 1 else loss * share)
            losses.append((loss.detach(), n))
        # Counted once the whole window went through, so a redone window counts once.
        for loss, n in losses:
            self._loss_sum.add_(loss, alpha=n)
        self._loss_samples += sum(window.micro_samples)

    def _train_step(self, window: StepBatch) -> None:
        assert self.model is not None and self.optimizer is not None
        assert self.batch_plan is not None
        # On out-of-memory the planner redoes this same global batch in smaller
        # micro-batches, from the same RNG and BatchNorm state (one process only: several
        # halt instead of redoing).
        if self.strategy.world_size == 1:
            if self._step_start is None:
                self._step_start = StepStart(self.model, self.device)
            self._step_start.save()
        window, plan = self.planner.run(window, self._forward_backward, plan=self.batch_plan,
                                        step=self.step + 1, drop_gradients=self._drop_gradients,
                                        step_start=self._step_start)
        if plan != self.batch_plan:
            self._use_batch_plan(plan)
        self._last_window = window
        self._samples_since_log += window.global_samples
        # Reading the previous step's skip flag only now lets the GPU run this step's
        # forward/backward meanwhile; the LR it sets is still the one this step needs.
        self._resolve_pending()
        params = self.model.parameters()
        clip = self.config.schedule.clip_grad_norm
        if clip:
            self._grad_norm = self.precision.clip_grad_norm_(params, clip)
        elif (self.step + 1) % self.config.logging.log_every == 0:
            self._grad_norm = self.precision.grad_norm(params)
        self._pending = self.precision.step_async(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)

    def _resolve_pending(self) -> None:
        outcome, self._pending = self._pending, None
        if outcome is None:
            return
        if self.precision.confirm(outcome, step=self.step) and self.scheduler is not None:
            self.scheduler.step()

    def _after_step(self) -> None:
        c = self.config
        if self.step % c.logging.log_every == 0:
            self._resolve_pending()
            self._log_train()
        self._emit("on_step_end")
        if c.logging.eval_every and self.step % c.logging.eval_every == 0 \
                and self._val_data is not None:
            self._evaluate_and_log()
        if c.checkpointing.save_every and self.step % c.checkpointing.save_every == 0 \
                and self.out is not None:
            self._save(background=True)

    def _end_of_epoch(self) -> None:
        if self._done() or self.epoch >= self.config.schedule.epochs:
            return  # the final evaluation and checkpoint follow right away
        if not self.config.logging.eval_every and self._val_data is not None:
            self._evaluate_and_log()
        if self.out is not None and not self._saved_at_current_step():
            self._save(background=True)
