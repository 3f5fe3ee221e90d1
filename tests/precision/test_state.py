"""precision/state.py: the precision's checkpoint section has one layout, a version, and
one migration that brings older files (both version-0 shapes) up to it."""
from __future__ import annotations

import copy

import pytest
import torch

from amptrain.checkpoint.stateful import Stateful
from amptrain.common.errors import UserError
from amptrain.precision import Precision
from amptrain.precision.state import FORMAT_VERSION, SECTION, migrate_state
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification, tiny_mlp


def _todays() -> dict:
    return {"name": "bf16-true", "scaler": {}, "skipped_steps": 3, "consecutive_skips": 1,
            "pairs": [{"skipped_steps": 2, "consecutive_skips": 1, "weight_update": {"rule": "a"}},
                      {"skipped_steps": 1, "consecutive_skips": 0, "weight_update": {"rule": "b"}}]}


def test_precision_is_a_stateful_part_with_a_section_and_a_version():
    precision = Precision("16-mixed", device="cpu")
    assert isinstance(precision, Stateful)
    assert (precision.section, precision.format_version) == (SECTION, FORMAT_VERSION) \
        == ("precision", 1)
    model = tiny_mlp()
    precision.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    state = precision.state_dict()
    assert set(state) == {"name", "scaler", "skipped_steps", "consecutive_skips", "pairs"}
    assert state["pairs"] == [{"skipped_steps": 0, "consecutive_skips": 0,
                               "weight_update": None}]
    assert precision.migrate(copy.deepcopy(state), FORMAT_VERSION) == state


def test_version_0_with_pairs_moves_the_first_pairs_rule_into_it():
    today = _todays()
    old = copy.deepcopy(today)
    old["weight_update"] = old["pairs"][0]["weight_update"]   # where version 0 kept it
    old["pairs"][0]["weight_update"] = None
    assert migrate_state(old, 0) == today
    assert old["pairs"][0]["weight_update"] is None  # the caller's dict is not changed


def test_version_0_without_pairs_is_one_pair_counted_at_the_top():
    old = {"name": "bf16-true", "scaler": {}, "skipped_steps": 3, "consecutive_skips": 1,
           "weight_update": {"rule": "kahan"}}   # before issue 25
    assert migrate_state(old, 0) == {
        "name": "bf16-true", "scaler": {}, "skipped_steps": 3, "consecutive_skips": 1,
        "pairs": [{"skipped_steps": 3, "consecutive_skips": 1,
                   "weight_update": {"rule": "kahan"}}]}
    assert migrate_state({}, 0) == {"pairs": [{"skipped_steps": 0, "consecutive_skips": 0,
                                               "weight_update": None}]}


@pytest.mark.parametrize("version", [2, -1, "1", True, None])
def test_a_version_this_amptrain_does_not_know_is_named(version):
    with pytest.raises(UserError, match="precision section has layout version"):
        migrate_state(_todays(), version)


def test_a_damaged_old_section_is_named_by_the_load_check():
    precision = Precision("16-mixed", device="cpu")
    with pytest.raises(UserError, match="state\\['pairs'\\] must hold one dict per pair"):
        precision.load_state_dict(precision.migrate({"precision": {"pairs": [1]}}, 0))


def _as_version_0(state: dict) -> dict:
    """A checkpoint whose precision section is as amptrain wrote it before sections had
    versions (the other parts' sections kept at today's layout)."""
    old = copy.deepcopy(state)
    del old["sections"]["precision"]
    section = old["precision"]
    section["weight_update"] = section["pairs"][0]["weight_update"]
    section["pairs"][0]["weight_update"] = None
    return old


@pytest.mark.parametrize("name,options", [("bf16-true", {"weight_update": "kahan"}),
                                          ("16-mixed", {"init_scale": 2.0 ** 20})])
def test_a_version_0_checkpoint_resumes_the_same(tmp_path, name, options):
    common = dict(precision=name, max_steps=6, batch_size=32, no_progress=True, seed=0,
                  **options)
    first = Trainer(out=str(tmp_path / "first"), save_every=3, **common)
    first.fit(tiny_mlp(), tiny_classification())
    saved = tmp_path / "first" / "checkpoints" / "step-3.pt"
    state = torch.load(saved, weights_only=True)
    assert state["sections"]["precision"] == FORMAT_VERSION
    old = tmp_path / "old-step-3.pt"
    torch.save(_as_version_0(state), old)

    finals = []
    for path, out in ((saved, "today"), (old, "old")):
        trainer = Trainer(out=str(tmp_path / out), resume=str(path), **common)
        trainer.fit(tiny_mlp(), tiny_classification())
        finals.append((trainer.precision.state_dict(), trainer.precision.weight_rule_buffers(),
                       {k: v.clone() for k, v in trainer.model.state_dict().items()}))
    (today_state, today_rule, today_weights), (old_state, old_rule, old_weights) = finals
    assert today_state["skipped_steps"] == old_state["skipped_steps"]
    assert today_state.get("scaler") == old_state.get("scaler")
    assert all(torch.equal(today_weights[k], old_weights[k]) for k in today_weights)
    first_weights = first.model.state_dict()   # and both equal the run that never stopped
    assert all(torch.equal(first_weights[k], old_weights[k]) for k in first_weights)
    assert bool(today_rule) is (options.get("weight_update") == "kahan")
    assert len(today_rule) == len(old_rule) and all(map(torch.equal, today_rule, old_rule))
