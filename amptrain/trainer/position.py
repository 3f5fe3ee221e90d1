"""Where the loop is (optimizer steps done, the epoch, the window within it), and where it
ends (:class:`RunLength`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..config.train import DEFAULT_EPOCHS
from ..common.errors import UserError, flag


@dataclass
class LoopPosition:
    """The loop's position, as a checkpoint holds it (epochs count from 0); its
    checkpoint section is ``position`` (:class:`~amptrain.checkpoint.stateful.Stateful`)."""

    step: int = 0             # optimizer steps done
    epoch: int = 0            # the epoch in progress
    window_in_epoch: int = 0  # windows done in that epoch
    step_epoch: int = 0       # the epoch of the last trained step (records name it)

    def advance(self) -> None:
        """One more step done, in the current epoch."""
        self.step_epoch = self.epoch
        self.step += 1
        self.window_in_epoch += 1

    def next_epoch(self) -> None:
        """The current epoch is over."""
        self.epoch += 1
        self.window_in_epoch = 0

    # ------------------------------------------- its checkpoint section (Stateful)
    section = "position"
    format_version = 1

    def state_dict(self) -> dict[str, Any]:
        """The ``position`` section: the four counters."""
        return {"step": self.step, "epoch": self.epoch, "window_in_epoch": self.window_in_epoch,
                "step_epoch": self.step_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        self.window_in_epoch = int(state["window_in_epoch"])
        self.step_epoch = int(state["step_epoch"])

    def migrate(self, state: dict[str, Any], version: int) -> dict[str, Any]:
        """Version 0 (a whole file of format 1) kept step, epoch and window at the top and
        the epoch of the last step in the metrics' ``log_window`` (absent: epoch 0)."""
        window = state.get("log_window") or {}
        return {"step": state["step"], "epoch": state["epoch"],
                "window_in_epoch": state["window_in_epoch"],
                "step_epoch": window.get("step_epoch", 0)}


@dataclass(frozen=True)
class RunLength:
    """How long a run is, decided once from ``--epochs``, ``--max-steps`` and the data.

    ``--max-steps`` alone decides the length (as many epochs as its steps need, as Hugging
    Face's ``max_steps`` and Lightning's ``max_steps`` do); ``--epochs`` alone as many
    passes; both given, whichever ends first; neither, :data:`DEFAULT_EPOCHS` passes.
    A YAML ``--config`` value counts as given: an option is given when it is not None.
    """

    total_steps: int         # optimizer steps the run trains (the LR schedule's length)
    epochs: int | None       # the loop's bound on epochs; None: until total_steps (a stream)
    why: str                 # for the banner: "120 steps (--max-steps 120; 5.2 epochs ...)"

    @classmethod
    def resolve(cls, epochs: int | None, max_steps: int | None,
                steps_per_epoch: int | None) -> RunLength:
        """The length of a run of ``steps_per_epoch`` steps an epoch (None: a stream,
        whose length is unknown, so it needs ``max_steps``)."""
        if steps_per_epoch is None:
            if max_steps is None:
                raise UserError(f"a stream without a length needs {flag('max_steps')}")
            if epochs is None:
                return cls(max_steps, None, f"{flag('max_steps')} {max_steps}; the stream is "
                                            f"read as often as they need")
            return cls(max_steps, epochs, f"at most: {flag('max_steps')} {max_steps} or "
                                          f"{flag('epochs')} {epochs} over the stream, "
                                          f"whichever ends first")
        per_epoch = f"of {steps_per_epoch} step{'s' * (steps_per_epoch != 1)}"
        if max_steps is None:
            passes = epochs if epochs is not None else DEFAULT_EPOCHS
            why = f"{flag('epochs')} {epochs} {per_epoch}" if epochs is not None \
                else f"{passes} epochs {per_epoch}, the default"
            return cls(passes * steps_per_epoch, passes, why)
        needed = math.ceil(max_steps / steps_per_epoch)
        if epochs is None:
            share = max_steps / steps_per_epoch
            shown = f"{share:.0f}" if share.is_integer() else f"{share:.1f}"
            return cls(max_steps, needed, f"{flag('max_steps')} {max_steps}; {shown} "
                                          f"epoch{'s' * (share != 1)} {per_epoch}")
        total = min(max_steps, epochs * steps_per_epoch)
        return cls(total, min(epochs, needed), f"the fewer of {flag('max_steps')} {max_steps} "
                                               f"and {flag('epochs')} {epochs} {per_epoch}")

    def reached(self, position: LoopPosition) -> bool:
        """Whether the run is over at ``position``."""
        return position.step >= self.total_steps or (
            self.epochs is not None and position.epoch >= self.epochs)

    def epoch_label(self, epoch: int) -> str:
        """The progress bar's name of an epoch: ``epoch 0 (0-2)`` (epochs count from 0)."""
        return f"epoch {epoch}" if self.epochs is None else f"epoch {epoch} (0-{self.epochs - 1})"
