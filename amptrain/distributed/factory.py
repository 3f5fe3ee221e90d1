"""Building the strategy that ``--strategy`` and torchrun's environment ask for."""
from __future__ import annotations

from ..precision.hardware.devices import resolve_device
from ..common.errors import UserError
from .base import LaunchEnv, Strategy, init_process_group, process_device
from .ddp import DDPStrategy
from .dp import DataParallelStrategy
from .fsdp import FSDPStrategy


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
