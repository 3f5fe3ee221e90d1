"""Fixtures of the command tests (helpers that are no fixtures: ``helpers.py``)."""
from __future__ import annotations

import pytest

from tests.commands.helpers import amptrain


@pytest.fixture(scope="package")
def digits_run(tmp_path_factory):
    """The main job, once for the train and eval tests: cnn on digits in bf16-mixed."""
    out = tmp_path_factory.mktemp("main") / "run"
    result = amptrain("train", "--model", "cnn", "--data", "digits", "--precision", "bf16-mixed",
                      "--epochs", "3", "--out", out, cwd=out.parent)
    return out, result
