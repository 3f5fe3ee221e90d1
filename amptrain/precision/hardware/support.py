"""What a device supports: which precision modes run natively, which are only emulated,
which are refused, and which one ``auto`` picks. The single authority on these facts:
``env``, ``compare``, ``diagnose`` and :func:`~amptrain.precision.resolve.resolve_precision`
ask here; :mod:`.advice` words its advice from them (and is never asked back).

Every CUDA fact comes from ``torch.cuda.*`` queries and every CPU fact from
``/proc/cpuinfo`` and oneDNN, so tests can fake either.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

from ...common.errors import flag
from ..emulation import emulation_switched_on
from ..modes import MODES, ModeSpec
from .devices import cpu_flags

# Compute capabilities (major, minor) where NVIDIA hardware features start.
CC_FP16 = (6, 0)          # fast fp16 arithmetic (Pascal P100)
CC_TENSOR_CORES = (7, 0)  # Volta: fp16 Tensor Cores
CC_BF16 = (8, 0)          # Ampere: bf16 and TF32 Tensor Cores
CC_FP8 = (8, 9)           # Ada (L4, L40S) and Hopper (H100, H200): fp8 Tensor Cores
CC_FP8_BLOCKS = (9, 0)    # Hopper: torchao's blockwise fp8 kernels (DeepSeek-V3 tiles)

_F16, _BF16 = torch.float16, torch.bfloat16


def onednn_has_bf16_kernels() -> bool:
    """True when oneDNN runs bf16 kernels here at all: natively (AVX512-BF16, AMX) or with
    AVX512 emulating them. Where it is False (an AVX2-only CPU) some bf16 primitives do not
    exist, oneDNN's LSTM among them (see :mod:`amptrain.precision.islands`)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # builds without oneDNN
        return False


#: oneDNN's CPU instruction-set levels in order (``ONEDNN_MAX_CPU_ISA`` caps the level it
#: uses, which is how a test makes a new CPU behave as an older one).
_ONEDNN_ISA_ORDER = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                     "AVX512_CORE_VNNI", "AVX512_CORE_BF16", "AVX512_CORE_FP16",
                     "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16")
_ISA_NEEDED = {"bf16": "AVX512_CORE_BF16", "fp16": "AVX512_CORE_FP16", "amx": "AVX512_CORE_AMX"}


def onednn_may_use(feature: str) -> bool:
    """False when ``ONEDNN_MAX_CPU_ISA`` keeps oneDNN below the level that ``feature``
    (bf16, fp16, amx) needs, whatever the CPU has."""
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "")
    cap = cap.strip().upper()
    if not cap or cap == "ALL" or cap not in _ONEDNN_ISA_ORDER:
        return True
    return _ONEDNN_ISA_ORDER.index(cap) >= _ONEDNN_ISA_ORDER.index(_ISA_NEEDED[feature])


def cpu_has_native_bf16(flags: dict[str, bool | None] | None = None) -> bool:
    """bf16 maths in hardware that oneDNN may use: AVX512-BF16 or AMX-BF16. An AVX512 CPU
    without them runs bf16 by emulation (slower than fp32), which is not native."""
    flags = cpu_flags() if flags is None else flags
    known = flags.get("avx512_bf16") is not None or flags.get("amx_bf16") is not None
    has = bool(flags.get("avx512_bf16") or flags.get("amx_bf16")) if known \
        else onednn_has_bf16_kernels()  # no /proc/cpuinfo: oneDNN's own answer
    return has and onednn_may_use("bf16")


def torchao_available() -> bool:
    """True when the torchao package is installed (without importing it)."""
    return importlib.util.find_spec("torchao") is not None


def triton_available() -> bool:
    """True when Triton is installed (torchao's blockwise fp8 kernels are Triton kernels)."""
    return importlib.util.find_spec("triton") is not None


def fp8_native(device: torch.device) -> bool:
    """True when ``device`` has fp8 Tensor Cores (compute capability 8.9+): fp8 and
    fp8-rowwise then run natively, as torchao Float8Linear layers (precision/fp8.py)."""
    return device.type == "cuda" and tuple(torch.cuda.get_device_capability(device)) >= CC_FP8


def fp8_blocks_native(device: torch.device) -> bool:
    """True when ``device`` runs torchao's blockwise fp8 kernels: compute capability 9.0+
    with torchao and Triton installed (fp8-blockwise then runs natively)."""
    return device.type == "cuda" and \
        tuple(torch.cuda.get_device_capability(device)) >= CC_FP8_BLOCKS and \
        torchao_available() and triton_available()


def cuda_bf16_supported(device: torch.device) -> bool:
    """bf16 in hardware (compute capability 8.0+), not emulated."""
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 8


def gpu_features(major: int, minor: int) -> dict[str, bool]:
    """The reduced-precision hardware of a GPU of compute capability ``major.minor``."""
    cc = (major, minor)
    return {"tensor_cores": cc >= CC_TENSOR_CORES, "fp16": cc >= CC_FP16,
            "bf16": cc >= CC_BF16, "tf32": cc >= CC_BF16, "fp8": cc >= CC_FP8,
            "fp8_blocks": cc >= CC_FP8_BLOCKS}


