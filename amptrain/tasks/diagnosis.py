"""A task's part that tells ``diagnose`` its losses (:class:`Diagnosis`): each loss's name
and the model parts one loss trains alone."""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType


class Diagnosis:
    """The default: one loss, ``loss``, training the whole model."""

    #: Each loss's name by its ``loss_id`` (``diagnose`` names the loss that overflows).
    loss_names: Mapping[int, str] = MappingProxyType({0: "loss"})

    def loss_paths(self) -> dict[str, str]:
        """Module-name globs of the model parts one of the task's losses trains alone, each
        with what that loss is and what its size follows (diagnose names a gradient
        overflow there by its loss). None by default."""
        return {}


__all__ = ["Diagnosis"]
