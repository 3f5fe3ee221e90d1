"""Where the loop is: optimizer steps done, the epoch, the window within it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class LoopPosition:
    """The loop's position, as a checkpoint holds it (epochs count from 0)."""

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

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's position entries (``step_epoch`` travels in ``log_window``)."""
        return {"step": self.step, "epoch": self.epoch, "window_in_epoch": self.window_in_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a checkpoint's position (its top-level entries and ``log_window``)."""
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        self.window_in_epoch = int(state["window_in_epoch"])
        window = state.get("log_window")
        if window:
            self.step_epoch = int(window["step_epoch"])
