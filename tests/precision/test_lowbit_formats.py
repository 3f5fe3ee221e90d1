"""The low-bit quantisers, bit for bit: each against an explicit reference computation
(every representable value of the format enumerated, nearest chosen in float64, ties to the
even code) and, where torchao runs on the CPU, against torchao's own quantisers."""
from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from amptrain.precision.lowbit_formats import (E2M1_MAX, E4M3_MAX, E5M2_MAX, Quantiser,
                                               e8m0_exponent, flushed_and_saturated,
                                               qdq_mx, qdq_nvfp4, qdq_rowwise,
                                               qdq_tensorwise, round_e2m1, round_fp8)
from amptrain.common.quiet import quiet_torchao

HAS_TORCHAO = importlib.util.find_spec("torchao") is not None
needs_torchao = pytest.mark.skipif(not HAS_TORCHAO, reason="torchao is not installed")


def grid(ebits: int, mbits: int, largest: float) -> list[float]:
    """Every non-negative value of a float format (bias 2^(ebits-1)-1, subnormals, no
    inf), in code order, up to ``largest``: code i is the i-th value."""
    bias = 2 ** (ebits - 1) - 1
    values = []
    for code in range(2 ** (ebits + mbits)):
        exponent, mantissa = divmod(code, 2 ** mbits)
        value = (mantissa / 2 ** mbits) * 2.0 ** (1 - bias) if exponent == 0 else \
            (1 + mantissa / 2 ** mbits) * 2.0 ** (exponent - bias)
        if value > largest:
            break
        values.append(value)
    return values


E4M3_GRID = grid(4, 3, E4M3_MAX)
E5M2_GRID = grid(5, 2, E5M2_MAX)
E2M1_GRID = grid(2, 1, E2M1_MAX)


def reference_round(values: torch.Tensor, table: list[float]) -> torch.Tensor:
    """Round to the nearest value of ``table`` (ties to the even code), saturating at its
    largest; NaN stays NaN. Computed value by value in float64."""
    out = []
    for v in values.double().tolist():
        if math.isnan(v):
            out.append(math.nan)
            continue
        magnitude = min(abs(v), table[-1])
        best = min(range(len(table)),
                   key=lambda i: (abs(table[i] - magnitude), i % 2))   # tie: even code
        out.append(math.copysign(table[best], v))
    return torch.tensor(out, dtype=torch.float32)


def probes(table: list[float]) -> torch.Tensor:
    """Every value, every midpoint (the ties), a hair either side of each midpoint, values
    past the largest, inf, NaN and both zeros, with both signs."""
    mids = [(a + b) / 2 for a, b in zip(table, table[1:])]
    values = table + mids + [m * (1 + 2 ** -20) for m in mids] + \
        [m * (1 - 2 ** -20) for m in mids] + [table[-1] * 1.06, table[-1] * 4, 1e30,
                                              table[1] / 4, table[1] / 2, table[1] * 0.75]
    signed = torch.tensor(values + [-v for v in values], dtype=torch.float32)
    return torch.cat([signed, torch.tensor([math.inf, -math.inf, 0.0, -0.0])])


@pytest.mark.parametrize("elem,table", [("e4m3", E4M3_GRID), ("e5m2", E5M2_GRID)])
def test_fp8_rounding_ties_saturation_and_subnormals_match_the_reference(elem, table):
    x = probes(table)
    got = round_fp8(x, elem)
    assert torch.equal(got, reference_round(x, table))
    assert round_fp8(torch.tensor([math.nan]), elem).isnan().all()
    assert got.abs().max() == table[-1]           # inf saturates to the largest value
    assert table[1] == (2.0 ** -9 if elem == "e4m3" else 2.0 ** -16)   # smallest subnormal


def test_e2m1_rounding_matches_the_reference():
    assert E2M1_GRID == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    x = probes(E2M1_GRID)
    assert torch.equal(round_e2m1(x), reference_round(x, E2M1_GRID))
    assert round_e2m1(torch.tensor([math.nan])).isnan().all()
    # the ties, spelled out: to the even code
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert round_e2m1(ties).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]


def reference_tensorwise(x: torch.Tensor, table: list[float], fmax: float) -> torch.Tensor:
    amax = x.abs().max().double().clamp(min=1e-12)
    scale = (fmax / amax).float()
    return reference_round((x * scale).flatten(), table).reshape(x.shape) / scale


