"""The Trainer assembled in one downward pass (:func:`assemble_parts`): the data and the
task, the model's parts with their optimizers (set up for the precision, wrapped for the
strategy), the train windows, the LR schedules, the step runner, resume, and the logger.
Each of these is decided here, once; the Trainer then only runs them. (The runner's
``assemble`` builds what a run trains: data, task, model; this builds what trains it.)"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.utils.data import Dataset

from . import datacheck, outdir
from ..config import TrainConfig, write_yaml
from ..errors import UserError, flag
from ..forward import LossFn
from ..inapplicable import warn_inapplicable
from ..models import is_conv_net
from ..optim import LrPlan, build_optimizer, build_scheduler
from ..reproducibility import TRAINING, seed_phase, tune_backends
from ..streams import StreamWindows, as_dataset
from ..tasks import Task, resolve_task
from .batching import search_micro_batch
from .checkpointing import resume_if_requested
from .data import output_check, windows_of
from .evaluation import Evaluator
from .optimizers import OptimizerSteps, Part
from .position import RunLength
from .reporting import Reporter
from .stepping import StepFn, StepRunner

if TYPE_CHECKING:
    from .core import Trainer


def assemble_parts(trainer: Trainer, model: nn.Module, train_data: Any, val_data: Any, *,
             optimizer: torch.optim.Optimizer | None, scheduler: Any,
             loss_fn: LossFn | None, class_names: list[str] | None, task: Task | None,
             training_step: StepFn | None) -> None:
    """The run's parts, in one pass: data, task, model parts and optimizers, windows,
    schedules, the step runner, resume, the logger (see :meth:`Trainer.setup`)."""
    c = trainer.config
    # A list of samples is a dataset (streams stay streams: see amptrain.streams).
    train_data = as_dataset(train_data, "train_data")
    val_data = as_dataset(val_data, "val_data") if val_data is not None else None
    trainer.task = task = task or resolve_task(c.task, train_data, loss=c.loss,
                                               class_names=class_names)
    if loss_fn is None:  # a caller's own loss may take other targets
        for data, keyword in ((train_data, "train_data"), (val_data, "val_data")):
            if data is not None:
                task.check_data(data, keyword)
    task.fit(train_data)
    if isinstance(train_data, Dataset) and hasattr(train_data, "__len__"):
        datacheck.check_batch_size(len(train_data), c.batching.batch_size)
    if trainer.out is not None:
        outdir.check_on_main(trainer.out, resume=bool(c.checkpointing.resume),
                             is_main=trainer.strategy.is_main,
                             broadcast=trainer.strategy.broadcast_object,
                             outputs=outdir.train_outputs(c.logging.logger))
    warn_inapplicable(c, c.given,
                      loss_scaling=trainer.precision.spec.loss_scaling,
                      precision=trainer.precision.name, own_optimizer=optimizer is not None)
    seed_phase(TRAINING, c.seed, deterministic=c.deterministic)
    tune_backends(trainer.device, c.deterministic)
    lr_plan = LrPlan.for_batch(c)  # first: the optimizers take its lr
    steps = prepare_parts(trainer, model, task, optimizer, scheduler, lr_plan)
    first = next(iter(steps.parts.values()))
    split = c.batching.split(trainer.strategy.world_size)
    loss = loss_fn or task.loss
    if c.batching.auto:
        if not steps.single:
            raise UserError(f"{flag('micro_batch_size')} auto probes one model's step; "
                            f"task {task.name} trains {len(steps.parts)}: set a number")
        split = search_micro_batch(
            train_data, planner=trainer.planner, config=c, strategy=trainer.strategy,
            model=first.module, optimizer=first.optimizer, precision=trainer.precision,
            loss_fn=loss)
    trainer.planner.use(split)  # the run's split, decided once: each step reads it
    trainer.train_windows = windows = windows_of(train_data, micro=split.micro_batch,
                                                 accumulate=split.accumulate, shuffle=True,
                                                 config=c, strategy=trainer.strategy)
    if len(windows) == 0:
        raise UserError("train_data gives no batch for this process: it is empty or "
                        f"smaller than the {trainer.strategy.world_size} processes")
    trainer.evaluator = Evaluator(c, trainer.strategy, trainer.precision, task, loss, val_data)
    # The run's length, decided here once: the loop, the LR schedule and the banner read it.
    trainer.run_length = RunLength.resolve(
        c.schedule.epochs, c.schedule.max_steps,
        None if isinstance(windows, StreamWindows) else len(windows))
    trainer.total_steps = trainer.run_length.total_steps
    trainer.lr_plan = lr_plan = lr_plan.for_run(len(windows), trainer.total_steps)
    # The caller's own optimizer keeps the learning rate it was built with unless a
    # schedule is asked for: a default cosine decay to 0 would be a surprise.
    trainer.constant_lr = optimizer is not None and scheduler is None \
        and "scheduler" not in c.given
    for part in steps.parts.values():
        part.scheduler = scheduler if scheduler is not None else None \
            if trainer.constant_lr else build_scheduler(c, part.optimizer, trainer.total_steps,
                                                        plan=lr_plan)
    assert trainer.model is not None
    # The caller's loss and the one-time output check belong to the supervised step;
    # a task's own step (or the caller's) is called as it is.
    own_step = training_step or (task.training_step
                                 if type(task).training_step is not Task.training_step
                                 else None)
    check = output_check(train_data, model=trainer.model, task=task, loss_fn=loss,
                         precision=trainer.precision, strategy=trainer.strategy,
                         model_name=trainer.run_info.get("model")) \
        if loss_fn is None and own_step is None else None
    trainer.runner = StepRunner(steps, precision=trainer.precision, strategy=trainer.strategy,
                                planner=trainer.planner, metrics=trainer.metrics,
                                model=trainer.model, device=trainer.device,
                                training_step=own_step, loss_fn=loss, check=check)
    if trainer.strategy.is_main and trainer.out is not None:
        outdir.prepare_run(trainer.out, resume=bool(c.checkpointing.resume),
                       outputs=outdir.train_outputs(c.logging.logger))
    resume_if_requested(trainer)
    if trainer.strategy.is_main and trainer.out is not None:
        write_yaml(trainer.resolved_config(), trainer.out / "config.yaml")
    trainer.reporter.open(trainer.out, enabled=trainer.strategy.is_main,
                          progress=not c.logging.no_progress,
                          resumed_at=trainer.step if trainer.step > 0 else None,
                          loggers=c.logging.logger,
                          params=trainer.resolved_config() if trainer.out is not None else None)
    trainer.reporter.announce(Reporter.banner(
        trainer.precision, device=trainer.device, world_size=trainer.strategy.world_size,
        run_length=trainer.run_length, batch_size=c.batching.batch_size,
        micro=trainer.micro_batch_size, accumulate=trainer.accumulate,
        task_words=task.describe(), constant_lr=trainer.constant_lr))
    lr_note = trainer.lr_plan.describe(c)
    if lr_note:
        trainer.logger.message(f"amptrain: {lr_note}")


def prepare_parts(trainer: Trainer, model: nn.Module, task: Task,
                  optimizer: torch.optim.Optimizer | None, scheduler: Any,
                  lr_plan: LrPlan) -> OptimizerSteps:
    """The task's parts of ``model``, each with its optimizer (at ``lr_plan``'s lr), set
    up for the precision and wrapped for the strategy (and compiled when asked)."""
    c = trainer.config
    model = trainer.strategy.prepare_model(placed(model, trainer.device, c), trainer.precision,
                                           optimizer)
    modules = task.models(model)
    if (optimizer is not None or scheduler is not None) and len(modules) != 1:
        given = "optimizer" if optimizer is not None else "scheduler"
        raise UserError(f"{given} is one {given}; task {task.name} trains "
                        f"{len(modules)} parts ({', '.join(modules)}) and builds one each")
    if optimizer is not None:
        optimizers = {name: optimizer for name in modules}
    else:
        fused = trainer.precision.allows_fused(c.schedule.optimizer)
        optimizers = task.build_optimizers(
            modules, lambda part: build_optimizer(c, part, fused_allowed=fused, plan=lr_plan))
        check_optimizers(task, modules, optimizers)
    trainer.steps = steps = OptimizerSteps(trainer.precision, trainer.position,
                                           clip=c.schedule.clip_grad_norm,
                                           log_every=c.logging.log_every)
    for name, module in modules.items():
        module, set_up = trainer.precision.setup(module, optimizers[name])
        assert set_up is not None
        forward = trainer.strategy.wrap(module)
        if c.compile:
            # A compiled module is an OptimizedModule (an nn.Module); torch.compile's
            # signature only says Callable.
            forward = cast(nn.Module, torch.compile(forward))
        steps.add(Part(name, module, forward, set_up))
    trainer.model = model
    model.train()
    return steps


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
