"""Process-group strategies: how a model is wrapped, and how ranks agree.

The Trainer only talks to the :class:`Strategy` protocol; the single-device strategy
is the trivial implementation that the distributed ones extend:

* :class:`DDPStrategy` -- DistributedDataParallel, one process per device (torchrun).
* :class:`FSDPStrategy` -- FSDP2 (``fully_shard``), parameters sharded across ranks.
* :class:`DataParallelStrategy` -- ``nn.DataParallel``, one process driving all GPUs.

:func:`build_strategy` picks one from ``--strategy`` and torchrun's environment
(``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``).
"""
from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from typing import Any, ContextManager, Iterator

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Sampler

from .devices import resolve_device
from .errors import UserError

log = logging.getLogger("amptrain")


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

    def prepare_model(self, model: nn.Module, precision: Any,
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

    def accumulation_context(self, model: nn.Module, boundary: bool) -> ContextManager:
        """Context for one micro-batch's forward/backward; off-boundary ones skip grad sync."""
        return contextlib.nullcontext()

    def shard_loader(self, loader: Any, seed: int = 0, *, evaluation: bool = False) -> Any:
        """A user DataLoader that gives this rank its own share of the data.

        For ``evaluation`` the shares are exact where the strategy allows it: every
        sample counted once, none repeated to even out the ranks.
        """
        return loader

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
        return optimizer.state_dict()

    def load_optimizer_state_dict(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                                  state: dict[str, Any]) -> None:
        """Restore :meth:`optimizer_state_dict` (also across precisions, see checkpoint)."""
        from .checkpoint import load_optimizer_state

        load_optimizer_state(optimizer, state)

    def reduce_mean(self, value: torch.Tensor) -> torch.Tensor:
        """Mean of a tensor over ranks (identity for one process)."""
        return value

    def reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        """Sum of a tensor over ranks (identity for one process)."""
        return value

    def gather(self, value: torch.Tensor) -> torch.Tensor:
        """Concatenate a 1-d tensor from all ranks along dim 0 (identity for one process)."""
        return value

    def broadcast_object(self, value: Any) -> Any:
        """Rank 0's value on every rank."""
        return value

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
    def from_environ(cls) -> "LaunchEnv | None":
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


def build_strategy(name: str = "auto", device: str = "auto") -> Strategy:
    """The strategy for ``--strategy name`` (and ``--device``) in this process.

    ``auto`` is DDP when torchrun started more than one process, else a single device.
    ``ddp``/``fsdp`` initialise the process group from torchrun's environment.
    """
    env = LaunchEnv.from_environ()
    multi = env is not None and env.world_size > 1
    if name == "dp":
        if multi:
            raise UserError("--strategy dp drives all GPUs from one process; do not start it "
                            "with torchrun or --nproc-per-node (or use --strategy ddp)")
        return DataParallelStrategy(resolve_device(device))
    if name == "auto":
        name = "ddp" if multi else "single"
    if name == "single":
        return Strategy(resolve_device(device))
    if name not in ("ddp", "fsdp"):
        raise UserError(f"--strategy must be one of auto, ddp, fsdp, dp (got {name!r})")
    if env is None:
        raise UserError(f"--strategy {name} runs one process per device: add --nproc-per-node N "
                        f"(or start with `torchrun --nproc-per-node N -m amptrain train ...`)")
    torch_device = process_device(device, env.local_rank)
    owns_group = init_process_group(torch_device)
    cls = DDPStrategy if name == "ddp" else FSDPStrategy
    return cls(torch_device, owns_group=owns_group)


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
    return True


class _MainRankOnly(logging.Filter):
    """Other ranks only say what went wrong: notices would repeat once per process."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


# ---------------------------------------------------------------- strategies
class _RankShare(Sampler[int]):
    """Samples rank, rank + world, rank + 2 world, ...: each sample on exactly one rank."""

    def __init__(self, size: int, world_size: int, rank: int) -> None:
        self.indices = range(rank, size, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class ProcessGroupStrategy(Strategy):
    """The collectives shared by DDP and FSDP (one process per device)."""

    def __init__(self, device: torch.device, *, owns_group: bool = False) -> None:
        import torch.distributed as dist

        super().__init__(device)
        self._dist = dist
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        self._owns_group = owns_group
        self._log_filter = _MainRankOnly() if self.rank != 0 else None
        if self._log_filter is not None:
            log.addFilter(self._log_filter)

    def prepare_model(self, model: nn.Module, precision: Any,
                      optimizer: torch.optim.Optimizer | None = None) -> nn.Module:
        precision.set_found_inf_agreement(self.agree_found_inf)
        return model

    def agree_found_inf(self, flag: torch.Tensor) -> None:
        """Every rank's found-inf flag becomes the MAX over ranks (in place, on device)."""
        self._dist.all_reduce(flag, op=self._dist.ReduceOp.MAX)

    #: Whether ranks may evaluate different numbers of batches. True where evaluation
    #: runs the unwrapped module (no collective in its forward); FSDP's forward gathers
    #: weights, so there every rank must run the same batches and shares are padded.
    uneven_evaluation = True

    def shard_loader(self, loader: Any, seed: int = 0, *, evaluation: bool = False) -> Any:
        if not isinstance(loader, DataLoader):
            log.warning("the %s data is an iterable, not a DataLoader: each of the %d "
                        "processes must yield its own share of the data",
                        "validation" if evaluation else "training", self.world_size)
            return loader
        if isinstance(loader.sampler, DistributedSampler):
            return loader
        if loader.batch_size is None:  # a custom batch_sampler: its owner must shard it
            log.warning("the DataLoader has a custom batch_sampler: shard it per rank "
                        "(e.g. with DistributedSampler), amptrain cannot")
            return loader
        if evaluation and self.uneven_evaluation:
            # DistributedSampler would repeat samples to give every rank the same count,
            # and the repeats would be counted in the accuracy.
            sampler: Sampler[int] = _RankShare(len(loader.dataset), self.world_size, self.rank)
        else:
            sampler = DistributedSampler(loader.dataset, num_replicas=self.world_size,
                                         rank=self.rank, seed=seed, drop_last=loader.drop_last,
                                         shuffle=isinstance(loader.sampler, RandomSampler))
        return DataLoader(loader.dataset, batch_size=loader.batch_size, sampler=sampler,
                          num_workers=loader.num_workers, collate_fn=loader.collate_fn,
                          pin_memory=loader.pin_memory, drop_last=loader.drop_last,
                          timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
                          persistent_workers=loader.persistent_workers)

    def reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        total = value.detach().clone()
        self._dist.all_reduce(total)
        return total

    def reduce_mean(self, value: torch.Tensor) -> torch.Tensor:
        return self.reduce_sum(value) / self.world_size

    def gather(self, value: torch.Tensor) -> torch.Tensor:
        # Ranks may hold different lengths (the last evaluation batch): pad to the longest.
        value = value.detach().reshape(-1)
        size = torch.tensor([value.numel()], device=value.device, dtype=torch.long)
        sizes = [torch.zeros_like(size) for _ in range(self.world_size)]
        self._dist.all_gather(sizes, size)
        lengths = [int(s.item()) for s in sizes]
        padded = value.new_zeros(max(lengths))
        padded[:value.numel()] = value
        parts = [torch.zeros_like(padded) for _ in range(self.world_size)]
        self._dist.all_gather(parts, padded)
        return torch.cat([part[:n] for part, n in zip(parts, lengths)])

    def broadcast_object(self, value: Any) -> Any:
        box = [value]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        self._dist.barrier()

    def teardown(self) -> None:
        if self._log_filter is not None:
            log.removeFilter(self._log_filter)
            self._log_filter = None
        if self._owns_group and self._dist.is_initialized():
            self._dist.destroy_process_group()
            self._owns_group = False


class DDPStrategy(ProcessGroupStrategy):
    """DistributedDataParallel: replicas on every rank, gradients all-reduced in backward.

    Off-boundary accumulation micro-batches run under ``no_sync`` (one all-reduce per
    optimizer step, not per micro-batch); checkpoints hold the unwrapped module.
    """

    def __init__(self, device: torch.device, *, owns_group: bool = False) -> None:
        super().__init__(device, owns_group=owns_group)
        self.ddp: nn.parallel.DistributedDataParallel | None = None

    def wrap(self, model: nn.Module) -> nn.Module:
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.ddp = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
        return self.ddp

    def accumulation_context(self, model: nn.Module, boundary: bool) -> ContextManager:
        # The DDP wrapper we made, not `model`: the loop may call a torch.compile'd module.
        if boundary or self.ddp is None:
            return contextlib.nullcontext()
        return self.ddp.no_sync()


class FSDPStrategy(ProcessGroupStrategy):
    """FSDP2: every rank holds a shard of each parameter (fp32), gathered per forward.

    Mixed precision comes from the precision layer's ``MixedPrecisionPolicy``; modules
    that must stay fp32 (``--keep-fp32`` islands, norm layers) get groups of their own.
    Checkpoints are gathered into full fp32 state dicts that load on one device.
    """

    uneven_evaluation = False

    def prepare_model(self, model: nn.Module, precision: Any,
                      optimizer: torch.optim.Optimizer | None = None) -> nn.Module:
        from torch.distributed.fsdp import fully_shard

        if optimizer is not None:
            raise UserError("--strategy fsdp replaces the model's parameters by shards: let "
                            "amptrain build the optimizer (pass none to fit())")
        super().prepare_model(model, precision, optimizer)
        policy = precision.fsdp_policy()
        fp32_modules = precision.fsdp_fp32_modules(model)
        fp32_ids = {id(m) for m in fp32_modules}
        # Innermost groups first: a group owns the parameters its sub-groups do not.
        for module in fp32_modules:
            if any(True for _ in module.parameters()):
                fully_shard(module, mp_policy=precision.fsdp_policy(fp32=True))
        for block in _shard_units(model):
            if id(block) not in fp32_ids:
                fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        return model

    def model_state_dict(self, model: nn.Module, precision: Any) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                     cpu_offload=True))
        return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}

    def load_model_state_dict(self, model: nn.Module, precision: Any,
                              state: dict[str, torch.Tensor]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))

    def optimizer_state_dict(self, model: nn.Module,
                             optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                             get_optimizer_state_dict)

        return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))

    def load_optimizer_state_dict(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                                  state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                             set_optimizer_state_dict)

        set_optimizer_state_dict(model, optimizer, state,
                                 options=StateDictOptions(full_state_dict=True))


