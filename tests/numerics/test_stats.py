"""numerics/stats.py: the telemetry's numbers against a direct computation on a tensor."""
from __future__ import annotations

import math

import pytest
import torch

from amptrain.numerics.stats import (EXACT_SNR_DB, WHATIF, WHATIF_AT, as_rows, run_formats,
                                     tensor_stats, unpack)
from amptrain.precision.lowbit_formats import qdq_mx, qdq_tensorwise


def _field(vector: list[float], fmt: str, i: int) -> float:
    return vector[WHATIF_AT + 3 * list(WHATIF).index(fmt) + i]


def test_fp16_shares_and_amax_match_a_direct_count():
    # 4 values fp16 flushes (below half its smallest subnormal, 2**-25), 2 it saturates,
    # 2 zeros (not counted), the rest ordinary.
    x = torch.tensor([1e-9, -1e-9, 2e-8, 1e-10, 1e5, -7e4, 0.0, 0.0, 1.0, -3.0, 0.5, 2.0])
    v = tensor_stats(x, "fp16").tolist()
    assert v[0] == pytest.approx(1e5)
    assert _field(v, "fp16", 0) == pytest.approx(4 / 10)
    assert _field(v, "fp16", 1) == pytest.approx(2 / 10)
    # the run's own format is fp16: its fields are the fp16 what-if's
    assert v[1:3] == pytest.approx([4 / 10, 2 / 10])
    # bf16 holds every one of them (no flush, no saturation)
    assert _field(v, "bf16", 0) == 0 and _field(v, "bf16", 1) == 0


def test_snr_is_the_quantisation_error_of_the_format():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 64, generator=g)
    v = tensor_stats(x, "bf16").tolist()
    for fmt, q in (("bf16", x.bfloat16().float()),
                   ("fp8-e4m3", qdq_tensorwise(x, "e4m3")),
                   ("mxfp4", qdq_mx(x, "e2m1", -1))):
        direct = 10 * math.log10(float(x.square().sum() / (x - q).square().sum()))
        assert _field(v, fmt, 2) == pytest.approx(direct, abs=1e-3)
    # coarser formats lose more
    assert _field(v, "bf16", 2) > _field(v, "fp8-e4m3", 2) > _field(v, "mxfp4", 2)


def test_values_a_format_holds_exactly_report_the_exact_snr():
    x = torch.tensor([1.0, 2.0, -0.5, 4.0])
    v = tensor_stats(x, "fp32").tolist()
    assert _field(v, "fp16", 2) == EXACT_SNR_DB and v[1:3] == [0.0, 0.0]


def test_nonfinite_values_show_in_amax_only():
    v = tensor_stats(torch.tensor([1.0, float("inf"), 2.0]), "bf16").tolist()
    assert math.isinf(v[0])
    record = unpack(v, "bf16")
    assert record["amax"] is None and record["flushed"] == 0.0


def test_rows_follow_the_reduction_axis_and_are_capped():
    w = torch.randn(4, 3, 2, 2)
    assert as_rows(w, weight=True).shape == (4, 12)
    assert as_rows(torch.randn(1000, 128)).shape == (128, 128)


def test_run_formats():
    assert run_formats("fp8") == {"activation": "fp8-e4m3", "weight": "fp8-e4m3",
                                  "gradient": "fp8-e5m2"}
    assert set(run_formats("16-mixed").values()) == {"fp16"}
    assert set(run_formats("bf16-true").values()) == {"bf16"}
    assert set(run_formats("32-true").values()) == {"fp32"}
    assert set(run_formats("nvfp4-plain").values()) == {"nvfp4"}
