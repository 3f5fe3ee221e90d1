"""Behaviour kept through redesigns (issue 43): five runs give, bit for bit, the losses and
validation values recorded on 9d432d4 (tests/data/recorded_losses.json, written by
``python tests/recorded_runs.py --record`` with the CPU kernels pinned at AVX2 on one
thread, so every x86 class computes the same numbers).

A change that is meant to change numbers (a new default, another rounding) re-records the
file in the same commit and says why in its message.
"""
from __future__ import annotations

import json

import pytest

from tests.recorded_runs import RECORD, RUNS, run_pinned

RECORDED = json.loads(RECORD.read_text())


def test_every_recorded_run_is_still_defined():
    assert sorted(RECORDED) == sorted(RUNS)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_run_gives_the_recorded_losses_bitwise(name):
    now = run_pinned(name)
    recorded = RECORDED[name]
    assert sorted(now) == sorted(recorded)
    for key, values in recorded.items():
        assert len(now[key]) == len(values), key
        first = next((i for i, (a, b) in enumerate(zip(now[key], values)) if a != b), None)
        assert first is None, (f"{name}: {key} differs from step {first + 1} on: "
                               f"{float.fromhex(now[key][first])!r} against the recorded "
                               f"{float.fromhex(values[first])!r}")
