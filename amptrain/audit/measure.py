"""Counters of updates lost to rounding: the weights a step (or an EMA update) should have
moved and did not, measured on copies so that nothing the script computes changes."""
from __future__ import annotations

from dataclasses import dataclass

import torch

HALF = (torch.float16, torch.bfloat16)


@dataclass
class Lost:
    """Elements that should have moved (``total``) and how many did not (``lost``)."""

    lost: int = 0
    total: int = 0
    dtype: str = ""

    @property
    def share(self) -> float:
        return self.lost / self.total if self.total else 0.0

    def count(self, moved: torch.Tensor, should: torch.Tensor) -> None:
        """Add the elements where ``should`` is true, and those of them ``moved`` is not."""
        self.total += int(should.sum())
        self.lost += int((should & ~moved).sum())


def is_half(tensor: object) -> bool:
    """Whether ``tensor`` is a floating tensor in fp16 or bf16."""
    return isinstance(tensor, torch.Tensor) and tensor.dtype in HALF


def sampled(count: int, first: int = 5, every: int = 25) -> bool:
    """Whether the ``count``-th event (1-based) is measured: the first few, then every
    ``every``-th (the measurement copies tensors; the audit stays cheap on long runs)."""
    return count <= first or count % every == 0


def share_text(lost: Lost) -> str:
    """``12.5 % (1,234 of 9,876)``."""
    return f"{100 * lost.share:.1f} % ({lost.lost:,} of {lost.total:,})"