def test_tensorwise_scale_and_values_match_the_reference():
    torch.manual_seed(0)
    x = torch.randn(8, 32) * 3.7
    assert torch.equal(qdq_tensorwise(x, "e4m3"), reference_tensorwise(x, E4M3_GRID, E4M3_MAX))
    assert torch.equal(qdq_tensorwise(x, "e5m2"), reference_tensorwise(x, E5M2_GRID, E5M2_MAX))
    assert torch.equal(qdq_tensorwise(torch.zeros(4), "e4m3"), torch.zeros(4))
    x[2, 3] = math.nan                                 # a NaN amax: the whole tensor NaN
    assert qdq_tensorwise(x, "e4m3").isnan().all()


def test_rowwise_uses_a_power_of_two_scale_per_row():
    torch.manual_seed(1)
    x = torch.randn(6, 32) * torch.logspace(-4, 4, 6).unsqueeze(1)
    got = qdq_rowwise(x, "e4m3", -1)
    for row, out in zip(x, got):
        scale = 2.0 ** math.floor(math.log2(E4M3_MAX / float(row.abs().max())))
        assert torch.equal(out, reference_round(row * scale, E4M3_GRID) / scale)
    assert torch.equal(qdq_rowwise(x, "e4m3", 0), qdq_rowwise(x.t(), "e4m3", -1).t())


def reference_mx(block: torch.Tensor, table: list[float], emax: int) -> torch.Tensor:
    """OCP MX v1.0: X = 2^(floor(log2 amax) - emax), exponent clamped to [-127, 127]."""
    amax = float(block.abs().max())
    if math.isnan(amax):
        return torch.full_like(block, math.nan)
    exponent = -127 if amax == 0 else max(-127, min(127, math.frexp(amax)[1] - 1 - emax))
    scale = 2.0 ** exponent
    return reference_round(block / scale, table) * scale


@pytest.mark.parametrize("elem,table,emax", [("e4m3", E4M3_GRID, 8), ("e2m1", E2M1_GRID, 2)])
def test_mx_blocks_of_32_match_the_reference(elem, table, emax):
    torch.manual_seed(2)
    x = torch.randn(4, 96) * torch.logspace(-30, 30, 12).repeat_interleave(32)[:96]
    x[0, :32] = 0.0                                        # an all-zero block
    x[1, 32:64] = torch.tensor(table * 4)[-32:] * 2.0 ** 5  # representable values: exact
    x[2, 64] = math.nan                                    # a NaN block
    x[3, :32] = 2.0 ** -140                                # below e8m0's smallest scale
    got = qdq_mx(x, elem)
    for row in range(4):
        for start in range(0, 96, 32):
            block, out = x[row, start:start + 32], got[row, start:start + 32]
            assert torch.equal(out, reference_mx(block, table, emax)) or \
                (out.isnan().all() and reference_mx(block, table, emax).isnan().all())
    assert torch.equal(got[1, 32:64], x[1, 32:64])
    assert got[2, 64:96].isnan().all() and not got[2, :64].isnan().any()
    assert e8m0_exponent(torch.tensor([448.0, 1.0, 0.0]), "e4m3").tolist() == [0, -8, -127]


def test_mx_pads_a_partial_block_and_blocks_along_any_axis():
    torch.manual_seed(3)
    x = torch.randn(40, 64)
    assert torch.equal(qdq_mx(x, "e4m3", 0), qdq_mx(x.t().contiguous(), "e4m3", -1).t())
    padded = torch.cat([x, torch.zeros(24, 64)])           # 40 rows + zeros = 2 blocks
    assert torch.equal(qdq_mx(x, "e2m1", 0), qdq_mx(padded, "e2m1", 0)[:40])