def _shard_units(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a model: parameter-holding children of ``Sequential`` and
    ``ModuleList`` containers (transformer layers, ResNet blocks, MLP layers), outermost
    first found, innermost first returned (``fully_shard`` wants children before parents)."""
    units: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        container = isinstance(module, (nn.Sequential, nn.ModuleList))
        for child in module.children():
            if container and any(True for _ in child.parameters()):
                units.append(child)
            else:
                visit(child)

    visit(model)
    return units


class _AutocastForward(nn.Module):
    """Runs the wrapped module's forward under the precision's autocast.

    DataParallel runs each replica's forward in its own thread, and autocast state is
    thread-local; torch re-enables autocast there but with the default dtype (fp16 on
    CUDA), so a bf16 run would silently compute in fp16. Autocast inside each replica's
    forward gives every replica the mode's own dtype.
    """

    def __init__(self, module: nn.Module, precision: Any) -> None:
        super().__init__()
        self.module = module
        self.precision = precision

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision.autocast():
            return self.module(*args, **kwargs)


class DataParallelStrategy(Strategy):
    """``nn.DataParallel`` over all visible GPUs from one process (DDP is faster)."""

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self._precision: Any = None
        log.warning("--strategy dp: DataParallel runs one Python thread per GPU and copies the "
                    "model every step; DDP is faster: `amptrain train --nproc-per-node N`")

    def prepare_model(self, model: nn.Module, precision: Any,
                      optimizer: torch.optim.Optimizer | None = None) -> nn.Module:
        self._precision = precision
        return model

    def wrap(self, model: nn.Module) -> nn.Module:
        if self._precision is None:
            raise RuntimeError("DataParallelStrategy.prepare_model() must run before wrap()")
        device_ids = None
        if self.device.type == "cuda":
            first = self.device.index or 0
            device_ids = [first] + [i for i in range(torch.cuda.device_count()) if i != first]
        return nn.DataParallel(_AutocastForward(model, self._precision), device_ids=device_ids)
