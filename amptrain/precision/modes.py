"""The table of precision modes: what each one keeps in which dtype.

Every behavioural difference between modes is data in :data:`MODES`; the rest of the
precision package reads these fields and never branches on a mode's name.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UserError
from . import fp8


@dataclass(frozen=True)
class ModeSpec:
    """How one precision mode stores weights, computes, and protects its gradients."""

    name: str
    param_dtype: torch.dtype            # dtype of the model's own weights
    compute_dtype: torch.dtype | None   # autocast dtype; None runs without autocast
    master_weights: bool                # optimizer updates an fp32 copy (Apex O2)
    loss_scaling: bool                  # dynamic loss scaling (fp16 range protection)
    tf32: bool                          # allow TF32 tensor-core maths for fp32 matmul/conv
    summary: str
    # Adam's eps where the optimizer state itself is fp16: 1e-8 flushes to zero there,
    # and a zero second moment turns the update into m / eps, which overflows.
    min_adam_eps: float | None = None
    # Eligible nn.Linear layers become torchao Float8Linear (fp8 matmuls); see fp8.py.
    float8_linears: bool = False

    @property
    def half_weights(self) -> bool:
        return self.param_dtype != torch.float32


_F32, _F16, _BF16 = torch.float32, torch.float16, torch.bfloat16

MODES: dict[str, ModeSpec] = {spec.name: spec for spec in (
    ModeSpec("32-true", _F32, None, False, False, False, "fp32 weights and maths, TF32 off"),
    ModeSpec("tf32", _F32, None, False, False, True, "fp32 weights, TF32 matmul/conv on CUDA"),
    ModeSpec("16-mixed", _F32, _F16, False, True, False,
             "fp32 weights, fp16 autocast, dynamic loss scaling"),
    ModeSpec("bf16-mixed", _F32, _BF16, False, False, False, "fp32 weights, bf16 autocast"),
    ModeSpec("16-master", _F16, _F16, True, True, False,
             "fp16 model, fp32 master weights in the optimizer, dynamic loss scaling"),
    ModeSpec("bf16-master", _BF16, _BF16, True, False, False,
             "bf16 model, fp32 master weights in the optimizer"),
    ModeSpec("16-true", _F16, _F16, False, True, False,
             "fp16 model and optimizer, dynamic loss scaling", min_adam_eps=1e-4),
    ModeSpec("bf16-true", _BF16, _BF16, False, False, False, "bf16 model and optimizer"),
    ModeSpec("fp8", _F32, _BF16, False, False, False,
             "fp32 weights, torchao float8 Linear layers, bf16 autocast elsewhere",
             float8_linears=True),
)}

#: Lightning's short spellings and common synonyms.
ALIASES = {"32": "32-true", "fp32": "32-true", "16": "16-mixed", "fp16": "16-mixed",
           "bf16": "bf16-mixed", "16-mixed-master": "16-master"}

PRECISION_NAMES = tuple(MODES) + ("auto",)


def canonical_name(name: str) -> str:
    """Map an alias to its mode name, or raise a UserError listing the valid names."""
    name = ALIASES.get(str(name), str(name))
    if name not in MODES and name != "auto":
        raise UserError(f"unknown --precision {name!r}; choose one of "
                        f"{', '.join(PRECISION_NAMES)}")
    return name


def cpu_has_native_bf16() -> bool:
    """True when oneDNN has bf16 kernels on this CPU (AVX512-BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # builds without oneDNN
        return False


def cuda_bf16_supported(device: torch.device) -> bool:
    """bf16 in hardware (compute capability 8.0+), not emulated."""
    major, _ = torch.cuda.get_device_capability(device)
    return major >= 8


def auto_mode(device: torch.device) -> str:
    """The fastest mode that is safe on ``device``: bf16 where native, else fp16 or fp32.

    Never fp8: it pays off only for large Linear layers, and its loss curve has to be
    checked against bf16 for each model (benchmarks/gpu_fp8.py), so it is opt-in.
    """
    if device.type == "cuda":
        if cuda_bf16_supported(device):
            return "bf16-mixed"
        major, _ = torch.cuda.get_device_capability(device)
        return "16-mixed" if major >= 7 else "32-true"
    if device.type == "cpu" and cpu_has_native_bf16():
        return "bf16-mixed"
    return "32-true"


def unsupported_reason(spec: ModeSpec, device: torch.device) -> str | None:
    """Why ``spec`` cannot run on ``device`` (a message naming the flag), or None."""
    if spec.float8_linears:
        return fp8.fp8_unsupported_reason(spec.name, device)
    uses_bf16 = _BF16 in (spec.param_dtype, spec.compute_dtype)
    if device.type == "cuda" and uses_bf16 and not cuda_bf16_supported(device):
        cc = "%d.%d" % torch.cuda.get_device_capability(device)
        return (f"--precision {spec.name} needs a GPU with bf16 (compute capability 8.0+); "
                f"{torch.cuda.get_device_name(device)} has {cc}: use --precision 16-mixed")
    if device.type not in ("cpu", "cuda") and spec.compute_dtype is not None:
        return f"--precision {spec.name} is not supported on {device.type}; use --precision 32-true"
    return None