def device_features(device: torch.device,
                    flags: dict[str, bool | None] | None = None) -> dict[str, bool]:
    """Which reduced-precision maths ``device`` does in hardware (not emulated)."""
    if device.type == "cuda":
        return gpu_features(*torch.cuda.get_device_capability(device))
    flags = cpu_flags() if flags is None else flags
    native_fp16 = bool(flags.get("avx512_fp16") or flags.get("amx_fp16")) \
        and onednn_may_use("fp16")
    return {"tensor_cores": False, "amx": bool(flags.get("amx_tile")) and onednn_may_use("amx"),
            "fp16": native_fp16, "bf16": cpu_has_native_bf16(flags), "tf32": False,
            "fp8": False, "fp8_blocks": False}


def _kind(spec: ModeSpec) -> str:
    """The hardware feature a mode needs: fp8, fp8-blocks, mx (the block formats), tf32,
    bf16, fp16 or fp32."""
    dtypes = (spec.compute_dtype, spec.param_dtype)
    return "fp8" if spec.float8_linears else "fp8-blocks" if spec.float8_blocks \
        else "mx" if spec.lowbit else "tf32" if spec.tf32 \
        else "bf16" if _BF16 in dtypes else "fp16" if _F16 in dtypes else "fp32"


def lowbit_native(spec: ModeSpec, device: torch.device) -> bool:
    """True when ``spec``'s low-bit format runs on hardware here (the fp8 recipes on an
    sm89+ GPU, as torchao Float8Linear; fp8-blockwise on sm90+ with torchao's blockwise
    kernels); False where :mod:`.lowbit` emulates it. amptrain does not drive the block
    formats' Blackwell (sm100) kernels, so MX and NVFP4 are always emulated."""
    if spec.float8_blocks:
        return fp8_blocks_native(device)
    return spec.float8_linears and fp8_native(device) and torchao_available()


def autocast_mode(spec: ModeSpec, device: torch.device) -> str:
    """The mode whose autocast ``spec`` uses outside its low-bit layers: bf16-mixed for an
    emulated low-bit format; itself for the others (a native one runs torchao's float8
    tensors, which must meet plain autocast, not amptrain's emulated kernels)."""
    return "bf16-mixed" if spec.lowbit and not lowbit_native(spec, device) else spec.name


def precision_needs(device: torch.device) -> dict[str, str]:
    """What each precision needs from this kind of device (one line each, for the table)."""
    if device.type == "cuda":
        by_kind = {"fp32": "any CUDA GPU", "tf32": "compute capability 8.0+ (Ampere)",
                   "fp16": "compute capability 6.0+ (Tensor Cores: 7.0+)",
                   "bf16": "compute capability 8.0+ (Ampere)",
                   "fp8": "compute capability 8.9+ (Ada/Hopper) and torchao; emulated below",
                   "fp8-blocks": "compute capability 9.0+ (Hopper), torchao and Triton; "
                                 "emulated below",
                   "mx": "emulated (amptrain does not drive sm100 MX/NVFP4 kernels)"}
    else:
        by_kind = {"fp32": "any CPU", "tf32": "an NVIDIA GPU (here it trains as 32-true)",
                   "fp16": "AVX512-FP16 or AMX-FP16 (AMX-FP16 for fast conv)",
                   "bf16": "AVX512-BF16 or AMX-BF16 (AMX for speed)",
                   "fp8": "native: a GPU of compute capability 8.9+ with torchao",
                   "fp8-blocks": "native: a GPU of compute capability 9.0+ with torchao "
                                 "and Triton",
                   "mx": "native: Blackwell (sm100); not driven by amptrain"}
    return {name: by_kind[_kind(spec)] for name, spec in MODES.items()}


def supported_precisions(features: dict[str, bool]) -> dict[str, bool]:
    """{precision: runs natively on a device with ``features``} for every mode.

    fp8 also needs torchao (:func:`lowbit_native`); the MX and NVFP4 formats are never
    native here (emulated everywhere).
    """
    supported = {}
    for name, spec in MODES.items():
        kind = _kind(spec)
        if kind in ("fp8", "fp8-blocks", "mx"):
            blocks = features.get("fp8_blocks", False) and triton_available()
            supported[name] = (features["fp8"] if kind == "fp8" else blocks
                               if kind == "fp8-blocks" else False) and torchao_available()
        else:
            supported[name] = kind == "fp32" or bool(features[kind])
    return supported


