"""The recommender: a loss scale that removes gradient underflow, fp32 islands."""
from __future__ import annotations

import math

import pytest
from torch import nn

from amptrain.diagnose.ranges import FP16, FP16_MAX
from amptrain.diagnose.recommend import SCALE_HEADROOM, keep_fp32_candidates
from amptrain.diagnose.run import diagnose
from amptrain.probe import NonFiniteEvent
from tests.diagnose.conftest import bundle, config, scaled_model


def test_recommended_loss_scale_removes_gradient_underflow():
    report = diagnose(config(), steps=4, data=bundle(), model=scaled_model(1e-3))
    scale = report["recommendations"]["loss_scale"]
    s = scale["init_scale"]

    assert scale["unscaled"]["below_min_normal"] > 0.5   # most gradients underflow fp16 as-is
    assert scale["scaled"]["below_min_normal"] < 1e-3    # ... and ~none at the recommended scale
    assert scale["scaled"]["above_max"] == 0.0
    # The largest power of two that keeps the largest gradient SCALE_HEADROOM below max.
    assert scale["grad_abs_max"] * s * SCALE_HEADROOM <= FP16_MAX
    assert scale["grad_abs_max"] * 2 * s * SCALE_HEADROOM > FP16_MAX

    # The per-module histograms in diagnose.json show the same: shift by log2(scale).
    body = report["modules"]["body.0"]["gradient"]
    hist = {int(e): c for e, c in body["log2_histogram"].items()}
    total = body["values_sampled"]
    below = sum(c for e, c in hist.items() if e < FP16.min_normal_log2) / total
    below_scaled = sum(c for e, c in hist.items()
                       if e + math.log2(s) < FP16.min_normal_log2) / total
    assert below == pytest.approx(body["fp16"]["below_min_normal"]) and below > 0.9
    assert below_scaled == pytest.approx(body["fp16_at_recommended_scale"]["below_min_normal"])
    assert below_scaled < 1e-2
    assert report["recommendations"]["keep_fp32"] == []


def test_keep_fp32_names_the_most_specific_module_and_skips_what_the_user_keeps():
    def entry(order, act_max=None, input_max=None):
        return {"order": order, "input_abs_max": input_max,
                "activation": None if act_max is None else {"abs_max": act_max}}

    stats = {"Net": entry(6, act_max=1e6),             # the model itself: never a candidate
             "body": entry(1, act_max=1e6),            # covered by its child body.0
             "body.0": entry(0, act_max=1e6),
             "norm": entry(2, act_max=1.0, input_max=1e6),   # norms do not cast to fp16
             "head": entry(3, act_max=1.0, input_max=1e6),   # a Linear does
             "mine": entry(4, act_max=1e6),            # the user keeps it already
             "drop": entry(5, act_max=1.0)}
    modules = {"norm": nn.LayerNorm(2), "head": nn.Linear(2, 2)}
    first = NonFiniteEvent("drop", "forward", 3)
    keep = keep_fp32_candidates(stats, modules, "Net", first, ["mine"])
    assert [k["pattern"] for k in keep] == ["body.0", "head", "drop"]  # in forward order
    reasons = {k["pattern"]: k["reason"] for k in keep}
    assert "above fp16's max" in reasons["body.0"]
    assert "autocast would cast them to fp16" in reasons["head"]
    assert reasons["drop"] == "first module to produce inf/NaN in 16-mixed (forward, step 3)"
    # A backward event is a gradient problem: loss scaling, not an fp32 island.
    assert "drop" not in [k["pattern"] for k in keep_fp32_candidates(
        stats, modules, "Net", NonFiniteEvent("drop", "backward", 3), ["mine"])]
