"""compare/rows.py: each row takes the options its precision reads (the others at their
defaults, not counted as given), and a study warns once about an option no row reads."""
from __future__ import annotations

import json
import logging
import warnings

import pytest
import yaml

from amptrain.common.errors import AmptrainWarning, forget_warnings
from amptrain.common.options import given_options
from amptrain.compare import CompareOptions, run_compare
from amptrain.compare.rows import row_config, row_names, warn_unread
from tests.compare.conftest import small_config

LOWBIT_DEFAULTS = {"lowbit_bf16_last": 0, "mx_scale": "floor", "nvfp4_without": "none"}


def row_lowbit(label, config):
    """The low-bit settings row ``label``'s run config trains with."""
    run = row_config(label, config)
    return {name: getattr(run.precision, name) for name in LOWBIT_DEFAULTS}


def test_each_row_takes_the_low_bit_settings_its_precision_reads(tmp_path):
    plan = tmp_path / "p.yaml"
    plan.write_text("layers:\n  body.3: mxfp4\n")
    config = small_config(tmp_path / "out", model="mlp:32", mx_scale="rceil",
                          lowbit_bf16_last=1, nvfp4_without="sr")
    assert row_lowbit("bf16-true+kahan", config) == LOWBIT_DEFAULTS
    assert row_lowbit("mxfp4", config) == dict(LOWBIT_DEFAULTS, mx_scale="rceil",
                                               lowbit_bf16_last=1)
    assert row_lowbit("nvfp4", config) == dict(LOWBIT_DEFAULTS, lowbit_bf16_last=1,
                                               nvfp4_without="sr")
    assert row_lowbit(f"plan:{plan}", config) == dict(LOWBIT_DEFAULTS, mx_scale="rceil")


def test_a_rows_name_shows_the_low_bit_settings_it_reads_away_from_their_defaults(tmp_path):
    """mxfp4 reads --mx-scale and --lowbit-bf16-last, nvfp4 --nvfp4-without and
    --lowbit-bf16-last, a plan with an MX layer --mx-scale; bf16 none, and keeps its name."""
    plan = tmp_path / "p.yaml"
    plan.write_text("layers:\n  body.3: mxfp4\n")
    rows = ["bf16-mixed", "mxfp4", "nvfp4", "nvfp4-plain", f"plan:{plan}"]
    config = small_config(tmp_path / "out", model="mlp:32", mx_scale="rceil",
                          nvfp4_without="rht")
    assert row_names(config, rows) == {"mxfp4": "mxfp4 rceil", "nvfp4": "nvfp4 without rht",
                                       f"plan:{plan}": f"plan:{plan} rceil"}
    config = small_config(tmp_path / "out", model="mlp:32", nvfp4_without="2d",
                          lowbit_bf16_last=1)
    assert row_names(config, rows) == {"mxfp4": "mxfp4 bf16-last 1",
                                       "nvfp4": "nvfp4 without 2d bf16-last 1",
                                       "nvfp4-plain": "nvfp4-plain bf16-last 1"}
    assert row_names(small_config(tmp_path / "out", model="mlp:32"), rows) == {}


def test_the_loss_scaler_options_reach_the_rows_that_scale_the_loss_only(tmp_path):
    config = small_config(tmp_path / "out", init_scale=1024.0, growth_interval=7,
                          max_bad_steps=3)
    assert {"init_scale", "growth_interval", "max_bad_steps"} <= given_options(config)
    fp16 = row_config("16-mixed", config, seed=1)
    bf16 = row_config("bf16-mixed", config, seed=1)
    assert (fp16.precision.init_scale, fp16.precision.growth_interval) == (1024.0, 7)
    assert fp16.precision.max_bad_steps == 10 and "max_bad_steps" not in fp16.given
    assert {"init_scale", "growth_interval"} <= fp16.given
    assert (bf16.precision.init_scale, bf16.precision.growth_interval) == (65536.0, 2000)
    assert bf16.precision.max_bad_steps == 3 and "max_bad_steps" in bf16.given
    assert not {"init_scale", "growth_interval"} & bf16.given
    assert (fp16.seed, bf16.seed, bf16.precision.name) == (1, 1, "bf16-mixed")
    # the study's own config is not changed by making a row's
    assert {"init_scale", "growth_interval", "max_bad_steps"} <= given_options(config)


