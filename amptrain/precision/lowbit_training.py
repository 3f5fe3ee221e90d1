"""The two parts of NVIDIA's NVFP4 training recipe that are not number formats: the
random Hadamard transform of the weight-gradient GEMM's inputs, and the seeds of the
gradients' stochastic rounding (NVIDIA's NVFP4 pretraining paper, Transformer Engine's
``NVFP4BlockScaling``, torchao's NVFP4 training).

**Random Hadamard transform (RHT).** The weight gradient ``G^T X`` reduces over the
tokens. Multiplying both operands, in blocks of 16 tokens, by the same orthogonal
matrix ``M = H16 diag(s) / 4`` (``H16`` the Sylvester Hadamard matrix, ``s`` a vector of
random signs) leaves the exact product unchanged (``M^T M = I``) but spreads each
block's outliers over its 16 values before they are quantised to NVFP4's 16-value
blocks. The signs come from a fixed seed (:data:`RHT_SEED`), so every rank and every run
uses the same ``M``, as Transformer Engine's fixed sign mask does.

**Stochastic rounding (SR).** Each Linear's gradient quantisations draw their random bits
from a generator seeded, per call, by the run's seed, the layer and how many times the
layer has quantised gradients so far (:class:`StochasticSeeds`). Nothing is drawn from
torch's global RNG (dropout and data order are unchanged by turning SR on), the draws are
the same in every run on the same kind of device (torch's CPU and CUDA generators are
different algorithms, so a CPU run and a GPU run round differently), and the counters are
in the precision's checkpoint, so a resumed run rounds bit for bit as the uninterrupted
one.
"""
from __future__ import annotations

from typing import Any

import torch

from .lowbit_scratch import scratch

#: The RHT's block: NVFP4's 16-value scale block.
RHT_BLOCK = 16
#: The seed of the RHT's sign vector: fixed, so identical on every rank and run.
RHT_SEED = 0x4E56_4650   # "NVFP"
_MIX = 0x9E37_79B9_7F4A_7C15   # 2^64 / golden ratio: spreads consecutive counters


def hadamard_matrix(size: int = RHT_BLOCK) -> torch.Tensor:
    """The ``size x size`` Sylvester Hadamard matrix (entries +-1), ``size`` a power of 2."""
    matrix = torch.ones(1, 1)
    while matrix.shape[0] < size:
        matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)])
    return matrix


def rht_matrix(size: int = RHT_BLOCK, seed: int = RHT_SEED) -> torch.Tensor:
    """The random Hadamard transform ``H diag(s) / sqrt(size)`` (fp32, orthogonal), with
    the signs ``s`` drawn from a generator seeded by ``seed``."""
    signs = torch.randint(0, 2, (size,), generator=torch.Generator().manual_seed(seed))
    return hadamard_matrix(size) * (signs * 2 - 1).float() / size ** 0.5


_RHT_CACHE: dict[torch.device, torch.Tensor] = {}


def apply_rht(x: torch.Tensor, slot: str | None = None) -> torch.Tensor:
    """``x`` (fp32, tokens x features) with each block of :data:`RHT_BLOCK` consecutive
    tokens multiplied by the RHT matrix; tokens zero-padded to a whole block (zero rows
    add nothing to a product over tokens). Two operands transformed alike keep their
    product over tokens: ``apply_rht(a).T @ apply_rht(b) == a.T @ b`` up to rounding.
    ``slot``: the result in that reused temporary (:mod:`.lowbit_scratch`), for a caller
    that consumes it before its next use of the slot."""
    matrix = _RHT_CACHE.get(x.device)
    if matrix is None:   # the seeded signs folded into the matrix once per device
        matrix = _RHT_CACHE.setdefault(x.device, rht_matrix().to(x.device))
    matrix = matrix.to(x.dtype)
    pad = -x.shape[0] % RHT_BLOCK
    if pad:
        x = torch.nn.functional.pad(x, (0, 0, 0, pad))
    blocks = x.reshape(-1, RHT_BLOCK, x.shape[1])
    out = None if slot is None or (x.requires_grad and torch.is_grad_enabled()) \
        else scratch(slot, blocks.shape, x.dtype, x.device)
    return torch.matmul(matrix, blocks, out=out).reshape(-1, x.shape[1])


class StochasticSeeds:
    """Per-layer generators for stochastic rounding, seeded by (run seed, layer, call).

    The counters are host integers (no device sync) and are what a checkpoint keeps
    (:meth:`state_dict`); the generator of a call is a fresh one seeded from them."""

    def __init__(self, seed: int, layers: list[str]) -> None:
        self.seed = int(seed)
        self.index = {name: i for i, name in enumerate(layers)}
        self.calls: dict[str, int] = {name: 0 for name in layers}

    def generator(self, layer: str, device: torch.device) -> torch.Generator:
        """The next generator of ``layer`` (its call counter advances)."""
        call = self.calls[layer]
        self.calls[layer] = call + 1
        mixed = (self.seed * _MIX + (self.index[layer] + 1) * 1_000_003
                 + call * (_MIX // 3)) % 2 ** 63
        return torch.Generator(device=device).manual_seed(mixed)

    def state_dict(self) -> dict[str, Any]:
        """The seed and each layer's call count."""
        return {"seed": self.seed, "calls": dict(self.calls)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (the counters of a checkpointed run)."""
        self.seed = int(state.get("seed", self.seed))
        calls = state.get("calls") or {}
        self.calls = {name: int(calls.get(name, 0)) for name in self.index}
