"""A task's part that declares the keys it logs and shows (:class:`LogKeys`): trainer/ and
the loggers name no task's metric."""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType


class LogKeys:
    """The default: no fields of its own beside the losses, the LR and the metrics."""

    #: Fields of its training records the console line shows beside the losses, the
    #: learning rate and the validation metrics (PPO's ``episode_return``).
    shown_fields: tuple[str, ...] = ()
    #: Speed fields its records carry (:meth:`throughput`) and their units on the console
    #: (an LM's ``{"tokens_per_s": "tokens/s"}``); a run's result keeps their medians.
    speed_units: Mapping[str, str] = MappingProxyType({})

    def throughput(self, samples_per_s: float | None) -> dict[str, float]:
        """The speed fields of a training record (an LM's ``tokens_per_s``)."""
        return {}


__all__ = ["LogKeys"]