@pytest.mark.parametrize("rows,options,expected", [
    (["32-true", "bf16-mixed"], dict(init_scale=1024.0),
     "init_scale sets the loss scaler, which none of the rows of precisions (32-true, "
     "bf16-mixed) uses (only fp16 modes scale the loss)"),
    (["16-mixed"], dict(max_bad_steps=3),
     "max_bad_steps stops a run without a loss scaler; each of the rows of precisions "
     "(16-mixed) has one, whose floor min_scale stops it instead"),
    (["16-mixed", "bf16-mixed"], dict(init_scale=1024.0, max_bad_steps=3), None),
    (["bf16-mixed", "mxfp4"], dict(mx_scale="rceil"), None),
    (["bf16-mixed"], dict(mx_scale="rceil"),
     "mx_scale rceil does nothing in any row of precisions (bf16-mixed): it chooses the "
     "block scales of mxfp8 and mxfp4"),
])
def test_a_study_warns_once_about_an_option_no_row_reads(tmp_path, rows, options, expected):
    config = small_config(tmp_path / "out", model="mlp:32", **options)
    forget_warnings()   # warn() speaks once per process: an earlier test may have spoken
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AmptrainWarning)
        warn_unread(config, rows, "precisions")
    said = [str(w.message) for w in caught]
    assert said == ([] if expected is None else [expected])


@pytest.mark.slow
def test_a_compare_gives_each_row_its_options_and_warns_once_about_an_unread_one(
        tmp_path, caplog):
    """16-mixed, bf16-mixed, mxfp4 and a plan with an mxfp4 layer, with --init-scale,
    --mx-scale rceil and --nvfp4-without rht: the fp16 row trains (and saves) the scale and
    the MX rows rceil, the others their defaults; no row warns that an option does nothing
    in it; no row is nvfp4, so one warning names that option and the rows."""
    plan = tmp_path / "p.yaml"
    plan.write_text("layers:\n  body.3: mxfp4\n")
    out = tmp_path / "study"
    config = small_config(out, model="mlp:32", max_steps=2, mx_scale="rceil",
                          nvfp4_without="rht", init_scale=1024.0)
    forget_warnings()
    with warnings.catch_warnings(record=True) as caught, \
            caplog.at_level(logging.WARNING, logger="amptrain"):
        warnings.simplefilter("always", AmptrainWarning)
        run_compare(config, CompareOptions(
            precisions=f"16-mixed,bf16-mixed,mxfp4,plan:{plan}", baseline="bf16-mixed",
            seeds=1, timing_steps=1, timing_warmup=0, interleave=False), pick_log_every=False)
    said = [str(w.message) for w in caught if "does nothing" in str(w.message)
            or "loss scaler" in str(w.message)]
    said += [r.getMessage() for r in caplog.records if "loss scaler" in r.getMessage()
             or "does nothing" in r.getMessage()]
    assert said == [f"nvfp4_without rht does nothing in any row of precisions (bf16-mixed, "
                    f"16-mixed, mxfp4, plan:{plan}): it leaves a part of the nvfp4 "
                    f"training recipe out"]
    saved = {p.parent.parent.name: yaml.safe_load(p.read_text())
             for p in (out / "runs").glob("*/seed-0/config.yaml")}
    assert {name: (c["mx_scale"], c["nvfp4_without"], c["init_scale"])
            for name, c in saved.items()} == {
        "16-mixed": ("floor", "none", 1024.0), "bf16-mixed": ("floor", "none", 65536.0),
        "mxfp4": ("rceil", "none", 65536.0),
        f"plan-{str(plan).replace('/', '_')}": ("rceil", "none", 65536.0)}
    # the rows that read --mx-scale are shown with it; their labels (keys) stay the modes'
    details = json.loads((out / "study.json").read_text())
    assert details["row_names"] == {"mxfp4": "mxfp4 rceil", f"plan:{plan}": f"plan:{plan} rceil"}
    assert [r["precision"] for r in json.loads((out / "compare.json").read_text())[
        "summary"]] == ["bf16-mixed", "16-mixed", "mxfp4", f"plan:{plan}"]
    report = (out / "report.md").read_text()
    assert "| `mxfp4 rceil` (emulated) |" in report and "| `16-mixed` |" in report
    assert "| `mxfp4 rceil` | 0 |" in report   # its run, in the table of runs
    assert "mxfp4 rceil (emulated)" in (out / "report.html").read_text()