def emulated_precisions(device: torch.device, features: dict[str, bool]) -> dict[str, bool]:
    """{precision: accepted here but computed without hardware for it}.

    On a CPU without AVX512-FP16/AMX-FP16, PyTorch's fp16 kernels convert to fp32 around
    every element, and its bf16 ones without AVX512-BF16/AMX likewise: several times
    slower than fp32. amptrain computes such modes' matmuls and convolutions with fp32
    kernels and the half format's rounding instead (:func:`emulated_fast`).
    The low-bit formats are emulated wherever they are accepted but not native
    (:mod:`.lowbit`). A refused mode (bf16 on a pre-Ampere GPU) is not "emulated".
    """
    emulated = {}
    for name, spec in MODES.items():
        kind = _kind(spec)
        accepted = unsupported_reason(spec, device) is None
        slow_half = kind in ("fp16", "bf16") and not features[kind]
        lowbit = spec.lowbit is not None and not lowbit_native(spec, device)
        emulated[name] = accepted and (slow_half or lowbit)
    return emulated


def emulated_fast(device: torch.device, features: dict[str, bool]) -> dict[str, bool]:
    """{precision: emulated here, and computed by :mod:`amptrain.precision.emulation`}:
    fp32 kernels with the half format's rounding -- the numerics of native hardware at
    about fp32's speed. True for every CPU-emulated mode unless ``AMPTRAIN_EMULATION=off``
    asks for PyTorch's own (slow) half kernels; always true for an emulated low-bit format
    (its quantised operands meet in fp32 GEMMs on any device)."""
    fast = device.type == "cpu" and emulation_switched_on()
    return {name: (fast or MODES[name].lowbit is not None) and emulated
            for name, emulated in emulated_precisions(device, features).items()}


def emulation_label(emulated: bool, fast: bool, lowbit: bool = False) -> str | None:
    """How ``env`` shows a mode that the device only emulates (``lowbit``: a low-bit
    format, whose operands are quantised for fp32 GEMMs); None for the others."""
    if not emulated:
        return None
    if lowbit:
        return "emulated (format numerics, fp32 GEMMs)"
    return "emulated (native numerics, fp32 speed)" if fast else "emulated (slow)"


def auto_mode(device: torch.device) -> str:
    """The fastest mode that is safe on ``device`` and never an emulated one: bf16 where
    native, else fp16 on Tensor-Core GPUs, else fp32.

    Never a low-bit format (fp8, MX, NVFP4): they pay off only for large Linear layers,
    and their loss curves have to be checked against bf16 for each model
    (benchmarks/gpu_fp8.py, ``amptrain compare``), so they are opt-in.
    """
    if device.type == "cuda":
        if cuda_bf16_supported(device):
            return "bf16-mixed"
        major, _ = torch.cuda.get_device_capability(device)
        return "16-mixed" if major >= 7 else "32-true"
    if device.type == "cpu" and cpu_has_native_bf16():
        return "bf16-mixed"
    return "32-true"


def use_instead(device: torch.device) -> str:
    """The mode to suggest instead of one ``device`` refuses, with its flag: the one
    ``auto`` picks here (:func:`auto_mode`), and why where that is 32-true on a CPU
    (``--precision 32-true (what auto picks here: no native bf16 on this cpu)``)."""
    fastest = auto_mode(device)
    why = f": no native bf16 on this {device.type}" \
        if fastest == "32-true" and device.type == "cpu" else ""
    return f"{flag('precision')} {fastest} (what auto picks here{why})"


def fp8_unsupported_reason(name: str, device: torch.device) -> str | None:
    """Why ``--precision <name>`` (fp8 or fp8-rowwise) cannot run natively on an fp8 GPU
    (one line naming the flag), or None. Only a missing torchao stops it there: on every
    other device the format is emulated (:mod:`amptrain.precision.lowbit`): no torchao."""
    if fp8_native(device) and not torchao_available():
        return (f"{flag('precision')} {name} needs the torchao package for float8 training on "
                f"this GPU: pip install torchao (or pip install 'amptrain[fp8]'), or use "
                f"{use_instead(device)}")
    return None


def unsupported_reason(spec: ModeSpec, device: torch.device) -> str | None:
    """Why ``spec`` cannot run on ``device`` (a message naming the option), or None."""
    fp8_reason = fp8_unsupported_reason(spec.name, device) if spec.float8_linears else None
    if fp8_reason:
        return fp8_reason
    uses_bf16 = _BF16 in (spec.param_dtype, spec.compute_dtype)
    precision = flag("precision")
    if device.type == "cuda" and uses_bf16 and not cuda_bf16_supported(device):
        cc = "%d.%d" % torch.cuda.get_device_capability(device)
        return (f"{precision} {spec.name} needs a GPU with bf16 (compute capability 8.0+); "
                f"{torch.cuda.get_device_name(device)} has {cc}: use {use_instead(device)}")
    if device.type not in ("cpu", "cuda") and spec.compute_dtype is not None:
        return f"{precision} {spec.name} is not supported on {device.type}; use 32-true"
    return None


def support_table(device: torch.device, flags: dict[str, bool | None] | None = None
                  ) -> dict[str, Any]:
    """Everything ``env`` reports about precisions on ``device``, in one dict."""
    features = device_features(device, flags)
    return {"features": features, "needs": precision_needs(device),
            "supported": supported_precisions(features),
            "emulated": emulated_precisions(device, features),
            "emulated_fast": emulated_fast(device, features),
            "recommended_precision": auto_mode(device)}
