"""The strategy protocol, and where this process sits in a torchrun job.

:class:`Strategy` is what the Trainer talks to, and also the single-device strategy
that the distributed ones extend. The helpers below read torchrun's environment
(``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``), pick this
rank's device and join the process group.
"""
from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..precision.hardware.devices import resolve_device
from ..common.errors import UserError
from ..checkpoint.state import plain_optimizer_state
from ..checkpoint import load_optimizer_state


class Strategy:
    """One process on one device (the default)."""

    world_size = 1
    rank = 0

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @property
    def is_main(self) -> bool:
        """True on the rank that writes logs, reports and checkpoints."""
        return self.rank == 0

    def wrap_model(self, model: nn.Module, precision: Any,
                      optimizer: torch.optim.Optimizer | None = None) -> nn.Module:
        """Called on the model (already on its device) before the optimizer is built.

        Distributed strategies make ``precision`` agree on skipped steps across ranks
        here; FSDP shards the parameters (so the optimizer must see the sharded ones).
        ``optimizer`` is the user's own optimizer, if one was passed.
        """
        return model

    def wrap(self, model: nn.Module) -> nn.Module:
        """The module the training loop calls (e.g. a DDP wrapper around ``model``)."""
        return model

    def accumulation_context(self, model: nn.Module,
                             boundary: bool) -> contextlib.AbstractContextManager:
        """Context for one micro-batch's forward/backward; off-boundary ones skip grad sync."""
        return contextlib.nullcontext()

    def shard_loader(self, loader: Any, seed: int = 0, *, evaluation: bool = False) -> Any:
        """A user DataLoader that gives this rank its own share of the data.

        For ``evaluation`` the shares are exact where the strategy allows it: every
        sample counted once, none repeated to even out the ranks.
        """
        return loader

    @property
    def sharded_checkpoints(self) -> bool:
        """The run's checkpoints during training are sharded: every rank writes its own
        shards (:mod:`amptrain.checkpoint.sharded`) instead of gathering the state on rank 0.
        The end of a run still writes one full checkpoint."""
        return False

    def model_state_dict(self, model: nn.Module, precision: Any) -> dict[str, torch.Tensor]:
        """Full fp32 weights of the (unwrapped) model, loadable on one device.

        Collective for sharded strategies: call on every rank.
        """
        return precision.fp32_state_dict(model)

    def load_model_state_dict(self, model: nn.Module, precision: Any,
                              state: dict[str, torch.Tensor]) -> None:
        """Load full fp32 weights (a checkpoint's ``model``) into the prepared model."""
        precision.load_fp32_state_dict(model, state)

    def optimizer_state_dict(self, model: nn.Module,
                             optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's state for a checkpoint (collective for sharded strategies)."""

        return plain_optimizer_state(optimizer.state_dict())

    def load_optimizer_state_dict(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                                  state: dict[str, Any]) -> None:
        """Restore :meth:`optimizer_state_dict` (also across precisions, see checkpoint)."""

        load_optimizer_state(optimizer, state)

    def reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        """Sum of a tensor over ranks (identity for one process)."""
        return value

    def gather(self, value: torch.Tensor) -> torch.Tensor:
        """Concatenate a 1-d tensor from all ranks along dim 0 (identity for one process)."""
        return value

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's value on every rank."""
        return value

    def gather_objects(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order, on every rank (picklable values; a
        collective: every rank must call it)."""
        return [value]

    def barrier(self) -> None:
        """Wait for all ranks."""

    def teardown(self) -> None:
        """Release the process group, if this strategy made one."""


# ------------------------------------------------------------------ torchrun
@dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits in a torchrun job (from the environment torchrun sets)."""

    world_size: int
    rank: int
    local_rank: int
    restart_count: int = 0

    @classmethod
    def from_environ(cls) -> LaunchEnv | None:
        """The torchrun environment, or None when this process was not started by one."""
        if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
            return None
        try:
            return cls(world_size=int(os.environ["WORLD_SIZE"]), rank=int(os.environ["RANK"]),
                       local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                       restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
        except ValueError:
            raise UserError("WORLD_SIZE/RANK/LOCAL_RANK in the environment are not integers; "
                            "start distributed runs with torchrun or --nproc-per-node") from None


def is_main_process() -> bool:
    """True unless this is a non-zero rank of a torchrun job (usable before any setup)."""
    env = LaunchEnv.from_environ()
    return env is None or env.rank == 0


def process_device(name: str, local_rank: int) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` (or CPU for ``--device cpu`` / no GPU)."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    device = resolve_device("cuda" if name == "auto" else name)
    if device.type != "cuda":
        return device
    if device.index is not None:
        raise UserError(f"--device {name} would put every process on one GPU; under torchrun "
                        f"use --device cuda (each process takes cuda:LOCAL_RANK)")
    if local_rank >= torch.cuda.device_count():
        raise UserError(f"local rank {local_rank} has no GPU: only {torch.cuda.device_count()} "
                        f"visible; lower --nproc-per-node")
    return torch.device("cuda", local_rank)


def init_process_group(device: torch.device) -> bool:
    """Join torchrun's process group (nccl on CUDA, gloo on CPU); True if we created it."""
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    # Whatever path the process leaves by (an error, a library caller that never tears
    # down), the group must be gone while the interpreter still runs: see release_group().
    atexit.register(release_group)
    return True


def release_group() -> None:
    """Destroy the default process group so that its C++ backend really goes, now.

    ``destroy_process_group`` only drops torch's own reference: a DDP/FSDP wrapper that is
    still alive (the Trainer sits in reference cycles, freed whenever the garbage collector
    runs, often only while the interpreter shuts down) keeps the gloo group and its worker
    threads running. A worker thread that then releases its last work's tensors after
    Python has begun finalising must take the GIL, which ends the thread with a forced
    unwind through a noexcept C++ frame: ``terminate called without an active exception``
    and an abort, at random (pytorch#190489). Collecting first frees those wrappers while
    the interpreter is alive, so the group's threads are joined here.
    """
    import torch.distributed as dist

    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()  # a wrapper made unreachable only by the destroy above


class _MainRankOnly(logging.Filter):
    """Other ranks only say what went wrong: notices would repeat once per process."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING
