"""The blocks of the block-scaled low-bit formats: a tensor cut into blocks that share
one scale, and each block's largest magnitude.

Blocks of ``block`` values along one axis (MX: 32, NVFP4: 16, fp8-blockwise: 128), or a
matrix's ``block x block`` tiles (the NVFP4 recipe's and fp8-blockwise's weights), are
views of ``x`` in fp32 wherever the layout allows (no transposed copies: a copy costs more
than the whole quantisation), zero-padded to a whole block (zeros change neither a
block's amax nor a product). :mod:`.lowbit_formats` quantises them.
"""
from __future__ import annotations

from typing import Callable

import torch


def blocks(x: torch.Tensor, dim: int, block: int, square: bool = False
           ) -> tuple[torch.Tensor, Callable, tuple[int, ...]]:
    """``x`` as blocks of ``block`` values along ``dim`` (zero-padded to a whole block:
    zeros change neither a block's amax nor a product), how to undo it, and the axes a
    block spans (reduce over them, keeping dims: one scale per block broadcasts back):
    rows ``(n, block)`` for the last axis, ``(n, block, inner)`` for another (axis 1).
    ``square``: ``(tiles_h, block, tiles_w, block)``, the 2D blocks of a matrix (the same
    blocks whichever axis the GEMM reduces over; axes 1 and 3).

    Blocks along an inner axis keep ``x``'s layout: a transposed copy to make the blocks
    rows costs more than the whole quantisation, and torch reduces over a middle axis
    with the inner one vectorised (its reduction over rows of 16 is the slow case)."""
    if square:
        return _squares(x, block)
    dim = dim % x.dim()
    if dim != x.dim() - 1:
        return _inner_blocks(x, dim, block)
    # One pass to fp32 and to a contiguous layout (none for a contiguous fp32 row-major x).
    moved = x.to(torch.float32, memory_format=torch.contiguous_format)
    length = moved.shape[-1]
    pad = -length % block
    if pad:
        moved = torch.nn.functional.pad(moved, (0, pad))
    shape = moved.shape
    rows = moved.reshape(-1, block)

    def restore(values: torch.Tensor) -> torch.Tensor:
        out = values.reshape(shape)
        return out[..., :length] if pad else out
    return rows, restore, (1,)


def _inner_blocks(x: torch.Tensor, dim: int, block: int
                  ) -> tuple[torch.Tensor, Callable, tuple[int, ...]]:
    """Blocks along ``dim``, not the last axis, as ``(n, block, inner)`` in ``x``'s own
    (contiguous fp32) layout, and how to undo it."""
    shape = x.shape
    outer, length = shape[:dim].numel(), shape[dim]
    flat = x.to(torch.float32, memory_format=torch.contiguous_format) \
        .reshape(outer, length, -1)
    pad = -length % block
    if pad:
        flat = torch.nn.functional.pad(flat, (0, 0, 0, pad))
    inner = flat.shape[-1]
    rows = flat.reshape(-1, block, inner)

    def restore(values: torch.Tensor) -> torch.Tensor:
        out = values.reshape(outer, length + pad, inner)
        return (out[:, :length] if pad else out).reshape(shape)
    return rows, restore, (1,)


def _squares(x: torch.Tensor, block: int
             ) -> tuple[torch.Tensor, Callable, tuple[int, ...]]:
    """A matrix's ``block x block`` tiles as ``(tiles_h, block, tiles_w, block)`` (a view of
    the zero-padded fp32 matrix: no transposed copy, a tile's amax is a reduction over
    axes 1 and 3), and how to undo it."""
    if x.dim() != 2:
        raise ValueError(f"2D blocks need a matrix, not a tensor of shape {tuple(x.shape)}")
    height, width = x.shape
    pad_h, pad_w = -height % block, -width % block
    padded = torch.nn.functional.pad(x.float(), (0, pad_w, 0, pad_h)) if pad_h or pad_w \
        else x.to(torch.float32, memory_format=torch.contiguous_format)
    tiles_h, tiles_w = padded.shape[0] // block, padded.shape[1] // block
    rows = padded.view(tiles_h, block, tiles_w, block)

    def restore(values: torch.Tensor) -> torch.Tensor:
        return values.reshape(tiles_h * block, tiles_w * block)[:height, :width]
    return rows, restore, (1, 3)


def block_amax(mag: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """The largest of the magnitudes ``mag`` (non-negative, or NaN with its sign bit clear:
    ``abs``'s) over ``dims``, kept as size-1 axes; NaN where a block holds one.

    Reduced as int32: non-negative floats order as their bit patterns, a NaN's above
    inf's, so the integer maximum is the float one (a NaN's payload may differ). torch's
    float ``amax`` over rows of 16 handles NaN per element and does not vectorise: 2.3 ms
    for 2^20 values against 0.4 ms as int32 (and 1.2 ms for the pairwise halving and
    ``max_pool1d`` used before), AVX2 EPYC, one thread. Where autograd records (a view
    to another dtype has no gradient): the float reduction."""
    if mag.requires_grad and torch.is_grad_enabled():
        return mag.amax(dim=dims, keepdim=True)
    return mag.view(torch.int32).amax(dim=dims, keepdim=True).view(torch.float32)

