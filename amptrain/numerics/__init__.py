"""Precision numerics in a run: sampled per-layer telemetry (``--numerics``) and the first
non-finite value traced to its module (docs/numerics.md)."""
from __future__ import annotations

from .session import NumericsSession
from .stats import WHATIF, run_formats, tensor_stats
from .trace import NonFiniteTrace, first_nonfinite

__all__ = ["NonFiniteTrace", "NumericsSession", "WHATIF", "first_nonfinite", "run_formats",
           "tensor_stats"]
