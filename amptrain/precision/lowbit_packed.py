"""Many small matrices quantised at once: what :func:`.lowbit_operand.quantise_counted`
gives for each matrix, computed in a fixed number of tensor operations for all of them.

The numerics telemetry samples every layer's activation, weight and gradient in up to
eight formats. Quantising each matrix on its own costs a few hundred small operations per
matrix (milliseconds each on a CPU, whatever its size); packed, a sampled step costs about
as much as quantising one matrix. The values and counts are the same as one matrix at a
time (tests/precision/test_lowbit_packed.py checks them against
:func:`~.lowbit_operand.quantise_counted`): the format math is :mod:`.lowbit_formats`'s,
applied to scales that are taken per matrix, per row or per block.

Each matrix's rows are the quantiser's reduction axis (``dim=-1``), zero-padded to whole
blocks of 32, as :func:`.lowbit_formats._blocks` pads them; zeros change no amax, no count
(only non-zero values are counted) and no sum of squares.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from . import lowbit_blocks
from .lowbit_formats import (FORMAT_MAX, HALF_TOP_STEP, MX_BLOCK, NVFP4_BLOCK, _qdq,
                             amax_to_scale, e8m0_exponent, e8m0_value,
                             nvfp4_block_scales, nvfp4_tensor_scale, round_to_format_)
from .lowbit_operand import Quantiser

#: The packed block: MX's, and two of NVFP4's.
PACK = MX_BLOCK


@dataclass
class PackedRows:
    """Matrices packed as ``blocks`` (``[B, 32]``, fp32, finite) with the matrix and the
    row each block came from. Build with :meth:`pack`."""

    blocks: torch.Tensor
    block_matrix: torch.Tensor   # [B] int64: which matrix
    block_row: torch.Tensor      # [B] int64: which row (numbered over all matrices)
    matrices: int
    rows: int

    @classmethod
    def pack(cls, matrices: list[torch.Tensor]) -> PackedRows:
        """Pack 2-D fp32 matrices (finite; rows along the reduction axis)."""
        if not matrices:
            raise ValueError("nothing to pack")
        device = matrices[0].device
        parts, per_row, heights = [], [], []
        for m in matrices:
            pad = -m.shape[1] % PACK
            padded = torch.nn.functional.pad(m, (0, pad)) if pad else m
            parts.append(padded.reshape(-1, PACK))
            per_row.append((m.shape[1] + pad) // PACK)
            heights.append(m.shape[0])
        height = torch.tensor(heights, device=device)
        blocks_per_row = torch.repeat_interleave(torch.tensor(per_row, device=device), height)
        block_row = torch.repeat_interleave(torch.arange(len(blocks_per_row), device=device),
                                            blocks_per_row)
        row_matrix = torch.repeat_interleave(torch.arange(len(matrices), device=device), height)
        return cls(torch.cat(parts).float(), row_matrix[block_row], block_row,
                   len(matrices), len(blocks_per_row))

    # ------------------------------------------------------------ per-group reductions
    def _max(self, values: torch.Tensor, group: torch.Tensor, groups: int) -> torch.Tensor:
        """The largest of ``values`` (non-negative) per group: 0 for an empty group."""
        out = torch.zeros(groups, device=values.device, dtype=values.dtype)
        return out.scatter_reduce_(0, group, values, "amax")

    def per_matrix_sum(self, per_block: torch.Tensor) -> torch.Tensor:
        """Sums of a per-block quantity, per matrix (``[matrices]``)."""
        out = torch.zeros((self.matrices, *per_block.shape[1:]), device=per_block.device,
                          dtype=per_block.dtype)
        return out.index_add_(0, self.block_matrix, per_block)

    # ------------------------------------------------------------ quantisation
    def quantise_counted(self, quantiser: Quantiser) -> tuple[torch.Tensor, torch.Tensor]:
        """The packed values quantised and dequantised (rounded to nearest), and per matrix
        ``[non-zero values, flushed, saturated]`` (``[matrices, 3]``, fp32) -- each
        matrix's as :func:`~.lowbit_operand.quantise_counted` gives it with ``dim=-1``.
        Tensorwise, rowwise, MX and NVFP4 (1-D blocks) scalings."""
        x = self.blocks
        mag = x.abs()
        block_amax = mag.amax(dim=1)
        elem = quantiser.elem
        if quantiser.scaling in ("tensorwise", "rowwise"):
            if quantiser.scaling == "tensorwise":
                amax = self._max(block_amax, self.block_matrix, self.matrices)
                scale = amax_to_scale(amax, elem, quantiser.power_of_2)[self.block_matrix]
            else:
                amax = self._max(block_amax, self.block_row, self.rows)
                scale = amax_to_scale(amax, elem, power_of_2=True)[self.block_row]
            scale = scale.unsqueeze(1)
            q = _qdq(x, mag.clone(), scale, elem)
            unit = 1.0 / scale
        elif quantiser.scaling == "mx":
            unit = e8m0_value(e8m0_exponent(block_amax.unsqueeze(1), elem, quantiser.mx_mode))
            q = round_to_format_(mag / unit, elem).copysign_(x).mul_(unit)
        elif quantiser.scaling == "nvfp4" and not quantiser.square:
            half = x.reshape(-1, NVFP4_BLOCK)
            half_mag = half.abs()
            half_amax = lowbit_blocks.block_amax(half_mag, (1,))
            owner = self.block_matrix.repeat_interleave(PACK // NVFP4_BLOCK)
            tensor_amax = self._max(half_amax.squeeze(1), owner, self.matrices)
            tensor_scale = nvfp4_tensor_scale(tensor_amax)[owner].unsqueeze(1)
            block_scale = nvfp4_block_scales(half_amax, tensor_scale)
            rounded = round_to_format_(half_mag.mul_((1.0 / tensor_scale) / block_scale), elem)
            q = rounded.copysign_(half).mul_(tensor_scale * block_scale).reshape(x.shape)
            unit = (tensor_scale * block_scale).expand(-1, NVFP4_BLOCK).reshape(x.shape)
        else:
            raise ValueError(f"packed quantisation has no {quantiser.label}")
        top = FORMAT_MAX[elem] + HALF_TOP_STEP[elem]
        nonzero = self.nonzero
        return q, self.counts(nonzero, nonzero & (q == 0), nonzero & (mag > top * unit))

    @functools.cached_property
    def nonzero(self) -> torch.Tensor:
        """Where the packed values are not zero (padding and zeros are never counted)."""
        return self.blocks != 0

    def counts(self, *masks: torch.Tensor) -> torch.Tensor:
        """``[matrices, len(masks)]``: how many values each boolean mask holds per matrix
        (each summed over its rows as bytes into int32: a sum of bools, or of floats made
        from them, is several times slower on a CPU)."""
        per_block = torch.stack([m.view(torch.uint8).sum(1, dtype=torch.int32) for m in masks],
                                dim=1)
        return self.per_matrix_sum(per_block.float())


__all__ = ["PACK", "PackedRows"]
