"""precision/hardware/peak_rates.py: the Linear-matmul speedup estimate from published
dense peak rates."""
from __future__ import annotations

import pytest

from amptrain.precision.hardware.peak_rates import matmul_speedup_estimate, speed_estimates


def test_the_estimate_weighs_each_layer_by_its_flops_at_its_formats_peak():
    flops = {"a": 1000, "b": 1000}
    # B200: a at 9000 TFLOPS, b at bf16's 2250: (2 / 2250) / (1 / 2250 + 1 / 9000) = 1.6
    assert matmul_speedup_estimate(flops, {"a": "mxfp4"}, "B200") == pytest.approx(1.6)
    assert matmul_speedup_estimate(flops, {"a": "fp8", "b": "fp8"}, "H100") == \
        pytest.approx(1979 / 989)
    assert matmul_speedup_estimate(flops, {}, "H100") == pytest.approx(1.0)


def test_a_format_without_hardware_on_a_gpu_has_no_estimate():
    assert speed_estimates({"a": 1}, {"a": "nvfp4"}) == {"H100": None, "B200": 4.0}
