"""A task's part that shapes the run's iteration (:class:`Iteration`): the Trainer's epochs
of windows by default, or the task's own loop (PPO's updates), with what that changes for
the run's options, compare's timing and what a batch is."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .step import TrainLoop


class Iteration:
    """The default: the Trainer's epochs of the training data, one step per window."""

    #: Whether the task drives the run's iteration itself (:meth:`iterate`).
    owns: bool = False
    #: Whether a training batch is ``(inputs, targets)`` the model's loss is computed on
    #: (False: PPO's batches are rollout slots its own step reads; compare's fp32 re-check
    #: of the first batch's loss does not apply).
    batches_are_samples: bool = True

    def iterate(self, loop: TrainLoop) -> None:
        """The run's iteration, for a task that :attr:`owns` it (see
        :class:`~.step.TrainLoop`); the Trainer calls it instead of its epochs."""
        raise NotImplementedError("this task does not own its loop")

    def timed_unit(self) -> int:
        """Optimizer steps compare times as one unit: 1, or for a task that acts between
        updates (PPO's rollouts) a whole update, so its acting is timed too."""
        return 1

    def run_options(self, config: Any, data: Any) -> dict[str, Any]:
        """Options (flat names) the task sets for a run of ``config`` on ``data`` (a
        ``DataBundle``): a task that makes its own samples (PPO's rollouts) sets the run's
        length and batch from them. None by default."""
        return {}


__all__ = ["Iteration"]
