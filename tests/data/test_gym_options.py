"""data/gym_options.py: gym: data's options, checked where they are declared."""
from __future__ import annotations

import pytest

from amptrain.common.errors import UserError
from amptrain.data.gym_options import MAX_EVAL_EPISODES, GymOptions, check_eval_episodes


@pytest.mark.parametrize("values, message", [
    ({"num_envs": 0}, "num_envs must be an integer >= 1 (got 0)"),
    ({"rollout_steps": -1}, "rollout_steps must be an integer >= 1 (got -1)"),
    ({"eval_episodes": MAX_EVAL_EPISODES + 1},
     "eval_episodes 10001 is more than the 10000 evaluation episodes amptrain plays (each "
     "is reset up front)"),
])
def test_each_option_is_checked_when_built(values, message):
    with pytest.raises(UserError) as caught:
        GymOptions(**values)
    assert str(caught.value) == message


def test_the_episodes_bound_names_the_option_it_is_given():
    check_eval_episodes(MAX_EVAL_EPISODES, "--episodes")
    with pytest.raises(UserError, match="^--episodes 10001 is more"):
        check_eval_episodes(MAX_EVAL_EPISODES + 1, "--episodes")
