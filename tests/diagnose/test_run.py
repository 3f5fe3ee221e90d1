"""The diagnosis runs: the overflowing module is found, and its recommendation trains cleanly."""
from __future__ import annotations

import math

from amptrain.diagnose.ranges import FP16_MAX
from amptrain.diagnose.run import diagnose
from amptrain.diagnose.writer import write_reports
from tests.diagnose.conftest import (
    bundle,
    config,
    inflated_gpt,
    lm_bundle,
    scaled_model,
    train_16_mixed,
)


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


def test_gpt_attention_scores_that_overflow_fp16_are_named(tmp_path):
    report = diagnose(config(task="lm", lr=1e-4), steps=3, data=lm_bundle(),
                      model=inflated_gpt(3000.0))

    first = report["first_nonfinite"]
    assert (first["module"], first["phase"], first["step"]) == \
        ("blocks.0.attn.scores", "forward", 1)
    scores = report["modules"]["blocks.0.attn.scores"]
    assert scores["type"] == "AttentionScores"
    assert scores["activation"]["abs_max"] > FP16_MAX
    assert any("attention scores" in r for r in scores["reasons"])
    # q and k themselves fit in fp16: the overflow is in their products.
    assert report["modules"]["blocks.0.attn.qkv"]["activation"]["abs_max"] < FP16_MAX
    recs = report["recommendations"]
    assert recs["attention"]["modules"] == ["blocks.0.attn.scores", "blocks.1.attn.scores"]
    assert [k["pattern"] for k in recs["keep_fp32"]] == ["blocks.*.attn.scores"]
    assert "--keep-fp32 'blocks.*.attn.scores'" in recs["flags"]
    assert recs["verified"]["clean"] and recs["bf16"]["avoids_problem"]

    _, md = write_reports(report, tmp_path)
    text = md.read_text()
    assert "- attention: attention scores" in text and "`blocks.0.attn.scores`" in text


def test_gpt_attention_in_range_is_not_named():
    report = diagnose(config(task="lm"), steps=2, data=lm_bundle(), model=inflated_gpt(1.0))
    assert report["first_nonfinite"] is None
    assert report["recommendations"]["attention"] is None
    assert report["recommendations"]["keep_fp32"] == []
    # The recorder saw the attention's scores and softmax although training fuses them.
    assert report["modules"]["blocks.1.attn.softmax"]["activation"]["abs_max"] <= 1.0
