"""checkpoint/stateful.py: every part a set-up run registers with its checkpointer is a
:class:`Stateful`, under a section of its own that is a key of the checkpoint, and its state
round-trips through ``state_dict`` / ``load_state_dict``; an object without the whole
protocol is not one."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from amptrain.checkpoint.registry import SECTIONS
from amptrain.checkpoint.stateful import Stateful
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification, tiny_mlp

OPTIONS = dict(device="cpu", deterministic=True, no_progress=True, batch_size=32,
               micro_batch_size=16, max_steps=3, lr=0.05, scheduler="cosine", warmup_steps=1)


def _registered(trainer: Trainer) -> dict[str, Any]:
    # The register keeps its parts privately; the test reads them to check each one.
    return dict(trainer.checkpointer.registry._parts)


def _same(a: Any, b: Any) -> bool:
    """Equal, tensors included (bitwise), through nested dicts, lists and tuples."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype and torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture(scope="module", params=["32-true", "16-mixed"])
def trained(request) -> Trainer:
    trainer = Trainer(precision=request.param, **OPTIONS)
    trainer.fit(tiny_mlp(), tiny_classification(n=96))
    return trainer


def test_every_registered_part_is_a_stateful_under_its_own_section(trained):
    parts = _registered(trained)
    # The run's parts with state, at least: position, optimizer steps, precision, task.
    assert {"position", "precision", "task"} <= parts.keys() and len(parts) >= 4
    for name, part in parts.items():
        assert isinstance(part, Stateful), name
        assert part.section == name
        assert isinstance(part.format_version, int) and part.format_version >= 1
    sections = trained.checkpointer.registry.sections
    assert len(sections) == len(set(sections))


def test_the_sections_are_the_checkpoints_keys_with_their_versions(trained):
    state = trained.state_dict()
    parts = _registered(trained)
    assert set(parts) <= set(state)
    assert state[SECTIONS] == {name: part.format_version for name, part in parts.items()}
    for name, part in parts.items():
        assert _same(state[name], part.state_dict()), name


def test_each_part_round_trips_into_a_fresh_run(trained):
    """The trained run's sections, loaded part by part into a run set up but not trained,
    give that run the same state (the trained one's is not the fresh one's to begin with)."""
    fresh = Trainer(precision=trained.precision.name, **OPTIONS)
    fresh.setup(tiny_mlp(), tiny_classification(n=96))
    trained_parts, fresh_parts = _registered(trained), _registered(fresh)
    assert trained_parts.keys() == fresh_parts.keys()
    assert not _same(trained_parts["position"].state_dict(),
                     fresh_parts["position"].state_dict())
    for name, part in trained_parts.items():
        saved = part.state_dict()
        fresh_parts[name].load_state_dict(saved)
        assert _same(fresh_parts[name].state_dict(), saved), name
        part.load_state_dict(saved)  # and into itself: nothing changes
        assert _same(part.state_dict(), saved), name


class _Complete:
    section = "thing"
    format_version = 1

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def migrate(self, state: dict[str, Any], version: int) -> dict[str, Any]:
        return state


class _NoMigrate:
    section = "thing"
    format_version = 1

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class _NoVersion:
    section = "thing"

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def migrate(self, state: dict[str, Any], version: int) -> dict[str, Any]:
        return state


def test_an_object_without_the_whole_protocol_is_not_a_stateful():
    assert isinstance(_Complete(), Stateful)
    assert not isinstance(_NoMigrate(), Stateful)
    assert not isinstance(_NoVersion(), Stateful)
    assert not isinstance(torch.nn.Linear(2, 2), Stateful)  # state_dict alone is not enough
