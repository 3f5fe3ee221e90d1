"""The low-bit number formats of fp8 and Blackwell training, as quantise-dequantise functions.

Each function takes a float tensor and returns, in fp32, exactly the values that the
format's hardware would compute with: the tensor scaled, rounded to the element format
(round to nearest, ties to even), saturated at the format's largest finite value, and
scaled back. Nothing here needs a GPU or torchao; :mod:`.lowbit` builds the emulated
matmuls from these functions and ``diagnose`` counts what they saturate or flush.

The formats and their scales (the rules torchao 0.18 and the OCP Microscaling spec v1.0
give; tests/precision/test_lowbit_formats.py checks each against an explicit reference
computation and against torchao where torchao runs on the CPU):

* **fp8 e4m3** (largest 448, smallest subnormal 2^-9, no inf) and **e5m2** (largest 57344,
  smallest subnormal 2^-16): torch's own casts, which round to nearest even. torch 2.13
  saturates e4m3fn casts but turns e5m2 overflow into inf, so values are clamped to the
  format's range first (torchao's ``to_fp8_saturated``); NaN stays NaN, inf saturates.
* **tensorwise scale** (torchao's default recipe): ``s = fmax / max(amax, 1e-12)``,
  computed in fp64 and rounded to fp32; quantised ``q = sat(x * s)``, dequantised ``q / s``.
* **rowwise scale** (torchao's ``rowwise`` recipe): the same per row along one axis, the
  scale rounded down to a power of two.
* **MX** (MXFP8: e4m3 elements; MXFP4: e2m1 elements): blocks of 32 along the reduction
  axis share an e8m0 scale ``X = 2^(floor(log2 amax) - emax_elem)`` (emax 8 for e4m3, 2
  for e2m1; the OCP spec's FLOOR rule, torchao's ``to_mx`` default), its exponent clamped
  to e8m0's [-127, 127]; a block whose amax is NaN gets the NaN scale (every value NaN).
  Elements ``sat(x / X)``, dequantised ``q * X``.
* **e2m1** (fp4: 0, 0.5, 1, 1.5, 2, 3, 4, 6): no torch dtype computes it, so it is rounded
  by arithmetic: the spacing is 0.5 below 2, 1 below 4 and 2 above, fp32's own
  round-to-nearest-even drops the bits below it, and values beyond 6 saturate. NaN stays
  NaN.
* **NVFP4**: e2m1 elements in blocks of 16 with an e4m3 block scale, under an fp32
  per-tensor scale ``amax / (448 * 6)``: the block scale ``amax_block / 6`` divided by the
  tensor scale, clamped to [2^-6, 448] and rounded to e4m3; elements
  ``sat(x / (tensor_scale * block_scale))``, dequantised by the same product.

``flushed_and_saturated`` counts, for any of them, the share of non-zero values that
become zero and the share that are clamped at the format's largest value.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
E2M1_MAX = 6.0
#: torchao's floor on amax before a tensorwise/rowwise scale is computed.
AMAX_EPS = 1e-12
MX_BLOCK = 32
NVFP4_BLOCK = 16
#: e8m0 scale exponents: 2^-127 .. 2^127; the all-ones code (255) is NaN.
E8M0_BIAS = 127
#: The largest power of two of each element format (the MX FLOOR rule's emax).
EMAX = {"e4m3": 8, "e5m2": 15, "e2m1": 2}
FORMAT_MAX = {"e4m3": E4M3_MAX, "e5m2": E5M2_MAX, "e2m1": E2M1_MAX}
#: Half the spacing of each format's top binade: values beyond max + this are clamped.
HALF_TOP_STEP = {"e4m3": 16.0, "e5m2": 4096.0, "e2m1": 1.0}
#: NVFP4 block scales are clamped below at e4m3's smallest normal (torchao's E4M3_EPS).
E4M3_TINY = 2.0 ** -6


#: Every e4m3 code's value, for the way back to fp32 (torch 2.13's e4m3fn -> fp32 cast
#: runs a scalar loop on the CPU, 50x slower than this gather).
_E4M3_VALUES = torch.arange(256, dtype=torch.uint8).view(E4M3).float()


def round_fp8(x: torch.Tensor, elem: str) -> torch.Tensor:
    """``x`` (fp32) rounded to e4m3 or e5m2, saturated at the format's largest value."""
    if elem == "e4m3":  # torch's e4m3fn cast saturates finite values and inf itself
        codes = x.to(E4M3).view(torch.uint8).long()
        return torch.take(_E4M3_VALUES.to(x.device), codes)
    return x.clamp(-E5M2_MAX, E5M2_MAX).to(E5M2).float()


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """``x`` (fp32) rounded to fp4 e2m1, ties to even, saturated at 6 (NaN stays NaN).

    e2m1's spacing at ``|x|`` is ``2^(max(e, 0) - 1)`` for ``e = floor(log2 |x|)``: adding
    and subtracting ``1.5 * 2^23`` times the spacing makes fp32's own round-to-nearest-even
    drop exactly the bits below it (no ``torch.where``: it is slow on the CPU). A value a
    hair from a power of two whose log2 rounds across it gets the neighbouring spacing,
    which rounds it to that same power of two."""
    mag = x.abs().clamp_(max=E2M1_MAX)
    magic = torch.log2(mag).floor_().clamp_(0.0, 2.0).exp2_().mul_(1.5 * 2.0 ** 22)
    return (mag + magic).sub_(magic).copysign_(x)


def round_elements(x: torch.Tensor, elem: str) -> torch.Tensor:
    """``x`` (already scaled, fp32) rounded to the element format ``elem``."""
    return round_e2m1(x) if elem == "e2m1" else round_fp8(x, elem)


# ------------------------------------------------------------ tensorwise / rowwise
def amax_to_scale(amax: torch.Tensor, elem: str, power_of_2: bool = False) -> torch.Tensor:
    """torchao's fp8 scale: ``fmax / max(amax, 1e-12)`` in fp64, as fp32; optionally
    rounded down to a power of two (the rowwise recipe)."""
    scale = (FORMAT_MAX[elem] / amax.double().clamp(min=AMAX_EPS)).float()
    return torch.exp2(torch.floor(torch.log2(scale))) if power_of_2 else scale


def qdq_tensorwise(x: torch.Tensor, elem: str) -> torch.Tensor:
    """fp8 with one dynamic scale for the whole tensor (torchao's default recipe)."""
    x = x.float()
    scale = amax_to_scale(x.abs().amax(), elem)
    return round_fp8(x * scale, elem).div_(scale)


def qdq_rowwise(x: torch.Tensor, elem: str, dim: int) -> torch.Tensor:
    """fp8 with one power-of-two scale per slice along ``dim`` (``-1``: one per row)."""
    x = x.float()
    scale = amax_to_scale(x.abs().amax(dim=dim, keepdim=True), elem, power_of_2=True)
    return round_fp8(x * scale, elem).div_(scale)


# ----------------------------------------------------------------------- blocks
def _blocks(x: torch.Tensor, dim: int, block: int) -> tuple[torch.Tensor, Callable]:
    """``x`` as rows of ``block`` values along ``dim`` (zero-padded to a whole block:
    zeros change neither a block's amax nor a product), and how to undo it."""
    moved = x.float().movedim(dim, -1)
    length = moved.shape[-1]
    pad = -length % block
    if pad:
        moved = torch.nn.functional.pad(moved, (0, pad))
    shape = moved.shape
    rows = moved.reshape(-1, block)

    def restore(values: torch.Tensor) -> torch.Tensor:
        out = values.reshape(shape)
        if pad:
            out = out[..., :length]
        return out.movedim(-1, dim)
    return rows, restore


def e8m0_exponent(amax: torch.Tensor, elem: str) -> torch.Tensor:
    """The unbiased e8m0 exponent of each block's MX scale (OCP FLOOR rule), as int32:
    ``floor(log2 amax) - emax`` read from amax's fp32 exponent bits, clamped to
    [-127, 127]; 128 marks a NaN amax (the NaN scale)."""
    bits = amax.float().contiguous().view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - E8M0_BIAS - EMAX[elem]
    exponent = exponent.clamp_(-E8M0_BIAS, E8M0_BIAS)
    return torch.where(torch.isnan(amax), E8M0_BIAS + 1, exponent)


def e8m0_value(exponent: torch.Tensor) -> torch.Tensor:
    """2^exponent in fp32 (2^-127 is an fp32 subnormal, exactly), NaN for code 128."""
    value = torch.exp2(exponent.float())
    return torch.where(exponent > E8M0_BIAS, torch.nan, value)


def qdq_mx(x: torch.Tensor, elem: str, dim: int = -1, block: int = MX_BLOCK) -> torch.Tensor:
    """MX (MXFP8 ``e4m3``, MXFP4 ``e2m1``): blocks of ``block`` values along ``dim`` share
    a power-of-two e8m0 scale."""
    rows, restore = _blocks(x, dim, block)
    scale = e8m0_value(e8m0_exponent(rows.abs().amax(dim=1, keepdim=True), elem))
    return restore(round_elements(rows / scale, elem).mul_(scale))


def nvfp4_tensor_scale(amax: torch.Tensor) -> torch.Tensor:
    """NVFP4's fp32 per-tensor scale: ``amax / (448 * 6)`` (amax floored at 1e-12 so an
    all-zero tensor still has a finite scale)."""
    return amax.float().clamp(min=AMAX_EPS) / (E4M3_MAX * E2M1_MAX)


def nvfp4_block_scales(block_amax: torch.Tensor, tensor_scale: torch.Tensor) -> torch.Tensor:
    """Each block's e4m3 scale relative to the tensor scale, as fp32."""
    scaled = (block_amax / E2M1_MAX / tensor_scale).clamp_(E4M3_TINY, E4M3_MAX)
    return scaled.to(E4M3).float()


def qdq_nvfp4(x: torch.Tensor, dim: int = -1, block: int = NVFP4_BLOCK) -> torch.Tensor:
    """NVFP4: e2m1 values, an e4m3 scale per ``block`` values along ``dim`` and an fp32
    scale per tensor (torchao's two-level ``nvfp4_quantize``)."""
    rows, restore = _blocks(x, dim, block)
    magnitude = rows.abs()
    tensor_scale = nvfp4_tensor_scale(magnitude.amax())
    block_scale = nvfp4_block_scales(magnitude.amax(dim=1, keepdim=True), tensor_scale)
    reciprocal = (1.0 / tensor_scale) / block_scale
    values = round_e2m1((rows * reciprocal).clamp_(-E2M1_MAX, E2M1_MAX))
    return restore(values.mul_(tensor_scale * block_scale))


# -------------------------------------------------------------- one operand's rule
@dataclass(frozen=True)
class Quantiser:
    """How one GEMM operand is quantised: the scaling (``tensorwise``, ``rowwise``,
    ``mx``, ``nvfp4``) and the element format; ``dim`` is the axis that scales or blocks
    run along (the GEMM's reduction axis)."""

    scaling: str
    elem: str

    def __call__(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.scaling == "tensorwise":
            return qdq_tensorwise(x, self.elem)
        if self.scaling == "rowwise":
            return qdq_rowwise(x, self.elem, dim)
        if self.scaling == "mx":
            return qdq_mx(x, self.elem, dim)
        return qdq_nvfp4(x, dim)

    @property
    def label(self) -> str:
        return f"{self.elem} {self.scaling}"


def loss_counts(x: torch.Tensor, quantiser: Quantiser, dim: int = -1) -> torch.Tensor:
    """``[non-zero finite values, flushed to zero, saturated]`` of ``x`` under
    ``quantiser``, as an fp32 tensor on ``x``'s device (no host sync: ``diagnose`` sums
    them over steps and reads them once)."""
    x = x.detach().float()
    finite = torch.isfinite(x) & (x != 0)
    flushed = finite & (quantiser(x, dim) == 0)
    # Clamped, not rounded: beyond the largest value plus half the top binade's spacing,
    # in the units of each value's own scale.
    top = FORMAT_MAX[quantiser.elem] + HALF_TOP_STEP[quantiser.elem]
    saturated = finite & (x.abs() > top * dequant_scale(x, quantiser, dim))
    return torch.stack([finite.sum(), flushed.sum(), saturated.sum()]).float()


def flushed_and_saturated(x: torch.Tensor, quantiser: Quantiser, dim: int = -1
                          ) -> tuple[float, float]:
    """The shares of ``x``'s non-zero finite values that ``quantiser`` flushes to zero
    and that it clamps at the format's largest value (relative to their scale)."""
    count, flushed, saturated = loss_counts(x, quantiser, dim).tolist()
    return (flushed / count, saturated / count) if count else (0.0, 0.0)


def dequant_scale(x: torch.Tensor, quantiser: Quantiser, dim: int = -1) -> torch.Tensor:
    """The factor that turns each of ``x``'s quantised values back into its own units
    (``1 / s`` for fp8 scales, the e8m0 block scale for MX, tensor x block scale for
    NVFP4), broadcast to ``x``'s shape."""
    x = x.float()
    if quantiser.scaling in ("tensorwise", "rowwise"):
        rowwise = quantiser.scaling == "rowwise"
        amax = x.abs().amax(dim=dim, keepdim=True) if rowwise else x.abs().amax()
        return torch.ones_like(x) / amax_to_scale(amax, quantiser.elem, power_of_2=rowwise)
    block = MX_BLOCK if quantiser.scaling == "mx" else NVFP4_BLOCK
    rows, restore = _blocks(x, dim, block)
    amax = rows.abs().amax(dim=1, keepdim=True)
    if quantiser.scaling == "mx":
        scale = e8m0_value(e8m0_exponent(amax, quantiser.elem))
    else:
        tensor_scale = nvfp4_tensor_scale(rows.abs().amax())
        scale = tensor_scale * nvfp4_block_scales(amax, tensor_scale)
    return restore(scale.expand_as(rows))
