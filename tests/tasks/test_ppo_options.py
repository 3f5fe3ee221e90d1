"""tasks/ppo_options.py: the ppo task's options, checked where they are declared."""
from __future__ import annotations

import pytest

from amptrain.common.errors import UserError
from amptrain.tasks.ppo_options import PpoOptions


@pytest.mark.parametrize("values, message", [
    ({"gamma": 1.5}, "gamma must be between 0 and 1 (got 1.5)"),
    ({"gae_lambda": -0.1}, "gae_lambda must be between 0 and 1 (got -0.1)"),
    ({"clip_coef": -1.0}, "clip_coef must be a number >= 0 (got -1.0)"),
    ({"vf_coef": float("nan")}, "vf_coef must be a number >= 0 (got nan)"),
    ({"minibatches": 0}, "minibatches must be an integer >= 1 (got 0)"),
    ({"update_epochs": 0}, "update_epochs must be an integer >= 1 (got 0)"),
])
def test_each_option_is_checked_when_built(values, message):
    with pytest.raises(UserError) as caught:
        PpoOptions(**values)
    assert str(caught.value) == message


def test_given_holds_only_what_was_given():
    assert PpoOptions(gamma=0.0, clip_coef=0.1).given() == {"gamma": 0.0, "clip_coef": 0.1}
    assert PpoOptions().given() == {}
