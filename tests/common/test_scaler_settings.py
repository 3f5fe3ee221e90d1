"""amptrain/scaler_settings.py: the four loss-scaler settings, declared once and read by the
config, Precision and the inapplicable-option warning."""
from __future__ import annotations

import dataclasses
import inspect
import math
import subprocess
import sys

import pytest

from amptrain.config import PrecisionConfig, config_fields
from amptrain.common.errors import UserError
from amptrain.trainer.inapplicable import SCALER_OPTIONS
from amptrain.common.scaler_settings import (SCALER_HELP, SCALER_SETTINGS, ScalerSettings,
                                             check_scaler_settings)

torch = pytest.importorskip("torch")


def test_the_names_are_torchs_gradscaler_keywords():
    assert SCALER_SETTINGS == ("init_scale", "growth_factor", "backoff_factor",
                               "growth_interval")
    keywords = inspect.signature(torch.amp.GradScaler).parameters
    for name in SCALER_SETTINGS:
        assert keywords[name].default == getattr(ScalerSettings, name), name
    assert set(SCALER_HELP) == set(SCALER_SETTINGS)


def test_the_config_reads_names_defaults_and_help_from_here():
    fields = config_fields(PrecisionConfig)
    defaults = PrecisionConfig()
    for name in SCALER_SETTINGS:
        assert fields[name].metadata["help"] == SCALER_HELP[name]
        assert getattr(defaults, name) == getattr(ScalerSettings, name)


def test_precision_takes_each_setting_as_an_explicit_keyword():
    from amptrain.precision import Precision

    parameters = inspect.signature(Precision).parameters
    for name in SCALER_SETTINGS:
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert parameters[name].default == getattr(ScalerSettings, name)
    precision = Precision.from_config(PrecisionConfig(name="16-mixed", init_scale=8.0,
                                                      growth_interval=3), device="cpu")
    assert precision.scaler_settings == ScalerSettings(init_scale=8.0, growth_interval=3)


def test_the_inapplicable_warning_names_every_setting():
    assert SCALER_OPTIONS == (*SCALER_SETTINGS, "min_scale")


@pytest.mark.parametrize("name,value,message", [
    ("init_scale", 0.0, "must be a positive number"),
    ("init_scale", math.inf, "must be a positive number"),
    ("growth_factor", 1.0, "must be > 1"),
    ("backoff_factor", 1.0, "must be between 0 and 1"),
    ("growth_interval", 0, "must be an integer >= 1"),
    ("growth_interval", 2.5, "must be an integer >= 1"),
])
def test_one_check_for_config_precision_and_settings(name, value, message):
    from amptrain.precision import Precision

    for build in (lambda: check_scaler_settings({name: value}),
                  lambda: ScalerSettings(**{name: value}),
                  lambda: PrecisionConfig(**{name: value}),
                  lambda: Precision("16-mixed", device="cpu", **{name: value})):
        with pytest.raises(UserError, match=f"{name} {message}"):
            build()


def test_defaults_are_valid_and_frozen():
    settings = ScalerSettings()
    assert settings.as_kwargs() == {"init_scale": 65536.0, "growth_factor": 2.0,
                                    "backoff_factor": 0.5, "growth_interval": 2000}
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.init_scale = 1.0  # type: ignore[misc]


def test_importing_it_imports_no_torch():
    code = "import sys, amptrain.common.scaler_settings; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"
