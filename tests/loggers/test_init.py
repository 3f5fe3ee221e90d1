"""The tracker registry: names checked by the config (one line naming --logger)."""
from __future__ import annotations

import pytest

from amptrain.config import TrainConfig, build_config
from amptrain.errors import UserError
from amptrain.loggers import SINKS, parse_names


def test_names():
    assert parse_names("tensorboard, MLflow,csv,csv") == ["tensorboard", "mlflow", "csv"]
    assert parse_names("none") == [] and parse_names(["csv"]) == ["csv"]
    assert set(SINKS) == {"tensorboard", "mlflow", "csv"}


@pytest.mark.parametrize("value", ["wandb", "", "none,csv"])
def test_unknown_names_are_refused_by_the_config(value):
    with pytest.raises(UserError, match="logger"):
        build_config(TrainConfig, {"logger": value})
