"""DistributedDataParallel, and the collectives it shares with FSDP (one process per device)."""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sized
from typing import Any, cast

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Sampler

from .base import Strategy, _MainRankOnly, release_group

log = logging.getLogger("amptrain")


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

    def wrap_model(self, model: nn.Module, precision: Any,
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
            # A sized map-style dataset, as DistributedSampler below assumes too.
            sampler: Sampler[int] = _RankShare(len(cast(Sized, loader.dataset)),
                                               self.world_size, self.rank)
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

    def gather_objects(self, value: Any) -> list[Any]:
        values: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(values, value)
        return values

    def barrier(self) -> None:
        self._dist.barrier()

    def teardown(self) -> None:
        if self._log_filter is not None:
            log.removeFilter(self._log_filter)
            self._log_filter = None
        self._release_wrappers()
        if self._owns_group and self._dist.is_initialized():
            release_group()  # the wrappers that hold the group are collected first
            self._owns_group = False

    def _release_wrappers(self) -> None:
        """Drop the strategy's own references to wrappers that hold the process group."""


class DDPStrategy(ProcessGroupStrategy):
    """DistributedDataParallel: replicas on every rank, gradients all-reduced in backward.

    Each wrapped module (each part of a task with several: a GAN's generator and
    discriminator) gets its own DDP wrapper, and off-boundary accumulation micro-batches
    run under that part's ``no_sync`` (one all-reduce per optimizer step, not per
    micro-batch); checkpoints hold the unwrapped module.
    """

    def __init__(self, device: torch.device, *, owns_group: bool = False) -> None:
        super().__init__(device, owns_group=owns_group)
        self.wrappers: list[nn.parallel.DistributedDataParallel] = []

    @property
    def ddp(self) -> nn.parallel.DistributedDataParallel | None:
        """The last wrapper made (the one model of a one-part run), or None."""
        return self.wrappers[-1] if self.wrappers else None

    def _release_wrappers(self) -> None:
        self.wrappers = []

    def wrap(self, model: nn.Module) -> nn.Module:
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
        self.wrappers.append(ddp)
        return ddp

    def wrapper_of(self, model: nn.Module) -> nn.parallel.DistributedDataParallel | None:
        """The DDP wrapper we made that ``model`` is or holds (through torch.compile's
        wrapper); for another module (a caller's own forward), the last one made, as
        before parts had wrappers of their own."""
        inner: Any = model
        while isinstance(inner, nn.Module):
            if any(inner is w for w in self.wrappers):
                return cast(nn.parallel.DistributedDataParallel, inner)
            inner = getattr(inner, "_orig_mod", None)
        return self.ddp

    def accumulation_context(self, model: nn.Module,
                             boundary: bool) -> contextlib.AbstractContextManager:
        # Our DDP wrapper of `model`, which the loop may call through torch.compile.
        ddp = None if boundary else self.wrapper_of(model)
        return contextlib.nullcontext() if ddp is None else ddp.no_sync()
