"""The Trainer's parts assembled in one downward pass (:func:`assemble_parts`): the data
and the task, the model's parts with their optimizers (set up for the precision, wrapped
for the strategy), the train windows, the LR schedules, the step runner and the
checkpointer with every part that has state registered. Each of these is decided here,
once, and returned as one :class:`~amptrain.trainer.parts.RunParts`; the Trainer keeps it
and only runs it. (The runner's ``assemble`` builds what a run trains: data, task, model;
this builds what trains it.)"""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.utils.data import Dataset

from . import datacheck
from ..common import outdir
from ..loggers import train_outputs
from .. import checkpoint
from .autobatch import MicroBatchSizer
from ..config import TrainConfig, write_yaml
from ..distributed import Strategy
from ..common.errors import UserError, flag
from ..common.forward import LossFn
from .inapplicable import warn_inapplicable
from ..models import is_conv_net
from .optim import LrSchedule, build_optimizer, build_scheduler
from ..precision import Precision
from ..common.reproducibility import TRAINING, seed_phase, tune_backends
from .streams import StreamWindows, as_dataset
from ..tasks import Task, resolve_task
from .batching import search_micro_batch
from .checkpointing import Checkpointer
from .data import output_check, windows_of
from .evaluation import Evaluator
from .metrics import LogInterval
from .optimizers import OptimizerSteps, Part
from .parts import RunParts, TaskState
from .position import LoopPosition, RunLength
from .reporting import Reporter
from .schedule import SchedulePlan
from .stepping import StepFn, TrainStep

log = logging.getLogger("amptrain")


