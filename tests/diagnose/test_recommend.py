"""The recommender: a loss scale that removes gradient underflow, fp32 islands."""
from __future__ import annotations

import math

import pytest
from torch import nn

from amptrain.diagnose.ranges import FP16, FP16_MAX
from amptrain.diagnose.recommend import (
    SCALE_HEADROOM,
    attention_overflow,
    keep_fp32_candidates,
    run_scale_overflow,
)
from amptrain.diagnose.run import diagnose
from amptrain.precision.nonfinite import NonFiniteEvent
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


def test_attention_parts_are_named_and_merged_into_one_pattern_per_part():
    def entry(order, kind, act_max):
        return {"order": order, "type": kind, "input_abs_max": None,
                "activation": {"abs_max": act_max}}

    stats = {"blocks.0.attn.scores": entry(0, "AttentionScores", 2e5),
             "blocks.0.attn.softmax": entry(1, "CausalSoftmax", 1.0),
             "blocks.0.mlp.fc": entry(2, "Linear", 1e6),
             "blocks.3.attn.scores": entry(3, "AttentionScores", 9e5),
             "blocks.3.mlp.fc": entry(4, "Linear", 1e6)}
    keep = keep_fp32_candidates(stats, {}, "GPT", None)
    # Attention's parts share one glob; other layers stay named one by one.
    assert [k["pattern"] for k in keep] == ["blocks.*.attn.scores", "blocks.0.mlp.fc",
                                            "blocks.3.mlp.fc"]
    assert keep[0]["reason"].startswith("blocks.0.attn.scores: attention scores")
    assert keep[0]["reason"].endswith("; blocks.3.attn.scores too")

    found = attention_overflow(stats, None)
    assert found is not None and found["abs_max"] == 9e5
    assert found["modules"] == ["blocks.0.attn.scores", "blocks.3.attn.scores"]
    assert "--keep-fp32 '*.attn.scores'" in found["reason"] and "bf16" in found["reason"]
    # The softmax named as the first inf/NaN of 16-mixed counts too.
    quiet = {n: s for n, s in stats.items() if "scores" not in n}
    assert attention_overflow(quiet, None) is None
    softmax = attention_overflow(quiet, NonFiniteEvent("blocks.0.attn.softmax", "forward", 2))
    assert softmax is not None and softmax["modules"] == ["blocks.0.attn.softmax"]
    assert softmax["reason"].startswith("attention softmax")


def _shares(**lost: float) -> dict:
    """One module's shares: every format loses nothing except those named (flushed)."""
    formats = ("fp8", "fp8-rowwise", "mxfp8", "mxfp4", "nvfp4")
    return {fmt: {op: {"flushed": lost.get(fmt.replace("-", "_"), 0.0), "saturated": 0.0}
                  for op in ("activation", "weight", "gradient")} for fmt in formats}


def test_lowbit_advice_rowwise_more_mantissa_and_keeping_a_layer_out():
    from amptrain.diagnose.recommend import lowbit_advice
    quiet = lowbit_advice({"a": _shares()})
    assert quiet["advice"] == [] and quiet["worst"]["fp8"]["lost"] == 0.0
    rowwise = lowbit_advice({"a": _shares(fp8=0.05, fp8_rowwise=0.001)})["advice"]
    assert rowwise == ["fp8-rowwise rather than fp8: one scale per tensor loses 5.00% of a's "
                       "activation values, a scale per row 0.10%"]
    fp4 = lowbit_advice({"a": _shares(mxfp4=0.2, nvfp4=0.004)})["advice"]
    assert len(fp4) == 1 and fp4[0].startswith("a format with more mantissa than mxfp4: it "
                                               "loses 20.0% of a's activation values")
    keep = lowbit_advice({"a": _shares(fp8=0.05, fp8_rowwise=0.04, mxfp8=0.03, mxfp4=0.3)})
    assert keep["advice"][0] == ("keep a out of the low-bit formats (--keep-fp32 a): even "
                                 "mxfp8 loses 3.00% of its activation values")


def test_run_scale_overflow_names_leaves_largest_first_with_their_loss():
    def module(leaf, weight_grad, out_grad):
        return {"leaf": leaf, "param_gradient": {"abs_max": weight_grad},
                "gradient": {"abs_max": out_grad}}

    stats = {"critic": module(False, 0.0, 9.0),        # a container: its child's numbers
             "critic.0": module(True, 3.0, 0.01), "critic.2": module(True, 9.0, 0.5),
             "actor.0": module(True, 0.5, 0.001),       # 0.5 x 65536 < 65504: in range
             "kept.0": module(True, 50.0, 1.0)}         # in fp32 (--keep-fp32 kept)
    found = run_scale_overflow(stats, ["kept"], 65536.0, {"critic": "the value loss"})
    assert [(f["module"], f["kind"]) for f in found] == [("critic.2", "weight gradients"),
                                                         ("critic.0", "weight gradients")]
    assert found[0]["scaled"] == 9.0 * 65536 and found[0]["path"] == "critic"
    assert found[0]["loss"] == "the value loss"
    # No loss declared for a module: named all the same, without one.
    assert run_scale_overflow(stats, [], 65536.0)[0] == {
        "module": "kept.0", "kind": "weight gradients", "abs_max": 50.0,
        "scaled": 50.0 * 65536, "path": None, "loss": None}
    assert run_scale_overflow(stats, ["kept"], 1024.0) == []


def test_weightless_modules_that_pass_an_overflow_on_are_not_kept_in_fp32():
    """issue 49: GELU and Dropout after an overflowing Linear were advised into fp32,
    where they change nothing; the module that made the overflow is."""
    from collections import OrderedDict

    import torch

    from tests.diagnose.conftest import Scale

    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(
        body=nn.Sequential(nn.Linear(8, 32), nn.Tanh()), amplify=Scale(1e5),
        gelu=nn.GELU(), dropout=nn.Dropout(0.1), head=nn.Linear(32, 3)))
    report = diagnose(config(), steps=2, data=bundle(), model=model)
    keep = [k["pattern"] for k in report["recommendations"]["keep_fp32"]]
    assert "amplify" in keep and "gelu" not in keep and "dropout" not in keep
