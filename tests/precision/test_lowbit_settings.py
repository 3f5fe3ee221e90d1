"""Which low-bit settings each mode reads, and the warning about one nothing reads."""
from __future__ import annotations

import warnings

import pytest

from amptrain.common.errors import AmptrainWarning, forget_warnings
from amptrain.precision import Precision
from amptrain.precision.lowbit_settings import (given_settings, plan_settings_read,
                                                settings_for, settings_read, unread_settings)
from amptrain.precision.modes import MODES
from amptrain.precision.options import PrecisionConfig
from amptrain.precision.precision_plan import PrecisionPlan, plan_spec

ALL = dict(lowbit_bf16_last=2, mx_scale="rceil", nvfp4_without="rht")


@pytest.mark.parametrize("mode, read", [
    ("bf16-mixed", set()), ("32-true", set()), ("fp8", {"lowbit_bf16_last"}),
    ("mxfp4", {"lowbit_bf16_last", "mx_scale"}), ("mxfp8", {"lowbit_bf16_last", "mx_scale"}),
    ("nvfp4", {"lowbit_bf16_last", "nvfp4_without"}), ("nvfp4-plain", {"lowbit_bf16_last"}),
])
def test_each_mode_reads_the_settings_of_its_format(mode, read):
    assert settings_read(MODES[mode]) == read


def test_a_plan_reads_mx_scale_where_it_has_mx_layers_and_nothing_else():
    mixed = plan_spec(PrecisionPlan("p.yaml", (("a", "mxfp4"), ("b", "nvfp4"), ("c", "bf16"))))
    assert settings_read(mixed) == {"mx_scale"} == plan_settings_read(["mxfp4"])
    fp8 = plan_spec(PrecisionPlan("q.yaml", (("a", "fp8"), ("b", "nvfp4"))))
    assert settings_read(fp8) == set() == plan_settings_read(["nvfp4"])


def test_a_run_takes_what_its_mode_reads_and_the_defaults_elsewhere():
    config = PrecisionConfig(**ALL)
    assert given_settings(config) == ALL and given_settings(PrecisionConfig()) == {}
    assert settings_for(MODES["mxfp4"], config) == dict(ALL, nvfp4_without="none")
    assert settings_for(MODES["bf16-mixed"], config) == dict(
        lowbit_bf16_last=0, mx_scale="floor", nvfp4_without="none")
    # what no mode of the set reads: only the setting given away from its default
    assert unread_settings(config, [MODES["mxfp4"], MODES["bf16-mixed"]]) == \
        {"nvfp4_without": "rht"}
    assert unread_settings(PrecisionConfig(mx_scale="rceil"), [MODES["32-true"]]) == \
        {"mx_scale": "rceil"}


def test_one_run_warns_about_each_setting_its_precision_does_not_read():
    forget_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AmptrainWarning)
        Precision("mxfp8", device="cpu", **ALL)
    said = [str(w.message) for w in caught if "does nothing" in str(w.message)]
    # a library call: the keywords' names (the command line names its flags)
    assert said == ["nvfp4_without rht does nothing in precision mxfp8: it leaves a part "
                    "of the nvfp4 training recipe out"]
