"""Optimizer and learning-rate schedule construction from a :class:`TrainConfig`."""
from __future__ import annotations

import math
import shutil
from collections.abc import Callable

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, OneCycleLR

from .config import TrainConfig
from .errors import UserError, flag
from .quiet import quiet_torchao


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


def build_optimizer(config: TrainConfig, model: nn.Module, *, fused_allowed: bool = True
                    ) -> torch.optim.Optimizer:
    """AdamW or SGD (momentum, Nesterov off), fused where the device supports it and the
    precision allows it (``fused_allowed``: see :meth:`Precision.allows_fused`)."""
    lr = scaled_lr(config)
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


def adamw8bit_class(model: nn.Module) -> Callable[..., torch.optim.Optimizer]:
    """torchao's ``AdamW8bit`` (Dettmers et al. 2021: both moments block-wise quantised to
    8 bits, blocks of 256 with an fp32 scale each; tensors under 4096 values stay unquantised),
    or a UserError naming ``--optimizer`` when it cannot run here.

    Chosen over bitsandbytes because it runs on the CPU and on CUDA from one implementation
    (its step is ``torch.compile``d per parameter shape: a one-off compile of seconds per
    shape, cached on disk), its state is an ordinary checkpointable tensor subclass, and
    torchao is already amptrain's fp8 dependency. bitsandbytes 0.50's CPU backend works but
    stepped ~10x slower on the CPU here (README: The memory ladder).
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
                    total_steps: int) -> LRScheduler:
    """The per-optimizer-step schedule: linear warm-up, then none/cosine/onecycle.

    The Trainer advances it only after steps that really updated the weights.
    """
    total_steps = max(1, total_steps)
    warmup = min(config.schedule.warmup_steps, total_steps)
    if config.schedule.scheduler == "onecycle":
        pct = warmup / total_steps if warmup else 0.3
        return OneCycleLR(optimizer, max_lr=[g["lr"] for g in optimizer.param_groups],
                          total_steps=total_steps, pct_start=min(max(pct, 1e-3), 0.999))
    decay = config.schedule.scheduler == "cosine"

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if not decay:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)