def reference_nvfp4(x: torch.Tensor) -> torch.Tensor:
    tensor_scale = float(x.abs().max()) / (448.0 * 6.0)
    out = torch.empty_like(x)
    flat, result = x.reshape(-1, 16), out.view(-1, 16)
    for i, block in enumerate(flat):
        ratio = torch.tensor(float(block.abs().max()) / 6.0, dtype=torch.float32) / \
            torch.tensor(tensor_scale, dtype=torch.float32)
        block_scale = reference_round(ratio.clamp(2.0 ** -6, 448.0).reshape(1), E4M3_GRID)
        both = torch.tensor(tensor_scale, dtype=torch.float32) * block_scale
        reciprocal = (1.0 / torch.tensor(tensor_scale, dtype=torch.float32)) / block_scale
        result[i] = reference_round((block * reciprocal).clamp(-6, 6), E2M1_GRID) * both
    return out


def test_nvfp4_two_level_scales_match_the_reference():
    torch.manual_seed(4)
    x = torch.randn(4, 64) * torch.logspace(-3, 3, 4).repeat_interleave(64).reshape(4, 64)
    x[0, :16] = 0.0
    assert torch.equal(qdq_nvfp4(x), reference_nvfp4(x))


def test_flush_and_saturation_shares():
    ints = torch.tensor([1.0, 2.0, 3.0, 1e-6, 1000.0, 0.0] + [1.0] * 26)
    flushed, saturated = flushed_and_saturated(ints, Quantiser("mx", "e2m1"))
    # amax 1000 -> scale 2^(9-2) = 128: every 1, 2, 3 and 1e-6 flushes (below 0.25 x 128);
    # 1000/128 = 7.8 is clamped at 6
    assert flushed == pytest.approx(30 / 31) and saturated == pytest.approx(1 / 31)
    assert flushed_and_saturated(torch.randn(64), Quantiser("tensorwise", "e4m3"))[1] == 0.0
    assert flushed_and_saturated(torch.zeros(8), Quantiser("tensorwise", "e4m3")) == (0.0, 0.0)


# ------------------------------------------------------------ against torchao
@needs_torchao
@pytest.mark.parametrize("elem", ["e4m3", "e2m1"])
def test_mx_agrees_with_torchao_to_mx(elem):
    with quiet_torchao():
        from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
    dtype = torch.float8_e4m3fn if elem == "e4m3" else torch.float4_e2m1fn_x2
    torch.manual_seed(5)
    x = torch.randn(64, 128) * torch.logspace(-3, 3, 128)
    scale, data = to_mx(x, dtype, 32)
    assert torch.equal(qdq_mx(x, elem), to_dtype(data, scale, dtype, 32, torch.float32))


@needs_torchao
def test_nvfp4_agrees_with_torchao_nvfp4_quantize():
    with quiet_torchao():
        from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
        from torchao.prototype.mx_formats.nvfp4_tensor import (nvfp4_quantize,
                                                               per_tensor_amax_to_scale)
    torch.manual_seed(6)
    x = torch.randn(32, 128) * torch.logspace(-2, 2, 128)
    tensor_scale = per_tensor_amax_to_scale(x.abs().amax())
    scales, packed = nvfp4_quantize(x, 16, tensor_scale)
    values = f4_unpacked_to_f32(unpack_uint4(packed.view(torch.uint8))).reshape(32, 8, 16)
    theirs = (values * (tensor_scale * scales.float()).unsqueeze(-1)).reshape(32, 128)
    assert torch.equal(qdq_nvfp4(x), theirs)


@needs_torchao
@pytest.mark.parametrize("elem,rowwise", [("e4m3", False), ("e5m2", False), ("e4m3", True)])
def test_fp8_scales_agree_with_torchao(elem, rowwise):
    with quiet_torchao():
        from torchao.float8.config import ScalingGranularity
        from torchao.float8.float8_utils import tensor_to_scale, to_fp8_saturated
    dtype = torch.float8_e4m3fn if elem == "e4m3" else torch.float8_e5m2
    torch.manual_seed(7)
    x = torch.randn(16, 64) * torch.logspace(-5, 5, 16).unsqueeze(1)
    granularity = ScalingGranularity.AXISWISE if rowwise else ScalingGranularity.TENSORWISE
    scale = tensor_to_scale(x, dtype, scaling_granularity=granularity,
                            axiswise_dim=-1 if rowwise else None,
                            round_scales_to_power_of_2=rowwise)
    theirs = to_fp8_saturated(x * scale, dtype).float() / scale
    mine = qdq_rowwise(x, elem, -1) if rowwise else qdq_tensorwise(x, elem)
    assert torch.equal(mine, theirs)
