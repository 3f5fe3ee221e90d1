"""The memory ladder (compare.ladder): exact bytes of weights, grads, masters and optimizer
state for every rung, and compare's rows for the rungs (``bf16-true+kahan``)."""
from __future__ import annotations

import contextlib
import json

import pytest
import torch
from torch import nn

from amptrain.compare import CompareOptions, resolve_precisions, run_compare
from amptrain.compare.ladder import LADDER_FIELDS, memory_ladder
from amptrain.compare.options import row_options
from amptrain.common.errors import UserError
from amptrain.precision import Precision
from tests.compare.conftest import SUMMARY_FIELDS, small_config


def _ladder(mode: str, rule: str = "plain") -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    precision = Precision(mode, device="cpu", weight_update=rule)
    model, optimizer = precision.setup(model, optimizer)
    with precision.autocast():
        loss = model(torch.randn(4, 32).to(next(model.parameters()).dtype)).float().sum()
    precision.backward(loss)
    precision.step(optimizer)
    return memory_ladder(model, optimizer, precision)


N = 32 * 64 + 64 + 64 * 8 + 8          # parameters
STEPS = 4 * 4                           # a 0-d fp32 step counter per tensor (foreach AdamW)


@pytest.mark.parametrize("mode, rule, per_param", [
    ("32-true", "plain", (4, 4, 0, 8)),
    ("bf16-mixed", "plain", (4, 4, 0, 8)),
    ("bf16-master", "plain", (2, 4, 4, 8)),     # fp32 grads of the masters, fp32 moments
    ("bf16-true", "plain", (2, 2, 0, 4)),
    ("bf16-true", "kahan", (2, 2, 2, 4)),       # the compensation counts as master bytes
    ("bf16-true", "stochastic", (2, 2, 0, 4)),
])
def test_each_rung_counts_exact_bytes(mode, rule, per_param):
    ladder = _ladder(mode, rule)
    weights, grads, masters, state = (b * N for b in per_param)
    assert ladder == {"weights_bytes": weights, "grad_bytes": grads, "master_bytes": masters,
                      "optimizer_state_bytes": state + STEPS,
                      "bytes_per_param": (weights + grads + masters + state + STEPS) / N,
                      "lowbit_flops_share": ladder["lowbit_flops_share"],
                      "est_matmul_speedup_h100": None, "est_matmul_speedup_b200": None}
    assert ladder["lowbit_flops_share"] in (0.0, None)   # no low-bit layer in these modes
    assert tuple(ladder) == LADDER_FIELDS


def test_rows_name_their_rung_and_the_run_options_follow():
    options = CompareOptions(precisions="32-true,bf16-true,bf16-true+stochastic+adamw8bit")
    assert resolve_precisions(options, torch.device("cpu"), weight_update="kahan") == (
        "32-true", ["32-true", "bf16-true+kahan", "bf16-true+stochastic+adamw8bit"])
    assert row_options("bf16-true+kahan") == {"precision": "bf16-true", "weight_update": "kahan"}
    assert row_options("bf16-true+stochastic+adamw8bit") == {
        "precision": "bf16-true", "weight_update": "stochastic", "optimizer": "adamw8bit"}
    assert row_options("32-true") == {"precision": "32-true", "weight_update": "plain"}


@pytest.mark.parametrize("precisions, message", [
    ("32-true,bf16-mixed+kahan", "precisions: bf16-mixed\\+kahan: a weight-update rule only"),
    ("bf16-true+round", "precisions: 'bf16-true\\+round': after the precision come"),
    ("bf16-true+kahan+stochastic", "at most one of plain, kahan, stochastic"),
])
def test_a_rung_that_cannot_be_is_refused_naming_the_option(precisions, message):
    with pytest.raises(UserError, match=message):
        resolve_precisions(CompareOptions(precisions=precisions), torch.device("cpu"))


def test_a_study_reports_the_ladder_per_row(tmp_path):
    out = tmp_path / "ladder"
    result = run_compare(small_config(out, weight_update="kahan"), CompareOptions(
        precisions="32-true,bf16-true,bf16-true+stochastic", bench_steps=2, timing_warmup=1,
        interleave=False))
    rows = {r["precision"]: r for r in result["summary"]}
    assert list(rows) == ["32-true", "bf16-true+kahan", "bf16-true+stochastic"]
    for row in rows.values():
        assert list(row) == SUMMARY_FIELDS
        assert all(row[k] > 0 for k in LADDER_FIELDS
                   if k not in ("master_bytes", "lowbit_flops_share", "est_matmul_speedup_h100",
                                "est_matmul_speedup_b200"))
    fp32, kahan, stochastic = rows.values()
    # The cnn's BatchNorm stays fp32: a few parameters are not halved (nor compensated).
    assert 0.5 * fp32["weights_bytes"] < kahan["weights_bytes"] < 0.55 * fp32["weights_bytes"]
    assert 0.9 * kahan["weights_bytes"] < kahan["master_bytes"] < kahan["weights_bytes"]
    assert stochastic["master_bytes"] == 0
    assert fp32["bytes_per_param"] > kahan["bytes_per_param"] > stochastic["bytes_per_param"]
    saved = json.loads((out / "compare.json").read_text())
    assert saved["summary"][1]["bytes_per_param"] == kahan["bytes_per_param"]
    assert (out / "compare.png").stat().st_size > 0