def assemble_parts(model: nn.Module, train_data: Any, val_data: Any, *, config: TrainConfig,
                   strategy: Strategy, precision: Precision, sizer: MicroBatchSizer,
                   position: LoopPosition, interval: LogInterval, out: Path | None,
                   run_info: dict[str, Any],
                   resolved: Callable[[], dict[str, Any]],
                   optimizer: torch.optim.Optimizer | None, scheduler: Any,
                   loss_fn: LossFn | None, class_names: list[str] | None, task: Task | None,
                   training_step: StepFn | None) -> RunParts:
    """The run's parts, in one pass: data, task, model parts and optimizers, windows,
    schedules, the step runner, the checkpointer (see :meth:`Trainer.setup`). ``position``
    and ``interval`` are the Trainer's own, registered with the checkpointer here;
    ``resolved()`` gives the config as run (each checkpoint holds it)."""
    c = config
    device = strategy.device
    # A list of samples is a dataset (streams stay streams: see amptrain.trainer.streams).
    train_data = as_dataset(train_data, "train_data")
    val_data = as_dataset(val_data, "val_data") if val_data is not None else None
    task = task or resolve_task(c.task, train_data, loss=c.loss, class_names=class_names)
    if loss_fn is None:  # a caller's own loss may take other targets
        for data, keyword in ((train_data, "train_data"), (val_data, "val_data")):
            if data is not None:
                task.checks.check_data(data, keyword)
    task.learn_from(train_data)
    if isinstance(train_data, Dataset) and hasattr(train_data, "__len__"):
        datacheck.check_batch_size(len(train_data), c.batching.batch_size)
    if out is not None:
        outdir.check_on_main(out, resume=bool(c.checkpointing.resume),
                             is_main=strategy.is_main, broadcast=strategy.broadcast_object,
                             outputs=train_outputs(c.logging.logger))
    warn_inapplicable(c, c.given, loss_scaling=precision.spec.loss_scaling,
                      precision=precision.name, own_optimizer=optimizer is not None)
    seed_phase(TRAINING, c.seed, deterministic=c.deterministic)
    tune_backends(device, c.deterministic)
    lr_schedule = LrSchedule.for_batch(c)  # first: the optimizers take its lr
    model, steps = build_parts(model, task, optimizer, scheduler, config=c,
                                 strategy=strategy, precision=precision, position=position,
                                 lr_schedule=lr_schedule)
    first = next(iter(steps.parts.values()))
    split = c.batching.split(strategy.world_size)
    loss = loss_fn or task.loss
    if c.batching.auto:
        if not steps.single:
            raise UserError(f"{flag('micro_batch_size')} auto probes one model's step; "
                            f"task {task.name} trains {len(steps.parts)}: set a number")
        split = search_micro_batch(
            train_data, sizer=sizer, config=c, strategy=strategy,
            model=first.module, optimizer=first.optimizer, precision=precision,
            loss_fn=loss)
    sizer.use(split)  # the run's split, decided once: each step reads it
    windows = windows_of(train_data, micro=split.micro_batch, accumulate=split.accumulate,
                         shuffle=True, config=c, strategy=strategy)
    if len(windows) == 0:
        raise UserError("train_data gives no batch for this process: it is empty or "
                        f"smaller than the {strategy.world_size} processes")
    evaluator = Evaluator(c, strategy, precision, task, loss, val_data)
    # The run's length, decided here once: the loop, the LR schedule and the banner read it.
    run_length = RunLength.resolve(
        c.schedule.epochs, c.schedule.max_steps,
        None if isinstance(windows, StreamWindows) else len(windows))
    lr_schedule = lr_schedule.for_run(len(windows), run_length.total_steps)
    # The caller's own optimizer keeps the learning rate it was built with unless a
    # schedule is asked for: a default cosine decay to 0 would be a surprise.
    constant_lr = optimizer is not None and scheduler is None and "scheduler" not in c.given
    own = SchedulePlan.of_caller(scheduler) if scheduler is not None else None
    plans = {name: own if own is not None else None if constant_lr else SchedulePlan.of_config(
        build_scheduler(c, part.optimizer, run_length.total_steps, plan=lr_schedule),
        c.schedule.scheduler, c.schedule.scheduler_interval)
        for name, part in steps.parts.items()}
    for name, part in steps.parts.items():
        part.schedule(plans[name])
    said = next((p for p in plans.values() if p is not None), None)
    # The caller's loss and the one-time output check belong to the supervised step;
    # a task's own step (or the caller's) is called as it is.
    own_step = training_step or (task.training_step
                                 if type(task).training_step is not Task.training_step
                                 else None)
    check = output_check(train_data, model=model, task=task, loss_fn=loss,
                         precision=precision, strategy=strategy,
                         model_name=run_info.get("model")) \
        if loss_fn is None and own_step is None else None
    train_step = TrainStep(steps, precision=precision, strategy=strategy, sizer=sizer,
                         interval=interval, model=model, device=device,
                         training_step=own_step, loss_fn=loss, check=check)
    checkpointer = Checkpointer(out, c, strategy, model=model, precision=precision,
                                steps=steps, position=position, windows=windows,
                                resolved=resolved, run_info=run_info)
    # Every part with state, the precision last: the optimizer steps settle the lagged
    # step, whose skip the precision counts, before its state is taken.
    for stateful in (steps, checkpoint.RngState(), position, interval, TaskState(task),
                     precision):
        checkpointer.register(stateful)
    return RunParts(model=model, task=task, evaluator=evaluator, steps=steps,
                    train_step=train_step, windows=windows, lr_schedule=lr_schedule,
                    run_length=run_length,
                    checkpointer=checkpointer, constant_lr=constant_lr,
                    schedule_words=said.describe() if said is not None else "")


