"""The tracer: exact range statistics, sampling, and hooks that survive in-place layers."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from amptrain.diagnose.ranges import (
    FP16,
    SAMPLE_LIMIT,
    RangeRecorder,
    RangeStats,
    fractions,
    summarize,
)


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


def test_lowbit_recorder_counts_what_each_format_loses_per_eligible_linear():
    from amptrain.diagnose.ranges import LowBitRecorder
    from amptrain.precision.lowbit_operand import Quantiser, flushed_and_saturated
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 48), nn.ReLU(),
                          nn.Linear(48, 2))
    recorder = LowBitRecorder(model)
    # the middle Linear: dims 64 and 48 are multiples of 16 but 48 is not of 32
    sixteen = ["fp8", "fp8-rowwise", "fp8-rowwise-gw-hp", "nvfp4", "nvfp4-plain"]
    assert recorder.formats == {"2": sixteen}
    x = torch.randn(32, 8)
    hidden = model[1](model[0](x)).detach()
    out = model(x)
    out.pow(2).sum().backward()
    shares = recorder.read()
    recorder.remove()
    assert set(shares["2"]) == set(sixteen)
    assert set(shares["2"]["nvfp4"]) == {"activation", "weight", "gradient"}
    flushed, saturated = flushed_and_saturated(hidden, Quantiser("nvfp4", "e2m1"))
    assert shares["2"]["nvfp4"]["activation"] == {"flushed": flushed, "saturated": saturated}
    flushed, saturated = flushed_and_saturated(model[2].weight, Quantiser("tensorwise", "e4m3"))
    assert shares["2"]["fp8"]["weight"] == {"flushed": flushed, "saturated": saturated}
    # the NVFP4 recipe's weights in 16x16 blocks
    flushed, saturated = flushed_and_saturated(model[2].weight,
                                               Quantiser("nvfp4", "e2m1", square=True))
    assert shares["2"]["nvfp4"]["weight"] == {"flushed": flushed, "saturated": saturated}
    assert shares["2"]["fp8"]["activation"]["saturated"] == 0.0   # amax maps to 448
