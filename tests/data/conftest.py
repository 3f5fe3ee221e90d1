"""Helpers shared by the data tests: every malformed input is a one-line UserError
naming --data."""
from __future__ import annotations

import pytest

from amptrain.data import DataOptions, build_data
from amptrain.common.errors import UserError


def assert_data_error(spec: str, match: str, options: DataOptions | None = None) -> None:
    with pytest.raises(UserError, match=match) as caught:
        build_data(spec, options)
    message = str(caught.value)
    assert "--data" in message and "\n" not in message
