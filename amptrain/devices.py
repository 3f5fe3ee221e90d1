"""Device selection, and what a device is (CPU flags, GPU properties)."""
from __future__ import annotations

import platform
from typing import Any

import torch

from .errors import UserError, flag

#: /proc/cpuinfo flags that decide how fast reduced precision is on an x86 CPU.
CPU_FLAGS = {"amx_bf16": "AMX-BF16", "amx_fp16": "AMX-FP16", "amx_tile": "AMX-TILE",
             "avx512_bf16": "AVX512-BF16", "avx512_fp16": "AVX512-FP16"}

def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform's guess."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def read_cpu_flags(path: str = "/proc/cpuinfo") -> set[str] | None:
    """The CPU's feature flags (x86 ``flags``, ARM ``Features``), or None when unknown."""
    try:
        with open(path) as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return None


def cpu_flags(path: str = "/proc/cpuinfo") -> dict[str, bool | None]:
    """{flag: present} for :data:`CPU_FLAGS`; values are None when the flags are unknown."""
    flags = read_cpu_flags(path)
    return {name: (None if flags is None else name in flags) for name in CPU_FLAGS}


def gpu_info(index: int) -> dict[str, Any]:
    """Name, compute capability and memory of one CUDA device."""
    props = torch.cuda.get_device_properties(index)
    return {"name": props.name, "compute_capability": f"{props.major}.{props.minor}",
            "memory_bytes": int(props.total_memory),
            "multiprocessors": getattr(props, "multi_processor_count", None)}


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` -> the first CUDA device when available, else CPU; validates explicit names."""
    if name == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"{flag('device')} {name!r} is not a device "
                        f"(use cpu, cuda, cuda:N or auto)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"{flag('device')} cuda: no CUDA GPU is visible here; use "
                            f"{flag('device')} cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"{flag('device')} {name}: only {torch.cuda.device_count()} GPU(s) "
                            f"visible")
    elif device.type != "cpu":
        raise UserError(f"{flag('device')} {name}: amptrain supports cpu and cuda")
    return device