def begin_run(parts: RunParts, *, config: TrainConfig, strategy: Strategy, out: Path | None,
             precision: Precision, reporter: Reporter, position: LoopPosition,
             sizer: MicroBatchSizer, resolved: Callable[[], dict[str, Any]],
             run_info: dict[str, Any]) -> bool:
    """The end of set-up: the run directory prepared, ``--resume`` loaded into the parts,
    the config as run (``resolved()``) written, the logger opened with the banner. Returns
    whether the resumed run had already finished."""
    c = config
    finished = False
    if strategy.is_main and out is not None:
        outdir.claim_run(out, resume=bool(c.checkpointing.resume),
                           outputs=train_outputs(c.logging.logger))
    if c.checkpointing.resume:
        if parts.checkpointer.resume(resolved(), run_info, len(parts.windows)):
            finished = parts.run_length.reached(position)
            if finished:
                log.info("the run already finished at step %d: nothing left to train (raise "
                         "%s or %s to train on)", position.step, flag("epochs"),
                         flag("max_steps"))
        parts.checkpointer.trim_metrics(position.step)
    as_run = resolved()
    if strategy.is_main and out is not None:
        write_yaml(as_run, out / "config.yaml")
    reporter.open(out, enabled=strategy.is_main, progress=not c.logging.no_progress,
                  resumed_at=position.step if position.step > 0 else None,
                  loggers=c.logging.logger, params=as_run if out is not None else None,
                  task=parts.task)
    reporter.announce(Reporter.banner(
        precision, device=strategy.device, world_size=strategy.world_size,
        run_length=parts.run_length, batch_size=c.batching.batch_size,
        micro=sizer.split.micro_batch, accumulate=sizer.split.accumulate,
        task_words=parts.task.wording.describe(parts.task.name), constant_lr=parts.constant_lr)
        + parts.schedule_words)
    lr_note = parts.lr_schedule.describe(c)
    if lr_note:
        reporter.logger.message(f"amptrain: {lr_note}")
    return finished


def build_parts(model: nn.Module, task: Task, optimizer: torch.optim.Optimizer | None,
                  scheduler: Any, *, config: TrainConfig, strategy: Strategy,
                  precision: Precision, position: LoopPosition, lr_schedule: LrSchedule
                  ) -> tuple[nn.Module, OptimizerSteps]:
    """The model on the device and the task's parts of it, each with its optimizer (at
    ``lr_schedule``'s lr), set up for the precision and wrapped for the strategy (and compiled
    when asked)."""
    c = config
    model = strategy.wrap_model(placed(model, strategy.device, c), precision, optimizer)
    modules = task.models(model)
    if (optimizer is not None or scheduler is not None) and len(modules) != 1:
        given = "optimizer" if optimizer is not None else "scheduler"
        raise UserError(f"{given} is one {given}; task {task.name} trains "
                        f"{len(modules)} parts ({', '.join(modules)}) and builds one each")
    if optimizer is not None:
        optimizers = {name: optimizer for name in modules}
    else:
        fused = precision.allows_fused(c.schedule.optimizer)
        optimizers = task.build_optimizers(
            modules, lambda part: build_optimizer(c, part, fused_allowed=fused, plan=lr_schedule))
        check_optimizers(task, modules, optimizers)
    steps = OptimizerSteps(precision, position, strategy, clip=c.schedule.clip_grad_norm,
                           log_every=c.logging.log_every)
    for name, module in modules.items():
        module, set_up = precision.setup(module, optimizers[name])
        assert set_up is not None
        forward = strategy.wrap(module)
        if c.compile:
            # A compiled module is an OptimizedModule (an nn.Module); torch.compile's
            # signature only says Callable.
            forward = cast(nn.Module, torch.compile(forward))
        steps.add(Part(name, module, forward, set_up))
    model.train()
    return model, steps


def check_optimizers(task: Task, modules: dict[str, nn.Module],
                     optimizers: dict[str, torch.optim.Optimizer]) -> None:
    """A task's optimizers: one per part, each over that part's parameters only."""
    if set(optimizers) != set(modules):
        raise UserError(f"task {task.name}'s build_optimizers() returned optimizers for "
                        f"{', '.join(optimizers) or 'nothing'}; its parts are "
                        f"{', '.join(modules)}")
    for name, optimizer in optimizers.items():
        own = {id(p) for p in modules[name].parameters()}
        if any(id(p) not in own for group in optimizer.param_groups for p in group["params"]):
            raise UserError(f"task {task.name}: the optimizer of part '{name}' updates "
                            f"parameters that are not that part's")


def placed(model: nn.Module, device: torch.device, config: TrainConfig) -> nn.Module:
    """``model`` on the device (channels-last for a conv net when asked)."""
    model = model.to(device)
    if config.channels_last and is_conv_net(model):
        # Module.to takes memory_format at run time; torch's overloads leave it out.
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    return model
