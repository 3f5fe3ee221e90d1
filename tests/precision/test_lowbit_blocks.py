"""lowbit_blocks.py: a tensor as blocks sharing a scale, and each block's largest magnitude."""
from __future__ import annotations

import pytest
import torch

from amptrain.precision.lowbit_blocks import block_amax, blocks


def test_block_maxima_as_integers_are_the_float_maxima_and_keep_nan():
    x = torch.randn(6, 16, 32) * torch.exp2(torch.randint(-140, 120, (6, 16, 32)).float())
    x[0, 3, 5], x[1, :, 2] = float("inf"), 0.0
    x[2, 7, 9], x[4, 0, 0] = float("nan"), -float("nan")
    mag = x.abs()
    for dims in ((1,), (2,), (1, 2)):
        ours, theirs = block_amax(mag, dims), mag.amax(dim=dims, keepdim=True)
        assert torch.equal(torch.isnan(ours), torch.isnan(theirs))
        assert torch.equal(ours.nan_to_num(0.0), theirs.nan_to_num(0.0))


@pytest.mark.parametrize("shape,dim,block,square", [
    ((3, 40), -1, 16, False),     # the last axis, padded to a whole block
    ((2, 33, 8), 1, 16, False),   # an inner axis, padded
    ((40, 24), 0, 16, True),      # 16 x 16 tiles of a matrix, padded both ways
    ((64, 32), 0, 16, True),
])
def test_blocks_restore_the_tensor_and_each_block_holds_its_values(shape, dim, block, square):
    x = torch.randn(shape)
    rows, restore, dims = blocks(x, dim, block, square)
    assert torch.equal(restore(rows), x)
    maxima = block_amax(rows.abs(), dims)
    if square:
        h, w = shape
        for i in range(0, h, block):
            for j in range(0, w, block):
                assert maxima[i // block, 0, j // block, 0] == x[i:i + block, j:j + block] \
                    .abs().max()
    elif dim == -1:
        padded = torch.nn.functional.pad(x, (0, -shape[-1] % block))
        expected = padded.reshape(*shape[:-1], -1, block).abs().amax(-1)
        assert torch.equal(maxima.flatten(), expected.flatten())
    else:   # an inner axis: blocks of the middle axis, the last one kept whole
        padded = torch.nn.functional.pad(x, (0, 0, 0, -shape[1] % block))
        expected = padded.reshape(shape[0], -1, block, shape[2]).abs().amax(2)
        assert torch.equal(maxima.flatten(), expected.flatten())