@pytest.mark.parametrize("mode,copy_bytes", [
    ("fp8", 128 * 128 + 4),                     # e4m3 values + one fp32 scale
    ("fp8-rowwise", 128 * 128 + 4 * 128),       # + one fp32 scale per row
    ("mxfp8", 128 * 128 + 128 * 128 // 32),     # + one e8m0 byte per 32
    ("mxfp4", 128 * 128 // 2 + 128 * 128 // 32),
    ("nvfp4-plain", 128 * 128 // 2 + 128 * 128 // 16 + 4),   # e4m3 per 16, fp32 per tensor
    ("nvfp4", 128 * 128 // 2 + 128 * 128 // 256 + 4),        # e4m3 per 16x16 block
    ("fp8-rowwise-gw-hp", 128 * 128 + 4 * 128),
    ("fp8-blockwise", 128 * 128 + 4)])                        # one fp32 per 128x128 block
def test_low_bit_rungs_count_the_weight_copy_and_its_scales(mode, copy_bytes):
    def ladder(name: str) -> dict:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                              nn.Linear(128, 8))          # only the middle one is eligible
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with pytest.warns() if name != "bf16-mixed" else contextlib.nullcontext():
            precision = Precision(name, device="cpu")
            precision.setup(model, optimizer)
        with precision.autocast():
            loss = model(torch.randn(4, 32)).float().sum()
        precision.backward(loss)
        precision.step(optimizer)
        return memory_ladder(model, optimizer, precision)

    base, low = ladder("bf16-mixed"), ladder(mode)
    assert low["weights_bytes"] - base["weights_bytes"] == copy_bytes
    assert low["grad_bytes"] == base["grad_bytes"]
    assert low["optimizer_state_bytes"] == base["optimizer_state_bytes"]
    assert low["bytes_per_param"] > base["bytes_per_param"]
    # the middle Linear's 128x128 of the 32x128 + 128x128 + 128x8 multiply-adds per token
    assert low["lowbit_flops_share"] == pytest.approx(128 * 128 / (32 * 128 + 128 * 128 + 128 * 8))
    assert base["lowbit_flops_share"] == 0.0


def _lowbit_ladder(mode: str) -> dict:
    import warnings

    from amptrain.common.errors import AmptrainWarning

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AmptrainWarning)
        precision = Precision(mode, device="cpu")
        model, optimizer = precision.setup(model, optimizer)
    with precision.autocast():
        loss = model(torch.randn(4, 64)).float().sum()
    precision.backward(loss)
    precision.step(optimizer)
    return memory_ladder(model, optimizer, precision)


def test_lowbit_rows_carry_peak_rate_estimates_per_gpu(tmp_path):
    # the default rules convert the 128x128 layer: 16384 of 8192 + 16384 + 1024 FLOPs
    share = 16384 / (8192 + 16384 + 1024)
    fp8, mx = _lowbit_ladder("fp8"), _lowbit_ladder("mxfp4")
    assert fp8["lowbit_flops_share"] == mx["lowbit_flops_share"] == pytest.approx(share)
    # bf16 time over mixed time: (1 - share) / bf16 + share / format, both GPUs' rates
    assert fp8["est_matmul_speedup_h100"] == round(1 / (1 - share + share * 989 / 1979), 3)
    assert fp8["est_matmul_speedup_b200"] == round(1 / (1 - share + share / 2), 3)
    assert mx["est_matmul_speedup_h100"] is None       # no MXFP4 hardware on an H100
    assert mx["est_matmul_speedup_b200"] == round(1 / (1 - share + share / 4), 3)
    # a plan: each layer in its own format
    plan = tmp_path / "plan.yaml"
    plan.write_text("layers:\n  '0': fp8\n  '2': mxfp4\n")
    mixed = _lowbit_ladder(f"plan:{plan}")
    first = 8192 / (8192 + 16384 + 1024)
    assert mixed["est_matmul_speedup_b200"] == round(
        1 / (1 - first - share + first / 2 + share / 4), 3)
    assert mixed["est_matmul_speedup_h100"] is None


def test_the_recommendation_says_the_estimates_as_estimates():
    from amptrain.report.tables import speed_estimate

    rows = [{"precision": "bf16-mixed", "lowbit_flops_share": 0.0},
            {"precision": "mxfp4", "lowbit_flops_share": 0.64,
             "est_matmul_speedup_h100": None, "est_matmul_speedup_b200": 1.923}]
    line = speed_estimate(rows)
    assert line is not None and "an estimate, not measured" in line
    assert "mxfp4 1.92x on B200 (64 % of the Linear FLOPs)" in line
    assert "bf16-mixed" not in line
    assert speed_estimate(rows[:1]) is None
