"""precision/lowbit_packed.py: many matrices quantised at once give each matrix exactly
what quantising it alone gives (values and counts)."""
from __future__ import annotations

import pytest
import torch

from amptrain.numerics.stats import WHATIF
from amptrain.precision.lowbit_operand import Quantiser, quantise_counted
from amptrain.precision.lowbit_packed import PackedRows

QUANTISERS = [q for q in WHATIF.values() if isinstance(q, Quantiser)] + [
    Quantiser("tensorwise", "e4m3", power_of_2=True), Quantiser("mx", "e2m1", mx_mode="rceil")]


def _matrices() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(3, 100, generator=g) * 1e3             # rows padded from 100 to 128
    tiny = torch.randn(17, 10, generator=g) * 1e-6            # narrower than one block
    mixed = torch.randn(5, 64, generator=g) * torch.logspace(-12, 6, 64)   # wide range
    sparse = torch.randn(4, 48, generator=g)
    sparse[sparse.abs() < 0.8] = 0.0
    zeros = torch.zeros(2, 32)                                 # nothing to count
    return [wide, tiny, mixed, sparse, zeros, torch.randn(1, 7, generator=g)]


@pytest.mark.parametrize("quantiser", QUANTISERS, ids=lambda q: q.label)
def test_each_matrix_gets_what_it_gets_alone(quantiser):
    matrices = _matrices()
    packed = PackedRows.pack(matrices)
    values, counts = packed.quantise_counted(quantiser)
    at = 0
    for i, m in enumerate(matrices):
        alone, alone_counts = quantise_counted(m, quantiser, -1)
        width = -(-m.shape[1] // 32) * 32
        mine = values[at:at + m.shape[0] * width // 32].reshape(m.shape[0], width)[:, :m.shape[1]]
        at += m.shape[0] * width // 32
        assert torch.equal(mine, alone), (quantiser.label, i)
        assert counts[i].tolist() == alone_counts.tolist(), (quantiser.label, i)
    # the planted cases do show: tiny values flush in e2m1, the wide-range rows lose some
    assert counts[:, 1].sum() > 0


def test_what_it_cannot_pack_is_refused():
    with pytest.raises(ValueError, match="nothing to pack"):
        PackedRows.pack([])
    with pytest.raises(ValueError, match="no e4m3 blockwise"):
        PackedRows.pack([torch.ones(2, 32)]).quantise_counted(Quantiser("blockwise", "e4m3"))
