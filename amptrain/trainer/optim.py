"""Optimizer and learning-rate schedule construction from a :class:`TrainConfig`, and the
learning rate for the batch size actually trained (:func:`plan_lr`).

Learning-rate scaling (Goyal et al. 2017, "Accurate, Large Minibatch SGD"): a rate tuned
at ``--base-batch-size`` B0 carries over to a global batch B by scaling it with the batch,

* ``--lr-scaling linear``: lr = lr0 * B / B0  (Goyal et al.; SGD)
* ``--lr-scaling sqrt``:   lr = lr0 * sqrt(B / B0)  (Krizhevsky 2014; often better for Adam)
* ``--lr-scaling none``:   lr = lr0

and a scaled-up rate needs a gradual warm-up, or the first steps diverge. Goyal et al.
warm up for 5 epochs of a 90-epoch run; most runs here are much shorter, so the automatic
warm-up is capped at a tenth of the run:

    auto warm-up = min(5 epochs, ceil(10% of the run's steps))      when the lr is scaled UP

and the warm-up used is ``max(--warmup-steps, auto warm-up)`` (never longer than the run),
so a longer ``--warmup-steps`` always wins and scaling down adds no warm-up. The warm-up
itself is :func:`amptrain.trainer.optim.build_scheduler`'s linear ramp: step ``s`` (0-based) runs at
``lr * (s + 1) / warmup``, then the chosen schedule (none, cosine, onecycle) takes over.
"""
from __future__ import annotations

import inspect
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, OneCycleLR

from ..config import OPTIMIZERS, SCHEDULERS, TrainConfig
from ..common.errors import UserError, flag
from ..common.quiet import quiet_torchao
from ..config import named


def scaled_lr(config: TrainConfig) -> float:
    """--lr after --lr-scaling: k x batch -> k x lr (linear) or sqrt(k) x lr (sqrt)."""
    lr = config.schedule.resolved_lr()
    if config.schedule.lr_scaling == "none" or not config.schedule.base_batch_size:
        return lr
    ratio = config.batching.batch_size / config.schedule.base_batch_size
    return lr * (ratio if config.schedule.lr_scaling == "linear" else math.sqrt(ratio))


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices and filters; leave biases and norm scales (1-d tensors) undecayed."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.ndim <= 1 else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return [g for g in groups if g["params"]]


def _fused_ok(model: nn.Module) -> bool:
    # Fused kernels take the loss scaler's found_inf/grad_scale, which is what lets a
    # step skip on overflow without reading the flag on the host.
    devices = {p.device.type for p in model.parameters()}
    return bool(devices) and devices <= {"cuda", "cpu"} and len(devices) == 1


def build_optimizer(config: TrainConfig, model: nn.Module, *, fused_allowed: bool = True,
                    plan: LrSchedule | None = None) -> torch.optim.Optimizer:
    """AdamW or SGD (momentum, Nesterov off), fused where the device supports it and the
    precision allows it (``fused_allowed``: see :meth:`Precision.allows_fused`), at the
    run's learning rate (``plan``'s: the Trainer builds its plan first; without one, the
    plan of ``config``)."""
    lr = (plan or LrSchedule.for_batch(config)).lr
    if config.schedule.optimizer not in OPTIMIZERS:
        return torch_optimizer(config, model, lr)
    groups = parameter_groups(model, config.schedule.weight_decay)
    fused = fused_allowed and _fused_ok(model)
    if config.schedule.optimizer == "sgd" \
            and any(hasattr(p, "to_local") for p in model.parameters()):
        fused = False  # FSDP2's DTensor parameters: torch 2.13 has no fused-SGD rule for them
    if config.schedule.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=lr, fused=fused or None)
    if config.schedule.optimizer == "adamw8bit":
        return adamw8bit_class(model)(groups, lr=lr)
    return torch.optim.SGD(groups, lr=lr, momentum=config.schedule.momentum, fused=fused or None)


