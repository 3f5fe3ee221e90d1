"""How one GEMM operand is quantised (:class:`Quantiser`), and what a quantiser loses:
the share of values it flushes to zero or clamps at the format's largest value
(``diagnose``'s report). The number formats themselves: :mod:`.lowbit_formats`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .lowbit_blocks import blocks
from .lowbit_formats import (FORMAT_MAX, FP8_BLOCK, HALF_TOP_STEP, MX_BLOCK, NVFP4_BLOCK,
                             amax_to_scale, e8m0_exponent, e8m0_value,
                             nvfp4_block_scales, nvfp4_tensor_scale, qdq_fp8_blocks, qdq_mx,
                             qdq_nvfp4, qdq_rowwise, qdq_tensorwise)

#: The scalings a :class:`Quantiser` knows; ``none`` leaves the operand in high precision.
SCALINGS = ("tensorwise", "rowwise", "mx", "nvfp4", "blockwise", "none")
#: The MX scale rules (torchao's ``ScaleCalculationMode`` FLOOR and RCEIL).
MX_MODES = ("floor", "rceil")


@dataclass(frozen=True)
class Quantiser:
    """How one GEMM operand is quantised: the scaling (:data:`SCALINGS`) and the element
    format; ``dim`` (at call time) is the axis that scales or blocks run along (the GEMM's
    reduction axis).

    ``square``: 2D blocks of a matrix (NVFP4 16 x 16, fp8 blockwise 128 x 128), the same
    whatever ``dim``; ``mx_mode``: the MX scale rule; ``power_of_2``: a tensorwise scale
    rounded down to a power of two; ``stochastic``: NVFP4 elements rounded
    stochastically (with the generator the call is given)."""

    scaling: str
    elem: str
    square: bool = False
    mx_mode: str = "floor"
    power_of_2: bool = False
    stochastic: bool = False

    def __post_init__(self) -> None:
        if self.scaling not in SCALINGS or self.mx_mode not in MX_MODES:
            raise ValueError(f"unknown quantiser {self.scaling}/{self.mx_mode}")

    def __call__(self, x: torch.Tensor, dim: int = -1,
                 generator: torch.Generator | None = None, overwrite: bool = False,
                 into: str | None = None) -> torch.Tensor:
        """``x`` quantised and dequantised (fp32), scaled along ``dim``. For a caller that
        consumes the result at once (the emulated GEMMs: several-MB temporaries whose new
        pages cost more than their arithmetic), the block scalings may put it in ``x``'s
        storage (``overwrite``: the caller gives ``x`` up) or in the reused temporary
        named ``into`` (:mod:`.lowbit_scratch`); the others make a new tensor."""
        if self.scaling == "none" or x.numel() == 0:   # nothing to scale in an empty one
            return x.float()
        if self.scaling == "tensorwise":
            return qdq_tensorwise(x, self.elem, self.power_of_2)
        if self.scaling == "rowwise":
            return qdq_rowwise(x, self.elem, dim)
        if self.scaling == "mx":
            return qdq_mx(x, self.elem, dim, mode=self.mx_mode, overwrite=overwrite,
                          into=into)
        if self.scaling == "blockwise":
            return qdq_fp8_blocks(x, dim, square=self.square)
        return qdq_nvfp4(x, dim, square=self.square, generator=generator,
                         stochastic=self.stochastic, overwrite=overwrite, into=into)

    @property
    def block(self) -> int:
        """The block length of a block scaling (its side, for square blocks)."""
        return {"mx": MX_BLOCK, "nvfp4": NVFP4_BLOCK, "blockwise": FP8_BLOCK}.get(
            self.scaling, 0)

    @property
    def label(self) -> str:
        """``e2m1 nvfp4 16x16 stochastic``: the format, its scaling and its options."""
        extras = [f"{self.block}x{self.block}"] if self.square else []
        extras += [self.mx_mode] if self.scaling == "mx" and self.mx_mode != "floor" else []
        extras += ["stochastic"] if self.stochastic else []
        return " ".join([self.elem, self.scaling, *extras])


def loss_counts(x: torch.Tensor, quantiser: Quantiser, dim: int = -1) -> torch.Tensor:
    """``[non-zero finite values, flushed to zero, saturated]`` of ``x`` under
    ``quantiser``, as an fp32 tensor on ``x``'s device (no host sync: ``diagnose`` sums
    them over steps and reads them once). Stochastic rounding is counted as rounding to
    nearest (its flushes are random; what is flushed for certain is what is below half
    the smallest value)."""
    return quantise_counted(x, quantiser, dim)[1]


def quantise_counted(x: torch.Tensor, quantiser: Quantiser, dim: int = -1
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` quantised and dequantised by ``quantiser`` rounding to nearest, and its
    :func:`loss_counts` -- one quantisation for both (the telemetry wants the values for
    its SNR too)."""
    x = x.detach().float()
    finite = torch.isfinite(x) & (x != 0)
    if quantiser.scaling == "none" or x.numel() == 0:
        zero = finite.sum() * 0
        return x, torch.stack([finite.sum(), zero, zero]).float()
    nearest = Quantiser(quantiser.scaling, quantiser.elem, quantiser.square,
                        quantiser.mx_mode, quantiser.power_of_2)
    q = nearest(x, dim)
    flushed = finite & (q == 0)
    # Clamped, not rounded: beyond the largest value plus half the top binade's spacing,
    # in the units of each value's own scale.
    top = FORMAT_MAX[quantiser.elem] + HALF_TOP_STEP[quantiser.elem]
    saturated = finite & (x.abs() > top * dequant_scale(x, quantiser, dim))
    return q, torch.stack([finite.sum(), flushed.sum(), saturated.sum()]).float()


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
        pow2 = rowwise or quantiser.power_of_2
        return torch.ones_like(x) / amax_to_scale(amax, quantiser.elem, power_of_2=pow2)
    rows, restore, dims = blocks(x, dim, quantiser.block, quantiser.square)
    amax = rows.abs().amax(dim=dims, keepdim=True)
    if quantiser.scaling == "mx":
        scale = e8m0_value(e8m0_exponent(amax, quantiser.elem, quantiser.mx_mode))
    elif quantiser.scaling == "blockwise":
        scale = 1.0 / amax_to_scale(amax, "e4m3")
    else:
        tensor_scale = nvfp4_tensor_scale(rows.abs().amax())
        scale = tensor_scale * nvfp4_block_scales(amax, tensor_scale)
    return restore(scale.expand_as(rows))
