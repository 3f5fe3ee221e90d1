"""What this machine is and what it supports (the ``amptrain env`` command builds on it)."""
from __future__ import annotations

import os
import platform
from typing import Any

import torch


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


def collect_env() -> dict[str, Any]:
    """A short description of the software and hardware (used in reports)."""
    info: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "cpu": cpu_model(), "cpu_cores": os.cpu_count(),
        "gpus": [],
    }
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            info["gpus"].append({"name": props.name,
                                 "compute_capability": f"{props.major}.{props.minor}",
                                 "memory_bytes": props.total_memory})
    return info