def torch_optimizer(config: TrainConfig, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """A torch.optim class named by ``--optimizer`` with ``--optimizer-args``, at ``lr``;
    its own defaults otherwise (``--weight-decay`` and ``--momentum`` apply only when
    given and taken: amptrain's defaults for adamw/sgd would change a known recipe)."""
    s = config.schedule
    cls = named.lookup(s.optimizer, named.optimizer_classes(), "optimizer", OPTIMIZERS)
    kwargs = named.parse_args(s.optimizer_args, "optimizer_args")
    takes = inspect.signature(cls).parameters
    if "momentum" in config.given and "momentum" in takes:
        kwargs.setdefault("momentum", s.momentum)
    params: Any = [p for p in model.parameters() if p.requires_grad]
    if "weight_decay" in config.given and "weight_decay" in takes:
        params = parameter_groups(model, s.weight_decay)
    return named.build(cls, params, {"lr": lr, **kwargs}, "optimizer_args")


def adamw8bit_class(model: nn.Module) -> Callable[..., torch.optim.Optimizer]:
    """torchao's ``AdamW8bit`` (Dettmers et al. 2021: both moments block-wise quantised to
    8 bits, blocks of 256 with an fp32 scale each; tensors under 4096 values stay unquantised),
    or a UserError naming ``--optimizer`` when it cannot run here.

    Chosen over bitsandbytes because it runs on the CPU and on CUDA from one implementation
    (its step is ``torch.compile``d per parameter shape: a one-off compile of seconds per
    shape, cached on disk), its state is an ordinary checkpointable tensor subclass, and
    torchao is already amptrain's fp8 dependency. bitsandbytes 0.50's CPU backend works but
    stepped ~10x slower on the CPU here (docs/memory-ladder.md).
    """
    devices = {p.device.type for p in model.parameters()}
    try:
        with quiet_torchao():
            from torchao.optim import AdamW8bit
    except ImportError:
        raise UserError(f"{flag('optimizer')} adamw8bit needs torchao (pip install "
                        f"'amptrain[lowbit]'); or use {flag('optimizer')} adamw") from None
    if any(type(p).__name__ == "DTensor" or type(p.data).__name__ == "DTensor"
           for p in model.parameters()):
        # Untested: torchao's quantised state on FSDP2's sharded parameters, and its
        # checkpoint through the full-state gather.
        raise UserError(f"{flag('optimizer')} adamw8bit is not supported with "
                        f"{flag('strategy')} fsdp; use ddp, or {flag('optimizer')} adamw")
    if not devices <= {"cpu", "cuda"}:
        raise UserError(f"{flag('optimizer')} adamw8bit runs on cpu and cuda only (this model "
                        f"is on {', '.join(sorted(devices))}); use {flag('optimizer')} adamw")
    if "cpu" in devices and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        raise UserError(f"{flag('optimizer')} adamw8bit compiles its step with torch.compile, "
                        f"which on the CPU needs a C++ compiler (g++ or clang++): install one, "
                        f"or use {flag('optimizer')} adamw")
    return AdamW8bit


def build_scheduler(config: TrainConfig, optimizer: torch.optim.Optimizer,
                    total_steps: int, *, plan: LrSchedule | None = None) -> LRScheduler:
    """The per-optimizer-step schedule: linear warm-up (``plan``'s, else
    ``--warmup-steps``), then none/cosine/onecycle/linear.

    The Trainer advances it only after steps that really updated the weights.
    """
    if config.schedule.scheduler not in SCHEDULERS:
        cls = named.lookup(config.schedule.scheduler, named.scheduler_classes(), "scheduler",
                           SCHEDULERS)
        return named.build(cls, optimizer,
                           named.parse_args(config.schedule.scheduler_args, "scheduler_args"),
                           "scheduler_args")
    total_steps = max(1, total_steps)
    warmup = min(plan.warmup_steps if plan is not None else config.schedule.warmup_steps,
                 total_steps)
    if config.schedule.scheduler == "onecycle":
        pct = warmup / total_steps if warmup else 0.3
        return OneCycleLR(optimizer, max_lr=[g["lr"] for g in optimizer.param_groups],
                          total_steps=total_steps, pct_start=min(max(pct, 1e-3), 0.999))
    shape = config.schedule.scheduler

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if shape not in ("cosine", "linear"):
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if shape == "linear":  # to 0 at the end of the run (PPO's annealing)
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)


