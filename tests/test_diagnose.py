"""amptrain diagnose: range statistics, the first non-finite module, and recommendations
that really fix the fp16 problem they diagnose."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from amptrain.config import TrainConfig
from amptrain.data import DataBundle
from amptrain.diagnose import (FP16, FP16_MAX, SCALE_HEADROOM, RangeRecorder, RangeStats,
                               SAMPLE_LIMIT, diagnose, fractions, summarize, write_reports)
from amptrain.models.range_demos import Scale
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification

ROOT = Path(__file__).parents[1]


def scaled_model(factor: float, seed: int = 0) -> nn.Module:
    """Linear + Tanh, then a layer that multiplies activations by ``factor``, then a head."""
    torch.manual_seed(seed)
    return nn.Sequential(OrderedDict(
        body=nn.Sequential(nn.Linear(8, 32), nn.Tanh()),
        amplify=Scale(factor),
        head=nn.Linear(32, 3)))


def bundle(n: int = 256) -> DataBundle:
    return DataBundle(tiny_classification(n=n), None, 3, (8,), "features")


def config(**options) -> TrainConfig:
    base = dict(device="cpu", batch_size=32, no_progress=True, scheduler="none")
    return TrainConfig(**{**base, **options})


def train_16_mixed(factor: float, steps: int, **options) -> Trainer:
    trainer = Trainer(precision="16-mixed", device="cpu", batch_size=32, max_steps=steps,
                      epochs=steps, log_every=1, no_progress=True, scheduler="none", **options)
    trainer.fit(scaled_model(factor), bundle().train)
    return trainer


# ----------------------------------------------------------------- statistics
def test_tensor_stats_fractions_are_exact_for_known_values():
    values = torch.tensor([0.0, 1e-9, -1e-6, 1.0, 1e5, -7e4, 3e-5, 2.0 ** -140])
    stats = RangeStats()
    stats.add("x", values[:3])
    stats.add("y", torch.ones(5))   # another stream in the same batch
    stats.add("x", values[3:])      # the same stream twice
    hist, scalars = stats.read()["x"]
    s = summarize(hist, scalars)
    n = len(values)
    assert s["abs_max"] == pytest.approx(1e5)
    assert s["min_nonzero"] == pytest.approx(2.0 ** -140)
    assert s["zeros"] == pytest.approx(1 / n)
    # fp16: 1e5 and 7e4 overflow; 1e-9, 1e-6, 3e-5, 2**-140 are below 2**-14;
    # 1e-9 and 2**-140 are below 2**-25 and round to zero.
    assert s["fp16"] == pytest.approx({"above_max": 2 / n, "below_min_normal": 4 / n,
                                       "flushed_to_zero": 2 / n})
    # bf16 holds everything except 2**-140 (below its smallest subnormal, 2**-133).
    assert s["bf16"] == pytest.approx({"above_max": 0.0, "below_min_normal": 1 / n,
                                       "flushed_to_zero": 1 / n})
    # Scaling by 2**10 shifts the histogram: 3e-5 and 1e-6 become normal, 1e-9 stays sub-normal.
    assert fractions(hist, FP16, 10)["below_min_normal"] == pytest.approx(2 / n)


def test_large_tensors_are_sampled_but_abs_max_sees_every_value():
    x = torch.randn(1_000_003)
    x[123_457] = 9e5  # almost surely not on the sampling stride
    stats = RangeStats()
    stats.add("x", x)
    hist, scalars = stats.read()["x"]
    assert hist.sum() <= 2 * SAMPLE_LIMIT
    assert scalars[0] == pytest.approx(9e5)


def test_gradient_hooks_work_with_inplace_relu():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(inplace=True), nn.Linear(6, 2))
    x = torch.randn(5, 4)
    recorder = RangeRecorder(model)
    model(x).pow(2).sum().backward()
    recorder.remove()
    stats = recorder.read()
    # The gradient at the first Linear's output is the ReLU-masked one.
    hidden = model[0](x)
    out = model[2](torch.relu(hidden))
    (grad,) = torch.autograd.grad(out.pow(2).sum(), hidden)
    assert stats["0"]["gradient"]["abs_max"] == pytest.approx(grad.abs().max().item())
    assert stats["0"]["param_gradient"]["abs_max"] == pytest.approx(
        max(model[0].weight.grad.abs().max().item(), model[0].bias.grad.abs().max().item()))
    assert stats["Sequential"]["activation"]["abs_max"] == pytest.approx(out.abs().max().item())
    # The Linear's outputs were sampled before the in-place ReLU zeroed half of them.
    assert stats["0"]["activation"]["abs_max"] == pytest.approx(hidden.abs().max().item())
    assert stats["0"]["activation"]["zeros"] == 0.0 and stats["1"]["activation"]["zeros"] > 0


# -------------------------------------------------------------------- overflow
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


# ------------------------------------------------------------------- underflow
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


def test_reports_are_written(tmp_path):
    report = diagnose(config(), steps=2, data=bundle(64), model=scaled_model(1e5))
    json_path, md_path = write_reports(report, tmp_path)
    loaded = json.loads(json_path.read_text())
    assert loaded["first_nonfinite"]["module"] == "amplify"
    md = md_path.read_text()
    assert "| `amplify` |" in md
    assert md.index("| `amplify` |") < md.index("| `body.0` |")  # riskiest first


# ------------------------------------------------------------------------ CLI
def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "amptrain", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_diagnose_writes_json_and_markdown(tmp_path):
    data = tiny_classification(n=128)
    np.savez(tmp_path / "data.npz", x=data.tensors[0].numpy(), y=data.tensors[1].numpy())
    out = tmp_path / "diag"
    result = _cli("diagnose", "--model", "demo-overflow", "--data", f"npz:{tmp_path / 'data.npz'}",
                  "--steps", "3", "--batch-size", "32", "--device", "cpu", "--out", str(out),
                  cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "diagnose.json").read_text())
    assert report["first_nonfinite"]["module"] == "scale"
    assert {"modules", "recommendations", "runs"} <= set(report)
    assert (out / "diagnose.md").read_text().startswith("# amptrain diagnose")
    assert "first non-finite in 16-mixed: module 'scale' (forward) at step 1" in result.stdout
    assert "--keep-fp32 scale" in result.stdout


def test_cli_diagnose_rejects_bad_steps(tmp_path):
    result = _cli("diagnose", "--steps", "0", "--out", str(tmp_path / "x"), cwd=tmp_path)
    assert result.returncode == 2
    assert "--steps" in result.stderr and "Traceback" not in result.stderr
