"""What amptrain advises about precision on a device, derived from what
:mod:`.support` says the device runs natively or only emulates -- never fixed text.

``env``'s notes and verdict, the emulation warning of a run, the fp16-overflow error,
``diagnose``'s bf16 verdict and ``compare``'s headline all word their advice here, so it
stays true on every CPU class (AMX, AVX512-BF16 without fp16, AVX512 without bf16,
AVX2-only) and on GPUs.

Two rules hold throughout: an *emulated* mode is for studying a format's numerics
(overflow, accuracy) on this machine and is never called faster than 32-true here; for
speed the advice names the fastest mode the device runs natively (:func:`fastest_native`,
which is what ``auto`` picks; a refusal's "use instead" is :func:`.support.use_instead`).
Where that is 32-true but bf16 would pay on other hardware, the advice says "32-true here,
bf16-mixed on ...".
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from ...common.errors import flag
from ...common.choices import canonical_name
from ..modes import MODES
from .support import auto_mode, device_features, emulated_precisions, onednn_has_bf16_kernels

#: Where bf16 runs in hardware, for "bf16-mixed on ..." advice on a device without it.
BF16_HARDWARE = "a GPU with bf16 (compute capability 8.0+) or a CPU with AVX512-BF16 or AMX"
FP16_HARDWARE = "a GPU with Tensor Cores (compute capability 7.0+) or a CPU with AVX512-FP16"

Flags = Mapping[str, "bool | None"]


def base_mode(name: str) -> str:
    """The precision mode of a row label: ``bf16-true+kahan`` -> ``bf16-true``,
    ``O2`` -> ``16-master``; a label that names no mode is returned as it is."""
    mode = str(name).split("+", 1)[0].strip()
    try:
        return canonical_name(mode)
    except Exception:  # noqa: BLE001 - an unknown label is simply not a mode
        return mode


def fastest_native(device: torch.device) -> str:
    """The mode to train in for speed on ``device``: never an emulated one."""
    return auto_mode(device)


def less_memory(device: torch.device) -> str:
    """A precision that takes less memory on ``device``, with its flag: bf16-mixed where
    bf16 is native; where it is emulated (whose fp32 kernels keep fp32 activations for
    backward) the half weights of bf16-true."""
    if device_features(device)["bf16"]:
        return f"{flag('precision')} bf16-mixed"
    return (f"{flag('precision')} bf16-true (half weights and optimizer state; this "
            f"{device.type} only emulates bf16, which keeps fp32 activations)")


def emulated_modes(device: torch.device, flags: Flags | None = None) -> set[str]:
    """The modes ``device`` accepts but computes without hardware for their format."""
    features = device_features(device, dict(flags) if flags is not None else None)
    return {name for name, slow in emulated_precisions(device, features).items() if slow}


def is_emulated(name: str, device: torch.device, flags: Flags | None = None) -> bool:
    """True when the mode of ``name`` (a mode, an alias or a ladder rung such as
    ``bf16-true+kahan``) is only emulated on ``device``."""
    return base_mode(name) in emulated_modes(device, flags)


def _format(name: str) -> str:
    spec = MODES[base_mode(name)]
    dtypes = (spec.compute_dtype, spec.param_dtype)
    return "bf16" if torch.bfloat16 in dtypes else "fp16"


def _here_then_elsewhere(device: torch.device, fmt: str) -> str:
    """``"32-true here"`` and, when the format pays on other hardware, where."""
    fastest = fastest_native(device)
    where = BF16_HARDWARE if fmt == "bf16" else FP16_HARDWARE
    if fastest == "32-true":
        return f"{flag('precision')} 32-true here; {fmt} pays on {where}"
    return f"{flag('precision')} {fastest} (native here)"


def emulation_warning(name: str, device: torch.device, flags: Flags | None = None,
                      fast: bool = False) -> str | None:
    """The warning for training in ``name`` on a device that only emulates it, or None.

    ``fast``: the mode runs as fp32 kernels with the format's rounding
    (:mod:`.emulation`): native numerics at about 32-true's speed, never faster."""
    if not is_emulated(name, device, flags):
        return None
    fmt = _format(name)
    how = (f"fp32 kernels with {fmt} rounding give native hardware's numerics at about "
           f"32-true's speed: use it here to study {fmt} numerics (overflow, loss scaling, "
           f"accuracy); its timing and memory say nothing about {fmt} hardware" if fast else
           f"use it here to study {fmt} numerics (overflow, accuracy), not for speed")
    return (f"{name} is emulated on this {device.type} (no native {fmt} maths): {how}; it "
            f"is never faster than 32-true on this machine; for speed use "
            f"{_here_then_elsewhere(device, fmt)}")


