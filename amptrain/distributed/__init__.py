"""Process-group strategies: how a model is wrapped, and how ranks agree.

The Trainer only talks to the :class:`Strategy` protocol; the single-device strategy
is the trivial implementation that the distributed ones extend:

* :class:`DDPStrategy` -- DistributedDataParallel, one process per device (torchrun).
* :class:`FSDPStrategy` -- FSDP2 (``fully_shard``), parameters sharded across ranks.
* :class:`DataParallelStrategy` -- ``nn.DataParallel``, one process driving all GPUs.

:func:`build_strategy` picks one from ``--strategy`` and torchrun's environment
(``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``).

The protocol and torchrun's environment live in :mod:`.base`; each strategy has a
module of its own (:mod:`.ddp`, :mod:`.fsdp`, :mod:`.dp`), and :mod:`.factory`, which
knows them all, builds one.
"""
from __future__ import annotations

from .base import (
    LaunchEnv,
    Strategy,
    init_process_group,
    is_main_process,
    process_device,
)
from .ddp import DDPStrategy, ProcessGroupStrategy
from .dp import DataParallelStrategy
from .factory import build_strategy
from .fsdp import FSDPStrategy

__all__ = [
    "DDPStrategy", "DataParallelStrategy", "FSDPStrategy", "LaunchEnv", "ProcessGroupStrategy",
    "Strategy", "build_strategy", "init_process_group", "is_main_process", "process_device",
]
