"""Device selection and memory accounting."""
from __future__ import annotations

import resource
import sys

import torch

from .errors import UserError


def resolve_device(name: str = "auto") -> torch.device:
    """``auto`` -> the first CUDA device when available, else CPU; validates explicit names."""
    if name == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name!r} is not a device (use cpu, cuda, cuda:N or auto)") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError("--device cuda: no CUDA GPU is visible here; use --device cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UserError(f"--device {name}: only {torch.cuda.device_count()} GPU(s) visible")
    elif device.type != "cpu":
        raise UserError(f"--device {name}: amptrain supports cpu and cuda")
    return device


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak-memory window (CUDA only: a process's peak RSS cannot be reset)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory: CUDA max_memory_allocated, or the process's peak resident set on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB
