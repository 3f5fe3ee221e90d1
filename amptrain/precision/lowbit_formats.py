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
  smallest subnormal 2^-16): the values of torch's own casts (round to nearest even) of
  the value clamped to the format's range (torchao's ``to_fp8_saturated``: torch 2.13
  turns e5m2 overflow into inf); NaN stays NaN, inf saturates. Computed by fp32
  arithmetic (``round_magnitude_``), bit for bit the casts and several times faster.
* **tensorwise scale** (torchao's default recipe): ``s = fmax / max(amax, 1e-12)``,
  computed in fp64 and rounded to fp32; quantised ``q = sat(x * s)``, dequantised ``q / s``.
* **rowwise scale** (torchao's ``rowwise`` recipe): the same per row along one axis, the
  scale rounded down to a power of two.
* **MX** (MXFP8: e4m3 elements; MXFP4: e2m1 elements): blocks of 32 along the reduction
  axis share an e8m0 scale ``X = 2^(floor(log2 amax) - emax_elem)`` (emax 8 for e4m3, 2
  for e2m1; the OCP spec's FLOOR rule, torchao's ``to_mx`` default), its exponent clamped
  to e8m0's [-127, 127]; a block whose amax is NaN gets the NaN scale (every value NaN).
  Elements ``sat(x / X)``, dequantised ``q * X``.
* **e2m1** (fp4: 0, 0.5, 1, 1.5, 2, 3, 4, 6): no torch dtype computes it; rounded by the
  same arithmetic: the spacing is 0.5 below 2, 1 below 4 and 2 above, fp32's own
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


#: Each format's mantissa bits and smallest normal exponent (below it: subnormals, with
#: that binade's spacing).
_MANTISSA_BITS = {"e4m3": 3, "e5m2": 2, "e2m1": 1}
_MIN_EXPONENT = {"e4m3": -6, "e5m2": -14, "e2m1": 0}
_EXPONENT_MASK = 0x7F800000


def round_magnitude_(mag: torch.Tensor, elem: str) -> torch.Tensor:
    """``mag`` (fp32, non-negative or NaN) rounded in place to the element format
    ``elem``, ties to even, saturated at its largest value; returns ``mag``.

    The format's spacing at ``mag`` is ``2^(max(e, emin) - mantissa_bits)`` for ``mag``'s
    fp32 exponent ``e``: adding and subtracting ``1.5 * 2^23`` times the spacing makes
    fp32's own round-to-nearest-even drop exactly the bits below it. The magic number is
    built from ``mag``'s exponent bits (integer ops: one cheap pass each; torch's float8
    casts, ``log2``/``exp2`` and ``torch.where`` are many times slower on the CPU)."""
    mag.clamp_(max=FORMAT_MAX[elem])
    magic = (mag.view(torch.int32) & _EXPONENT_MASK)
    magic.clamp_(min=(_MIN_EXPONENT[elem] + 127) << 23)
    magic.add_(((23 - _MANTISSA_BITS[elem]) << 23) | 0x400000)   # x 2^(23-m) x 1.5
    return mag.add_(magic.view(torch.float32)).sub_(magic.view(torch.float32))


def round_fp8(x: torch.Tensor, elem: str) -> torch.Tensor:
    """``x`` (fp32) rounded to e4m3 or e5m2, saturated at the format's largest value
    (inf too, as torchao's ``to_fp8_saturated``); NaN stays NaN. Bit for bit torch's own
    float8 cast of the clamped value."""
    return round_magnitude_(x.abs(), elem).copysign_(x)


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """``x`` (fp32) rounded to fp4 e2m1, ties to even, saturated at 6 (NaN stays NaN)."""
    return round_magnitude_(x.abs(), "e2m1").copysign_(x)


def _qdq(x: torch.Tensor, mag: torch.Tensor, scale: torch.Tensor, elem: str) -> torch.Tensor:
    """``x`` (with ``mag = |x|``, a temporary) times ``scale`` rounded to ``elem`` and
    divided by ``scale`` again. ``|x| * scale`` is ``|x * scale|`` exactly (rounding is
    symmetric in the sign), so rounding magnitudes and restoring the sign after is bit for
    bit the same as rounding ``x * scale``; the scales are positive (or NaN)."""
    return round_magnitude_(mag.mul_(scale), elem).copysign_(x).div_(scale)


# ------------------------------------------------------------ tensorwise / rowwise
def amax_to_scale(amax: torch.Tensor, elem: str, power_of_2: bool = False) -> torch.Tensor:
    """torchao's fp8 scale: ``fmax / max(amax, 1e-12)`` in fp64, as fp32; optionally
    rounded down to a power of two (the rowwise recipe)."""
    scale = (FORMAT_MAX[elem] / amax.double().clamp(min=AMAX_EPS)).float()
    return torch.exp2(torch.floor(torch.log2(scale))) if power_of_2 else scale


def qdq_tensorwise(x: torch.Tensor, elem: str) -> torch.Tensor:
    """fp8 with one dynamic scale for the whole tensor (torchao's default recipe)."""
    x = x.float()
    mag = x.abs()
    return _qdq(x, mag, amax_to_scale(mag.amax(), elem), elem)


def qdq_rowwise(x: torch.Tensor, elem: str, dim: int) -> torch.Tensor:
    """fp8 with one power-of-two scale per slice along ``dim`` (``-1``: one per row)."""
    x = x.float()
    mag = x.abs()
    scale = amax_to_scale(mag.amax(dim=dim, keepdim=True), elem, power_of_2=True)
    return _qdq(x, mag, scale, elem)


# ----------------------------------------------------------------------- blocks
def _blocks(x: torch.Tensor, dim: int, block: int) -> tuple[torch.Tensor, Callable]:
    """``x`` as rows of ``block`` values along ``dim`` (zero-padded to a whole block:
    zeros change neither a block's amax nor a product), and how to undo it."""
    # One pass to fp32 and to a contiguous layout (none for a contiguous fp32 row-major x).
    moved = x.movedim(dim, -1).to(torch.float32, memory_format=torch.contiguous_format)
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
    value = torch.exp2(exponent.float())       # code 128: 2^128 overflows to inf
    return value.add_(value * 0.0)             # + 0, or inf + NaN (cheaper than where)


def qdq_mx(x: torch.Tensor, elem: str, dim: int = -1, block: int = MX_BLOCK) -> torch.Tensor:
    """MX (MXFP8 ``e4m3``, MXFP4 ``e2m1``): blocks of ``block`` values along ``dim`` share
    a power-of-two e8m0 scale."""
    rows, restore = _blocks(x, dim, block)
    mag = rows.abs()
    scale = e8m0_value(e8m0_exponent(mag.amax(dim=1, keepdim=True), elem))
    mag.div_(scale)
    return restore(round_magnitude_(mag, elem).copysign_(rows).mul_(scale))


def _pairwise_amax(rows: torch.Tensor) -> torch.Tensor:
    """Each row's largest value (NaN where the row holds one), by halving: torch's
    ``amax`` over rows of 16 runs 2.5x slower than this (and than over rows of 32)."""
    if rows.shape[1] & (rows.shape[1] - 1):   # not a power of two: no halving
        return rows.amax(dim=1, keepdim=True)
    while rows.shape[1] > 1:
        half = rows.shape[1] // 2
        rows = torch.maximum(rows[:, :half], rows[:, half:])
    return rows


def nvfp4_tensor_scale(amax: torch.Tensor) -> torch.Tensor:
    """NVFP4's fp32 per-tensor scale: ``amax / (448 * 6)`` (amax floored at 1e-12 so an
    all-zero tensor still has a finite scale)."""
    return amax.float().clamp(min=AMAX_EPS) / (E4M3_MAX * E2M1_MAX)


def nvfp4_block_scales(block_amax: torch.Tensor, tensor_scale: torch.Tensor) -> torch.Tensor:
    """Each block's e4m3 scale relative to the tensor scale, as fp32."""
    scaled = (block_amax / E2M1_MAX / tensor_scale).clamp_(E4M3_TINY, E4M3_MAX)
    return round_magnitude_(scaled, "e4m3")    # the e4m3 cast's values, without its cost


def qdq_nvfp4(x: torch.Tensor, dim: int = -1, block: int = NVFP4_BLOCK) -> torch.Tensor:
    """NVFP4: e2m1 values, an e4m3 scale per ``block`` values along ``dim`` and an fp32
    scale per tensor (torchao's two-level ``nvfp4_quantize``)."""
    rows, restore = _blocks(x, dim, block)
    mag = rows.abs()
    block_amax = _pairwise_amax(mag)
    tensor_scale = nvfp4_tensor_scale(block_amax.amax())   # the max of the blocks' maxima
    block_scale = nvfp4_block_scales(block_amax, tensor_scale)
    mag.mul_((1.0 / tensor_scale) / block_scale)
    values = round_magnitude_(mag, "e2m1").copysign_(rows)
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
