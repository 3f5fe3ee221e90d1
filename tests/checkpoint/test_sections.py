"""checkpoint/sections.py: a checkpoint that passes the format check but lacks a section,
has one of the wrong type, or holds non-finite weights is one line naming file and section."""
from __future__ import annotations

import pytest
import torch

from amptrain.checkpoint.sections import check_finite_weights, check_sections, nonfinite_weights
from amptrain.common.errors import UserError

GOOD = {"model": {"w": torch.ones(2)}, "step": 3, "epoch": 0, "window_in_epoch": 3,
        "config": {}, "scheduler": None, "log_window": None, "precision_name": "32-true"}


@pytest.mark.parametrize("change,fragment", [
    (lambda s: s.pop("config"), "its 'config' section is missing"),
    (lambda s: s.update(step=True), "its 'step' section is a bool, not a int"),
    (lambda s: s.update(epoch=1.5), "its 'epoch' section is a float"),
    (lambda s: s.update(optimizer=[1]), "its 'optimizer' section is a list, not a dict"),
    (lambda s: s.update(scheduler="cosine"), "its 'scheduler' section is a str, not a dict "
                                             "or None"),
    (lambda s: s["model"].update(w="weights"), "model entry 'w' is a str, not a tensor"),
    # issue 36: values in range, the RNG of its kind, the config's counts
    (lambda s: s.update(step=-5), "its 'step' is -5, outside 0..1000000000000"),
    (lambda s: s.update(step=10 ** 18), "its 'step' is 1000000000000000000, outside"),
    (lambda s: s.update(window_in_epoch=-1), "its 'window_in_epoch' is -1"),
    (lambda s: s.update(config={"batch_size": -1}), "its config holds batch_size: -1, not a "
                                                    "positive whole number"),
    (lambda s: s.update(config={"epochs": "3"}), "its config holds epochs: '3'"),
    (lambda s: s.update(rng={"torch": [1, 2]}), "its RNG state 'torch' is a list"),
    (lambda s: s.update(rng={"torch": torch.zeros(3)}), "its torch RNG state is a "
                                                         "torch.float32 tensor"),
    (lambda s: s.update(rng={"python": (3, [1], None)}), "Python RNG state is not a Mersenne"),
    (lambda s: s.update(rng={"numpy": {"kind": "MT19937"}}), "numpy RNG state is not a "
                                                              "Mersenne"),
    (lambda s: s.update(rng={"dice": 4}), "its RNG state 'dice' is a int"),
    # a shape that asks for 64 GB over 4 stored bytes (eval and export allocated it)
    (lambda s: s["model"].update(w=torch.zeros(1).expand(100000, 160000)),
     "a tensor of shape (100000, 160000) asks for 64,000,000,000 bytes but the file holds 4"),
    (lambda s: s.update(optimizer={"state": {0: {"exp_avg": torch.zeros(1).expand(10, 10)}}}),
     "a tensor of shape (10, 10) asks for 400 bytes"),
])
def test_a_damaged_section_is_named(change, fragment):
    state = {**GOOD, "model": dict(GOOD["model"])}
    change(state)
    with pytest.raises(UserError, match="^checkpoint ck.pt: ") as error:
        check_sections(state, "ck.pt")
    assert fragment in str(error.value)


def test_a_whole_checkpoint_and_older_ones_without_optional_sections_pass():
    check_sections(dict(GOOD), "ck.pt")
    square = torch.arange(6.0).reshape(2, 3)   # views of stored data are fine
    check_sections({**GOOD, "model": {"t": square.t(), "tied": square, "row": square[1]}},
                   "views.pt")
    check_sections({k: GOOD[k] for k in ("model", "step", "epoch", "window_in_epoch",
                                         "config")}, "old.pt")


def test_non_finite_weights_are_found_and_refused():
    weights = {"a": torch.ones(3), "b": torch.tensor([1.0, float("inf")]),
               "steps": torch.tensor([7])}
    assert nonfinite_weights(weights) == ["b"]
    with pytest.raises(UserError, match=r"--checkpoint ck.pt holds non-finite weights "
                                        r"\(1 of 3 tensors, e.g. 'b'\)"):
        check_finite_weights(weights, "ck.pt")
    check_finite_weights({"a": torch.ones(1)}, "ck.pt")
