"""Device selection, and what a device is (CPU flags, GPU properties)."""
from __future__ import annotations

import platform
from typing import Any

import torch

from ...common.errors import UserError, flag

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


#: oneDNN's x86 instruction-set levels (the names ``ONEDNN_MAX_CPU_ISA`` takes), lowest
#: first, with the /proc/cpuinfo flags each needs on top of the level before it.
CPU_ISA_LEVELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("SSE41", ("sse4_1",)), ("AVX", ("avx",)), ("AVX2", ("avx2", "fma")),
    ("AVX512_CORE", ("avx512f", "avx512bw", "avx512vl", "avx512dq")),
    ("AVX512_CORE_BF16", ("avx512_bf16",)), ("AVX512_CORE_FP16", ("avx512_fp16",)),
    ("AVX512_CORE_AMX", ("amx_tile", "amx_bf16")))


def cpu_isa(path: str = "/proc/cpuinfo") -> str | None:
    """The highest of :data:`CPU_ISA_LEVELS` this CPU's own flags reach, or None when the
    flags are unknown (not Linux x86). ``ONEDNN_MAX_CPU_ISA`` can make oneDNN use less than
    this, never more, so anything that needs AVX512 or AMX must ask here."""
    flags = read_cpu_flags(path)
    if flags is None:
        return None
    reached = "none"
    for level, needs in CPU_ISA_LEVELS:
        if not set(needs) <= flags:
            break
        reached = level
    return reached


def cpu_reaches(level: str, path: str = "/proc/cpuinfo") -> bool | None:
    """True when the real CPU has the instructions of oneDNN ISA ``level`` (e.g.
    ``AVX512_CORE``), None when its flags are unknown."""
    names = [name for name, _ in CPU_ISA_LEVELS]
    if level not in names:
        raise ValueError(f"unknown ISA level {level!r} (one of {', '.join(names)})")
    have = cpu_isa(path)
    if have is None:
        return None
    return have in names and names.index(have) >= names.index(level)


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
