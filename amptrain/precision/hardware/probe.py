"""What this machine is and what it supports: the facts ``amptrain env`` reports.

:func:`collect_env` describes the software and hardware (reports embed it), including
which precision modes the present device runs natively (``supported``) and the one
amptrain would pick (``recommended_precision``), asked of :mod:`.support`, with
:mod:`.advice`'s notes. Every CUDA fact comes from ``torch.cuda.*`` queries, so tests can
fake a GPU by patching them.
"""
from __future__ import annotations

import os
import platform
from collections.abc import Callable
from typing import Any

import torch

from .advice import cpu_notes, memory_note, recommended_line
from .devices import cpu_flags, cpu_model, gpu_info, resolve_device
from . import support
from .support import gpu_features, support_table, use_instead


def _version(query: Callable[[], Any]) -> str | None:
    try:
        value = query()
    except Exception:  # noqa: BLE001 - a CPU build raises for CUDA libraries; any failure = absent
        return None
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        return ".".join(str(v) for v in value)
    return str(value)


def _nccl_version() -> str | None:
    if not torch.cuda.is_available():
        return None
    return _version(torch.cuda.nccl.version)


def env_notes(device: torch.device, flags: dict[str, bool | None], features: dict[str, bool],
              gpus: list[dict[str, Any]], recommended: str) -> list[str]:
    """Plain-language consequences of the facts above, for people choosing a precision."""
    notes: list[str] = []
    if device.type == "cpu":
        if torch.version.cuda is None:
            notes.append("this torch is a CPU build: no CUDA GPU can be used")
        elif not gpus:
            notes.append("no CUDA GPU visible: training runs on the CPU")
        notes += cpu_notes(flags, features)
        notes.append("tf32 is a CUDA feature: on this device --precision tf32 trains as 32-true")
    else:
        gpu = gpus[device.index or 0]
        cc = gpu["compute_capability"]
        if not features["bf16"]:
            notes.append(f"{gpu['name']} (compute capability {cc}) has no bf16: bf16 modes "
                         f"are refused; use {use_instead(device)}")
        if not features["tensor_cores"]:
            notes.append(f"{gpu['name']} has no Tensor Cores: mixed precision saves memory "
                         f"but little time")
        if features["tf32"]:
            notes.append("TF32 Tensor Cores: --precision tf32 speeds up fp32 matmul/conv "
                         "(10-bit mantissa)")
        if len(gpus) > 1:
            notes.append(f"{len(gpus)} GPUs visible: train on all with --nproc-per-node "
                         f"{len(gpus)}")
    if features["fp8"] and not support.torchao_available():  # looked up: tests fake it
        notes.append("fp8 needs torchao (pip install torchao); it is not installed")
    elif not features["fp8"]:
        notes.append("fp8, fp8-rowwise and fp8-rowwise-gw-hp run natively on an NVIDIA GPU "
                     "with compute capability 8.9+ (Ada/Hopper) and torchao, fp8-blockwise "
                     "on 9.0+ (Hopper) with torchao and Triton; here they are emulated")
    if features["fp8"] and not features.get("fp8_blocks"):
        notes.append("fp8-blockwise is emulated here: torchao's blockwise kernels need "
                     "compute capability 9.0+ (Hopper)")
    notes.append("mxfp8, mxfp4, nvfp4 and nvfp4-plain are emulated on every device (amptrain "
                 "drives no "
                 "Blackwell sm100 kernels): an emulated format gives its numerics (accuracy, "
                 "saturation), not its speed or memory")
    memory = memory_note(device, features)
    if memory:
        notes.append(memory)
    if recommended != "32-true":
        notes.append("for conv nets under AMP add --channels-last (NHWC is what Tensor Cores "
                     "and oneDNN's reduced-precision kernels want)")
    return notes


def collect_env() -> dict[str, Any]:
    """The software, the hardware and what it supports (``amptrain env --json``).

    The first keys (``python``, ``torch``, ``cuda``, ``cpu``, ``cpu_cores``, ``gpus``) are
    embedded in other reports; the rest describe precision support on the device that
    ``--device auto`` would use.
    """
    flags = cpu_flags()
    gpus = [{**gpu_info(i), **gpu_features(*torch.cuda.get_device_capability(i))}
            for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    device = resolve_device("auto")
    support = support_table(device, flags)
    features, recommended = support["features"], support["recommended_precision"]
    return {
        "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "cpu": cpu_model(), "cpu_cores": os.cpu_count(),
        "gpus": gpus,
        "cudnn": _version(torch.backends.cudnn.version) if torch.cuda.is_available() else None,
        "nccl": _nccl_version(),
        "cpu_flags": flags,
        "device": str(device),
        **support,
        "channels_last": recommended != "32-true",
        "notes": env_notes(device, flags, features, gpus, recommended),
        # the verdict as format_env prints it: where bf16 would pay when it is not native
        "recommended_line": recommended_line(device, recommended != "32-true"),
    }