#: Goyal et al.'s warm-up length, in epochs.
GOYAL_WARMUP_EPOCHS = 5
#: Cap on the automatic warm-up, as a share of the run's optimizer steps.
AUTO_WARMUP_FRACTION = 0.1


@dataclass(frozen=True)
class LrSchedule:
    """The learning rate and warm-up a run really uses, and where they came from.

    The one owner of a run's learning rate, built first: :meth:`for_batch` (from the
    config alone) gives the optimizers their lr; :meth:`for_run`, once the run's length
    is known, decides the warm-up the schedulers take. Nothing else applies the formula.
    """

    base_lr: float          # --lr (or the optimizer's default), as tuned at --base-batch-size
    lr: float               # after --lr-scaling
    factor: float           # lr / base_lr
    warmup_steps: int       # the warm-up the scheduler uses
    warmup_given: int       # --warmup-steps
    warmup_auto: int        # the automatic warm-up for a scaled-up lr (0 when not scaling up)

    @classmethod
    def for_batch(cls, config: TrainConfig) -> LrSchedule:
        """The lr for ``config``'s batch size (:func:`scaled_lr`), before the run's length
        is known: the warm-up is ``--warmup-steps`` until :meth:`for_run` decides it."""
        base = config.schedule.resolved_lr()
        lr = scaled_lr(config)
        given = config.schedule.warmup_steps
        return cls(base_lr=base, lr=lr, factor=lr / base, warmup_steps=given,
                   warmup_given=given, warmup_auto=0)

    def for_run(self, steps_per_epoch: int, total_steps: int) -> LrSchedule:
        """This plan with the warm-up for a run of ``total_steps`` steps (see the module
        docstring: an automatic warm-up when the lr is scaled up)."""
        auto = auto_warmup_steps(steps_per_epoch, total_steps) if self.factor > 1.0 else 0
        warmup = min(max(self.warmup_given, auto), max(1, total_steps))
        return replace(self, warmup_steps=warmup, warmup_auto=auto)

    def describe(self, config: TrainConfig) -> str | None:
        """One line for the log when --lr-scaling changed the lr (and maybe the warm-up)."""
        if config.schedule.lr_scaling == "none":
            return None
        ratio = f"{config.batching.batch_size}/{config.schedule.base_batch_size}"
        how = ratio if config.schedule.lr_scaling == "linear" else f"sqrt({ratio})"
        source = (f"automatic for a scaled-up lr: min({GOYAL_WARMUP_EPOCHS} epochs, "
                  f"{AUTO_WARMUP_FRACTION:.0%} of the run)"
                  if self.warmup_steps > self.warmup_given else flag("warmup_steps"))
        return (f"lr scaling {config.schedule.lr_scaling}: lr {self.base_lr:g} x {how} "
                f"= {self.lr:g} "
                f"({flag('batch_size')} {config.batching.batch_size}, "
                f"{flag('base_batch_size')} {config.schedule.base_batch_size}); "
                f"warm-up {self.warmup_steps} steps ({source})")

    def report(self) -> dict[str, Any]:
        """What config.yaml records besides ``lr`` and ``warmup_steps``."""
        return {"base_lr": self.base_lr, "lr_factor": self.factor,
                "warmup_steps_given": self.warmup_given, "warmup_steps_auto": self.warmup_auto}


def auto_warmup_steps(steps_per_epoch: int, total_steps: int) -> int:
    """Goyal et al.'s 5 epochs, capped at 10% of the run (at least one step)."""
    return max(1, min(GOYAL_WARMUP_EPOCHS * steps_per_epoch,
                      math.ceil(AUTO_WARMUP_FRACTION * total_steps)))


def plan_lr(config: TrainConfig, steps_per_epoch: int, total_steps: int) -> LrSchedule:
    """The learning rate and warm-up for ``config``'s batch size (see the module docstring)."""
    return LrSchedule.for_batch(config).for_run(steps_per_epoch, total_steps)
