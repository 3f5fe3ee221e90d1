"""checkpoint/registry.py: each part's section written with its layout version, and handed
back in today's layout (migrated from older versions; newer ones refused)."""
from __future__ import annotations

from typing import Any

import pytest

from amptrain.checkpoint import SECTIONS, RngState, StateRegistry
from amptrain.checkpoint.stateful import Stateful
from amptrain.common.errors import UserError


class Counter:
    """A part whose layout 2 renamed ``n`` (layout 1) to ``count`` (layout 0: at the top)."""

    section = "counter"
    format_version = 2

    def __init__(self) -> None:
        self.count = 0
        self.migrated: list[int] = []

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = state["count"]

    def migrate(self, state: dict[str, Any], version: int) -> dict[str, Any]:
        self.migrated.append(version)
        return {"count": state["counter_n"] if version == 0 else state["n"]}


def _registry(*parts: Stateful) -> StateRegistry:
    registry = StateRegistry()
    for part in parts:
        registry.register(part)
    return registry


def test_sections_round_trip_with_their_versions():
    saved = Counter()
    saved.count = 7
    state = _registry(saved, RngState()).state_dict()
    assert state[SECTIONS] == {"counter": 2, "rng": 1} and state["counter"] == {"count": 7}
    loaded = Counter()
    _registry(loaded).load_state_dict(state)
    assert loaded.count == 7 and loaded.migrated == []


@pytest.mark.parametrize("state, version", [
    ({"counter_n": 5}, 0),                                   # before sections: the whole file
    ({SECTIONS: {"counter": 1}, "counter": {"n": 5}}, 1),    # an older layout of the section
])
def test_older_layouts_are_migrated_once(state, version):
    part = Counter()
    _registry(part).load_state_dict(state)
    assert part.count == 5 and part.migrated == [version]


def test_a_newer_or_missing_section_and_a_taken_name_are_refused():
    with pytest.raises(UserError, match="'counter' section has layout 3; this amptrain reads "
                                        "up to 2: upgrade amptrain"):
        _registry(Counter()).load_state_dict({SECTIONS: {"counter": 3}, "counter": {}})
    with pytest.raises(UserError, match="'counter' section is missing"):
        _registry(Counter()).load_state_dict({SECTIONS: {"counter": 2}})
    with pytest.raises(ValueError, match="taken"):
        _registry(Counter(), Counter())


def test_given_sections_are_not_asked_for():
    class Refusing(Counter):
        def state_dict(self) -> dict[str, Any]:
            raise AssertionError("asked")

    state = _registry(Refusing()).state_dict(given={"counter": {"count": 1}})
    assert state["counter"] == {"count": 1}
