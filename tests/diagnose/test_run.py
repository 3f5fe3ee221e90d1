"""The diagnosis runs: the overflowing module is found, and its recommendation trains cleanly."""
from __future__ import annotations

import math

from amptrain.diagnose.ranges import FP16_MAX
from amptrain.diagnose.run import diagnose
from tests.diagnose.conftest import bundle, config, scaled_model, train_16_mixed


def test_overflow_module_is_found_and_its_recommendation_trains_cleanly():
    report = diagnose(config(), steps=4, data=bundle(), model=scaled_model(1e5))

    first = report["first_nonfinite"]
    assert (first["module"], first["phase"], first["step"]) == ("amplify", "forward", 1)
    assert report["modules"]["amplify"]["activation"]["abs_max"] > FP16_MAX
    assert next(iter(report["modules"])) == "amplify"  # riskiest first
    recs = report["recommendations"]
    keep = [k["pattern"] for k in recs["keep_fp32"]]
    assert "amplify" in keep
    assert all(k["reason"] for k in recs["keep_fp32"])
    assert report["runs"]["16-mixed"]["skipped_steps"] == 4
    assert recs["verified"]["clean"]
    assert recs["bf16"]["avoids_problem"]

    # Without the recommendation 16-mixed skips every step; with it, none.
    plain = train_16_mixed(1e5, steps=10, min_scale=2.0 ** -10)
    assert plain.precision.skipped_steps == 10
    fixed = train_16_mixed(1e5, steps=10, keep_fp32=keep, init_scale=recs["init_scale"],
                           min_scale=min(1.0, recs["init_scale"]))
    assert fixed.precision.skipped_steps == 0
    losses = [r["loss"] for r in fixed.history if "loss" in r]
    assert len(losses) == 10 and all(math.isfinite(v) for v in losses)
