"""amptrain/precision/options.py: every precision setting declared once, in PrecisionConfig,
and read from there by the command line, the run's config, ``Precision(...)`` and the
inapplicable-option warning."""
from __future__ import annotations

import dataclasses
import inspect
import math
import subprocess
import sys

import pytest

from amptrain.common.errors import UserError
from amptrain.common.options import config_fields
from amptrain.config import TrainConfig
from amptrain.precision.options import (SCALER_SETTINGS, PrecisionConfig, ScalerSettings,
                                        check_scaler_settings)
from amptrain.trainer.inapplicable import SCALER_OPTIONS

torch = pytest.importorskip("torch")

from amptrain.precision import Precision  # noqa: E402  (after the torch check)


def test_the_scaler_settings_are_torchs_gradscaler_keywords_with_its_defaults():
    assert SCALER_SETTINGS == ("init_scale", "growth_factor", "backoff_factor",
                               "growth_interval")
    keywords = inspect.signature(torch.amp.GradScaler).parameters
    defaults = PrecisionConfig()
    for name in SCALER_SETTINGS:
        assert keywords[name].default == getattr(defaults, name), name
    assert defaults.scaler_settings.as_kwargs() == {
        "init_scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
        "growth_interval": 2000}


def test_the_run_config_nests_the_one_declaration():
    assert TrainConfig().precision == PrecisionConfig()
    fields = config_fields(TrainConfig)
    for f in dataclasses.fields(PrecisionConfig):
        flat = f.metadata.get("flat") or f.name
        assert fields[flat] is f, flat  # the flag, YAML key and keyword: this field


def test_precision_takes_every_setting_by_keyword_with_the_same_defaults():
    plain = Precision("16-mixed", device="cpu")
    assert plain.config == PrecisionConfig()
    given = Precision("16-mixed", device="cpu", init_scale=8.0, growth_interval=3,
                      keep_fp32="head", max_bad_steps=4)
    assert given.scaler_settings == ScalerSettings(init_scale=8.0, growth_factor=2.0,
                                                   backoff_factor=0.5, growth_interval=3)
    assert given.keep_fp32 == ["head"] and given.max_bad_steps == 4
    from_config = Precision.from_config(
        PrecisionConfig(name="16-mixed", init_scale=8.0, growth_interval=3), device="cpu")
    assert from_config.scaler_settings == given.scaler_settings


def test_library_values_are_converted_as_their_flags_are():
    # A number written as text (YAML 1.1 reads 1e-3 as one) and numpy's numbers.
    import numpy as np

    precision = Precision("16-mixed", device="cpu", init_scale="1024",
                          growth_interval=np.int64(5), keep_fp32=("a", "b"))
    assert precision.scaler_settings.init_scale == 1024.0
    assert precision.scaler_settings.growth_interval == 5
    assert precision.keep_fp32 == ["a", "b"]


def test_the_inapplicable_warning_names_every_scaler_setting():
    assert SCALER_OPTIONS == (*SCALER_SETTINGS, "min_scale")


@pytest.mark.parametrize("name,value,message", [
    ("init_scale", 0.0, "must be a positive number"),
    ("init_scale", math.inf, "must be a positive number"),
    ("growth_factor", 1.0, "must be > 1"),
    ("backoff_factor", 1.0, "must be between 0 and 1"),
    ("growth_interval", 0, "must be an integer >= 1"),
    ("growth_interval", 2.5, "must be an integer"),
    ("min_scale", 0.0, "must be a positive number"),
    ("max_bad_steps", 0, "must be an integer >= 1"),
    ("lowbit_bf16_last", -1, "must be >= 0"),
    ("mx_scale", "round", "must be one of floor, rceil"),
    ("weight_update", "fast", "must be one of plain"),
])
def test_one_check_for_the_config_and_precision(name, value, message):
    builds = [lambda: PrecisionConfig.from_keywords(**{name: value}),
              lambda: Precision("16-mixed", device="cpu", **{name: value})]
    if name in SCALER_SETTINGS and name != "growth_interval":
        builds.append(lambda: check_scaler_settings({name: value}))
    for build in builds:
        with pytest.raises(UserError, match=f"{name} {message}"):
            build()


def test_unknown_and_doubled_settings_are_refused_by_name():
    with pytest.raises(UserError, match="unknown keyword 'init_scal' for Precision"):
        Precision("16-mixed", device="cpu", init_scal=8.0)
    with pytest.raises(UserError, match="first argument, not precision="):
        Precision(device="cpu", precision="16-mixed")
    with pytest.raises(UserError, match="config= or its settings as keywords, not both"):
        Precision("16-mixed", device="cpu", config=PrecisionConfig(), init_scale=8.0)
    with pytest.raises(UserError, match="min_scale .* must not exceed --init-scale|"
                                        "min_scale .* must not exceed init_scale"):
        Precision("16-mixed", device="cpu", init_scale=2.0, min_scale=4.0)


def test_the_settings_value_is_frozen():
    settings = PrecisionConfig().scaler_settings
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.init_scale = 1.0  # type: ignore[misc]


def test_importing_the_declaration_imports_no_torch():
    code = ("import sys, amptrain.precision.options, amptrain.config; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"