def range_safe_choice(device: torch.device, flags: Flags | None = None) -> str:
    """What to train in when fp16's range is the problem, true on ``device``: bf16-mixed
    where bf16 is native; 32-true here (and bf16-mixed elsewhere) where it is not."""
    features = device_features(device, dict(flags) if flags is not None else None)
    if features["bf16"]:
        return f"{flag('precision')} bf16-mixed (fp32's range, native here)"
    if device.type == "cuda":
        return (f"{flag('precision')} 32-true (this GPU has no bf16; bf16-mixed, fp32's "
                f"range, needs compute capability 8.0+)")
    return (f"{flag('precision')} 32-true here (bf16-mixed has fp32's range but this "
            f"{device.type} only emulates bf16, which is never faster than 32-true; use "
            f"bf16-mixed on {BF16_HARDWARE})")


def bf16_where(device: torch.device, flags: Flags | None = None) -> str:
    """How bf16-mixed stands on ``device``, for diagnose's bf16 verdict."""
    if is_emulated("bf16-mixed", device, flags):
        return (f"but only emulated on this {device.type}: for speed use "
                f"{_here_then_elsewhere(device, 'bf16')}")
    features = device_features(device, dict(flags) if flags is not None else None)
    if features["bf16"]:
        return "native on this device"
    return f"but refused on this {device.type} (no bf16): {range_safe_choice(device, flags)}"


def recommended_line(device: torch.device, channels_last: bool = False) -> str:
    """``env``'s verdict: the fastest native mode, and where bf16 would pay when that is
    32-true on a CPU."""
    fastest = fastest_native(device)
    extra = " (+ --channels-last for conv nets)" if channels_last else ""
    if fastest == "32-true" and device.type == "cpu":
        extra += f" here; on {BF16_HARDWARE}: --precision bf16-mixed"
    return f"recommended: --precision {fastest}{extra}"


def cpu_notes(flags: Flags, features: Mapping[str, bool],
              bf16_kernels: bool | None = None) -> list[str]:
    """``env``'s notes on bf16 and fp16 for a CPU with ``flags`` and ``features``."""
    notes: list[str] = []
    bf16_kernels = onednn_has_bf16_kernels() if bf16_kernels is None else bf16_kernels
    study = "for studying {fmt} numerics here (overflow, accuracy), never faster than 32-true"
    if features["bf16"]:
        engine = "AMX-BF16 tiles" if flags.get("amx_bf16") else "AVX512-BF16"
        notes.append(f"bf16 is native on this CPU ({engine}): bf16-mixed is the fastest "
                     f"safe choice and needs no loss scaling")
    else:
        notes.append(f"this CPU has no native bf16 (no AVX512-BF16/AMX-BF16): the bf16 "
                     f"modes are emulated, {study.format(fmt='bf16')}; train in 32-true here, "
                     f"bf16-mixed on {BF16_HARDWARE}")
        if not bf16_kernels:
            notes.append("oneDNN has no bf16 kernels at all on this CPU (below AVX512): under "
                         "bf16 recurrent layers (LSTM/GRU/RNN) run as fp32 islands")
    fastest = "bf16-mixed" if features["bf16"] else "32-true"
    if not features["fp16"]:
        notes.append(f"fp16 is emulated on this CPU (no AVX512-FP16/AMX-FP16): the 16-* "
                     f"modes are {study.format(fmt='fp16')}; for speed use {fastest} here")
    elif flags.get("amx_fp16"):
        notes.append("fp16 is native (AMX-FP16): 16-mixed runs on the matrix units like bf16 "
                     "but needs loss scaling, which bf16-mixed does not")
    else:
        tiles = ", bf16 on the AMX tiles: prefer bf16-mixed" if flags.get("amx_bf16") else ""
        notes.append(f"fp16 is native on AVX512-FP16 vectors only (no AMX-FP16){tiles}; "
                     f"PyTorch's fp16 convolution backward is a slow reference kernel "
                     f"(amptrain computes it in fp32 instead)")
    return notes


def memory_note(device: torch.device, features: Mapping[str, bool]) -> str | None:
    """The memory ladder's advice, with its cost where bf16 is only emulated."""
    ladder = ("memory-bound: --precision bf16-true --weight-update kahan keeps 10 bytes per "
              "parameter of weights, gradients and Adam state (fp32 training: 16) and learns "
              "like fp32; with --optimizer adamw8bit 8, --weight-update stochastic 6 "
              "(docs/memory-ladder.md)")
    if features["bf16"]:
        return ladder
    if device.type == "cpu":
        return (f"{ladder}; bf16 is emulated on this CPU, so here the ladder saves memory "
                f"and costs time")
    return None
