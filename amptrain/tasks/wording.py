"""A task's part that words it in messages: what its data holds and needs, what a model's
output count is called, its words in the Trainer's first line, its resume mismatches and
its note on a model that learnt nothing (:class:`Wording`). No module outside tasks/
words a task itself."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import EvalResult


@dataclass(frozen=True)
class Wording:
    """A task's words (the default: a task that says nothing of its own)."""

    #: What data of this task holds: "--data X, which holds class labels".
    data_holds: str = "targets"
    #: What the task needs when ``--task`` names it for data that does not fit.
    data_needs: str = ""
    #: What the model's output count is called: "10 classes", "256 vocabulary entries".
    output_noun: str = "outputs"
    #: The task's words in the Trainer's first line; None: ``task <name>`` ("" says
    #: nothing: classification, the default task).
    first_line: str | None = None

    def describe(self, name: str) -> str:
        """The words of task ``name`` in the Trainer's first line."""
        return f"task {name}" if self.first_line is None else self.first_line

    def resume_mismatch(self, key: str, now: Any, then: Any, *, config: dict[str, Any],
                        saved: dict[str, Any], path: str) -> str | None:
        """The message for resuming checkpoint ``path`` whose model fact ``key``
        (``num_classes`` or ``input_shape``) was ``then`` and is ``now``, in this task's
        terms (an LM names --seq-len or --tokenizer); None: the generic message."""
        return None

    def learning_note(self, result: EvalResult) -> str | None:
        """One line for the end of a run whose final validation metrics show the model
        learnt (next to) nothing -- a regression's R² near 0, a classifier at chance --
        in this task's terms; None when it learnt, or when the task cannot tell."""
        return None


__all__ = ["Wording"]
