"""What a finished :meth:`Trainer.fit` reports."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class FitResult:
    """What a finished :meth:`Trainer.fit` reports."""

    precision: str
    steps: int
    epochs_completed: int
    final_loss: float | None
    val_loss: float | None
    skipped_steps: int
    samples_per_s: float | None
    peak_mem_bytes: int
    out: str | None
    history: list[dict[str, Any]] = field(default_factory=list, repr=False)
    #: The task's final validation metrics by key ({"acc": ...}).
    val_metrics: dict[str, float] = field(default_factory=dict)
    #: The medians of the task's declared speed fields by name (its
    #: :attr:`~amptrain.tasks.logkeys.LogKeys.speed_units`: a language model's
    #: ``tokens_per_s``, PPO's ``env_steps_per_s``); empty for a task that declares none.
    speeds: dict[str, float] = field(default_factory=dict)
    #: Each speed field's unit on the console ("tokens/s"), as the task declares it.
    speed_units: dict[str, str] = field(default_factory=dict)
    #: The median share of training time spent waiting for data (0: the input keeps up).
    data_wait_frac: float | None = None
    #: The task's line when the final metrics show the model learnt (next to) nothing
    #: (a regression's R² near 0, a classifier at chance; the task's
    #: :meth:`~amptrain.tasks.wording.Wording.learning_note`).
    learning_note: str | None = None

    @property
    def tokens_per_s(self) -> float | None:
        """``speeds["tokens_per_s"]`` (a language model's), read as before the speeds were
        the task's: None for a task that does not log it."""
        return self.speeds.get("tokens_per_s")

    def nonfinite_metrics(self) -> list[str]:
        """Names of the final metrics that are NaN or infinite (a diverged run)."""
        values = {"loss": self.final_loss, "val_loss": self.val_loss}
        return [k for k, v in values.items() if v is not None and not np.isfinite(v)]
