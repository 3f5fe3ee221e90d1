"""The checkpointer's register of parts with state (:class:`~.stateful.Stateful`).

Each part is registered under its section. Writing, the register puts every part's
``state_dict()`` under its section and the layout versions of all of them under
:data:`SECTIONS`; reading, it hands each part its section in today's layout: a section
written at an older version (or a file from before sections were versioned: version 0)
goes through the part's one ``migrate`` first. A part never sees another's section.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..common.errors import UserError
from .stateful import Stateful

#: The checkpoint key holding ``{section: format_version}`` of every registered part.
SECTIONS = "sections"


def section_versions(state: Mapping[str, Any]) -> dict[str, int]:
    """``{section: format_version}`` as a checkpoint records them ({}: written before
    sections were versioned, every section at version 0)."""
    versions = state.get(SECTIONS)
    return dict(versions) if isinstance(versions, dict) else {}


class StateRegistry:
    """The parts whose state a checkpoint holds, by section (see the module docstring)."""

    def __init__(self) -> None:
        self._parts: dict[str, Stateful] = {}

    def register(self, part: Stateful) -> None:
        """Add ``part`` under its section (one part per section)."""
        if part.section in self._parts or part.section == SECTIONS:
            raise ValueError(f"section {part.section!r} is taken")
        self._parts[part.section] = part

    @property
    def sections(self) -> list[str]:
        """The registered sections, in registration order (the order they load in)."""
        return list(self._parts)

    def state_dict(self, given: Mapping[str, dict[str, Any]] | None = None
                   ) -> dict[str, Any]:
        """Every part's section and :data:`SECTIONS`. ``given``: sections the caller has
        already made (a sharded save's optimizer section without the states its shards
        hold): those parts are not asked."""
        given = given or {}
        state: dict[str, Any] = {
            name: given[name] if name in given else part.state_dict()
            for name, part in self._parts.items()}
        state[SECTIONS] = {name: part.format_version for name, part in self._parts.items()}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Hand each part its section of ``state`` in today's layout (migrated when the
        file wrote an older one); a section newer than this amptrain is refused."""
        versions = section_versions(state)
        for name, part in self._parts.items():
            part.load_state_dict(self.section_of(state, part, versions.get(name, 0)))

    @staticmethod
    def section_of(state: Mapping[str, Any], part: Stateful, version: int) -> dict[str, Any]:
        """``part``'s section of ``state``, written at layout ``version``, in today's layout."""
        if version > part.format_version:
            raise UserError(f"the checkpoint's '{part.section}' section has layout {version}; "
                            f"this amptrain reads up to {part.format_version}: upgrade amptrain")
        if version > 0 and not isinstance(state.get(part.section), dict):
            raise UserError(f"the checkpoint's '{part.section}' section is missing (a damaged "
                            f"or hand-edited file); use a checkpoint that amptrain wrote")
        if version == part.format_version:
            return dict(state[part.section])
        # Version 0 kept the part's values where that file put them: the whole file.
        old = dict(state) if version == 0 else dict(state[part.section])
        return part.migrate(old, version)
