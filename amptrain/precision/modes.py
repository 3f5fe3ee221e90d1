"""The table of precision modes: what each one keeps in which dtype.

Every behavioural difference between modes is data in :data:`MODES`; the rest of the
precision package reads these fields and never branches on a mode's name. What a device
supports of them is :mod:`amptrain.precision.hardware.support`.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from ..common.choices import MODE_NAMES, PRECISION_ALIASES, check_table


@dataclass(frozen=True, kw_only=True)
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
    # Eligible nn.Linear layers run their matmuls in this low-bit format (a recipe of
    # lowbit.RECIPES): natively where the hardware has it, else emulated; see lowbit.py.
    lowbit: str | None = None
    # Where the GPU has fp8 Tensor Cores they become torchao Float8Linear; see fp8.py.
    float8_linears: bool = False
    # Where the GPU is a Hopper (sm90+) with torchao's blockwise fp8 kernels they run
    # those (DeepSeek-V3's 1x128 / 128x128 tiles); see lowbit.py.
    float8_blocks: bool = False
    # fp32 maths exactly everywhere: TF32 off for cuDNN's convolutions too (PyTorch's own
    # default allows it there); the other fp32 modes keep PyTorch's defaults (tf32.py).
    strict_fp32: bool = False
    # A precision plan (``--precision plan:FILE``): (module, format) pairs, each Linear in
    # its own format; see precision_plan.py. Empty for every mode of MODES.
    layer_formats: tuple[tuple[str, str], ...] = ()

    @property
    def half_weights(self) -> bool:
        return self.param_dtype != torch.float32


_F32, _F16, _BF16 = torch.float32, torch.float16, torch.bfloat16

MODES: dict[str, ModeSpec] = {spec.name: spec for spec in (
    ModeSpec(name="32-true", param_dtype=_F32, compute_dtype=None, master_weights=False,
             loss_scaling=False, tf32=False, strict_fp32=True,
             summary="fp32 weights and maths, TF32 off"),
    ModeSpec(name="tf32", param_dtype=_F32, compute_dtype=None, master_weights=False,
             loss_scaling=False, tf32=True, summary="fp32 weights, TF32 matmul/conv on CUDA"),
    ModeSpec(name="16-mixed", param_dtype=_F32, compute_dtype=_F16, master_weights=False,
             loss_scaling=True, tf32=False,
             summary="fp32 weights, fp16 autocast, dynamic loss scaling"),
    ModeSpec(name="bf16-mixed", param_dtype=_F32, compute_dtype=_BF16, master_weights=False,
             loss_scaling=False, tf32=False, summary="fp32 weights, bf16 autocast"),
    ModeSpec(name="16-master", param_dtype=_F16, compute_dtype=_F16, master_weights=True,
             loss_scaling=True, tf32=False,
             summary="fp16 model, fp32 master weights in the optimizer, dynamic loss scaling"),
    ModeSpec(name="bf16-master", param_dtype=_BF16, compute_dtype=_BF16, master_weights=True,
             loss_scaling=False, tf32=False,
             summary="bf16 model, fp32 master weights in the optimizer"),
    ModeSpec(name="16-true", param_dtype=_F16, compute_dtype=_F16, master_weights=False,
             loss_scaling=True, tf32=False,
             summary="fp16 model and optimizer, dynamic loss scaling", min_adam_eps=1e-4),
    ModeSpec(name="bf16-true", param_dtype=_BF16, compute_dtype=_BF16, master_weights=False,
             loss_scaling=False, tf32=False, summary="bf16 model and optimizer"),
    ModeSpec(name="fp8", param_dtype=_F32, compute_dtype=_BF16, master_weights=False,
             loss_scaling=False, tf32=False,
             summary="fp32 weights, fp8 Linear matmuls (tensorwise scales), bf16 elsewhere",
             lowbit="fp8", float8_linears=True),
    ModeSpec(name="fp8-rowwise", param_dtype=_F32, compute_dtype=_BF16, master_weights=False,
             loss_scaling=False, tf32=False,
             summary="fp32 weights, fp8 Linear matmuls (rowwise scales), bf16 elsewhere",
             lowbit="fp8-rowwise", float8_linears=True),
    ModeSpec(name="fp8-rowwise-gw-hp", param_dtype=_F32, compute_dtype=_BF16,
             master_weights=False, loss_scaling=False, tf32=False,
             summary="fp32 weights, fp8 rowwise Linear matmuls with the weight-gradient "
                     "GEMM in high precision (torchao ROWWISE_WITH_GW_HP), bf16 elsewhere",
             lowbit="fp8-rowwise-gw-hp", float8_linears=True),
    ModeSpec(name="fp8-blockwise", param_dtype=_F32, compute_dtype=_BF16,
             master_weights=False, loss_scaling=False, tf32=False,
             summary="fp32 weights, fp8 Linear matmuls in DeepSeek-V3's 1x128 / 128x128 "
                     "blocks, bf16 elsewhere", lowbit="fp8-blockwise", float8_blocks=True),
    *(ModeSpec(name=name, param_dtype=_F32, compute_dtype=_BF16, master_weights=False,
               loss_scaling=False, tf32=False, lowbit=name,
               summary=f"fp32 weights, {label} Linear matmuls, bf16 elsewhere")
      for name, label in (("mxfp8", "MXFP8 (e4m3, e8m0 scale per 32)"),
                          ("mxfp4", "MXFP4 (e2m1, e8m0 scale per 32)"),
                          ("nvfp4", "NVFP4 training recipe (16x16 weight blocks, "
                                    "stochastic rounding, Hadamard transform)"),
                          ("nvfp4-plain", "NVFP4 (e2m1, e4m3 scale per 16, round to "
                                          "nearest)"))),
)}

# The names live in amptrain.common.choices (torch-free, for the CLI parser); this table must
# give each of them a spec.
check_table("precision modes", MODES, MODE_NAMES)


def as_given(names: Iterable[str]) -> dict[str, str]:
    """Mode -> the alias the user wrote for it (only where they differ), so outputs can show
    the Keras, Lightning or Apex name beside amptrain's (``16-mixed (mixed_float16)``,
    ``16-master (O2)``)."""
    given: dict[str, str] = {}
    for name in names:
        name = str(name).strip()
        if PRECISION_ALIASES.get(name, name) != name:
            given.setdefault(PRECISION_ALIASES[name], name)
    return given


def label(name: str, given: str | Mapping[str, str] | None = None,
          shown: str | None = None) -> str:
    """``name`` (or ``shown``, the name a table gives it), with the user's spelling beside
    it when that was an alias."""
    alias = as_given([given]).get(name) if isinstance(given, str) else (given or {}).get(name)
    return f"{shown or name} ({alias})" if alias else shown or name
