"""A task's part that checks a run's data and model before training (:class:`DataChecks`):
which data it trains on, data it cannot learn from, outputs that do not fit the targets."""
from __future__ import annotations

from typing import Any

import torch


class DataChecks:
    """The default checks take any data and any outputs the task's loss accepts."""

    #: The data kinds (``DataBundle.task``) the task trains on; empty: its own name.
    kinds: tuple[str, ...] = ()

    def fits(self, kind: str, name: str) -> bool:
        """Whether task ``name`` trains on data that says it is for task ``kind`` (a run's
        ``--task`` is checked against its ``--data`` with it)."""
        return kind in (self.kinds or (name,))

    def check_data(self, data: Any, keyword: str) -> None:  # noqa: B027  (optional hook)
        """Refuse data this task cannot train on (once, at set-up), naming ``keyword``."""

    def check_outputs(self, outputs: torch.Tensor | None, targets: Any, *,  # noqa: B027
                      model_name: str | None, all_targets: torch.Tensor | None) -> None:
        """Refuse a model whose outputs do not fit the targets (once, before the first
        loss)."""


__all__ = ["DataChecks"]
