"""What a part of a run that has state offers the checkpointer (torchtitan's ``Stateful``).

Every part with state (the loop position, the log interval, the optimizer steps, the
precision, the task) implements :class:`Stateful` and is registered with the checkpointer
under its own section name. The checkpointer, not the part, writes the section's format
version next to it; a file written by an older amptrain is brought up to date by the
part's one :meth:`Stateful.migrate`, so a part's ``load_state_dict`` only ever reads
today's layout.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Stateful(Protocol):
    """A part of a run whose state a checkpoint holds (see the module docstring)."""

    #: The checkpoint key the part's state is stored under ("position", "precision").
    section: str
    #: The layout version of that state; raised when the layout changes, with a step
    #: added to :meth:`migrate`.
    format_version: int

    def state_dict(self) -> dict[str, Any]:
        """The part's state in today's layout: tensors and plain Python values only (a
        checkpoint is read with ``weights_only=True``)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (today's layout; already checked)."""
        ...

    def migrate(self, state: dict[str, Any], version: int) -> dict[str, Any]:
        """``state`` as written at layout ``version`` (0: a file from before layouts were
        versioned, its values read from where that file kept them), in today's layout."""
        ...
