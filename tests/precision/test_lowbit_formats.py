"""The low-bit quantisers, bit for bit: each against an explicit reference computation
(every representable value of the format enumerated, nearest chosen in float64, ties to the
even code) and, where torchao runs on the CPU, against torchao's own quantisers."""
from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from amptrain.precision.lowbit_formats import (E2M1_MAX, E4M3_MAX, E5M2_MAX,
                                               _round_e2m1_below_7_, _round_in_range_,
                                               e8m0_exponent, qdq_fp8_blocks, qdq_mx,
                                               qdq_nvfp4, qdq_rowwise, qdq_tensorwise,
                                               round_e2m1, round_fp8, round_to_format_)
from amptrain.precision.lowbit_operand import Quantiser, flushed_and_saturated
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


@pytest.mark.parametrize("quantise", [
    lambda x, dim: qdq_mx(x, "e4m3", dim), lambda x, dim: qdq_mx(x, "e2m1", dim, mode="rceil"),
    qdq_nvfp4, qdq_fp8_blocks], ids=["mxfp8", "mxfp4-rceil", "nvfp4", "fp8-blocks"])
def test_blocks_along_an_inner_axis_are_the_last_axis_blocks_bit_for_bit(quantise):
    """Blocks along an axis other than the last are quantised in the tensor's own layout
    (no transposed copy): the same bits as moving that axis last, partial blocks, NaN,
    inf, zeros and subnormals included (NaN compared as NaN: its payload may differ)."""
    torch.manual_seed(4)
    x = torch.randn(3, 150, 7) * torch.logspace(-30, 30, 7)
    flat = x.view(-1)
    flat[::97], flat[5::101], flat[7::89], flat[11::53] = math.nan, math.inf, 0.0, 1e-40
    for dim in (0, 1):
        ours = quantise(x, dim)
        moved = quantise(x.movedim(dim, -1).contiguous(), -1).movedim(-1, dim)
        assert torch.equal(ours.isnan(), moved.isnan())
        assert torch.equal(ours.nan_to_num(0.0).view(torch.int32),
                           moved.nan_to_num(0.0).view(torch.int32))


def reference_nvfp4(x: torch.Tensor) -> torch.Tensor:
    """torchao's two-level rule, the per-tensor scale floored at 2^-121 (see
    nvfp4_tensor_scale: torchao's own overflows below amax ~5e-34)."""
    tensor_scale = max(float(torch.tensor(float(x.abs().max()) / (448.0 * 6.0),
                                          dtype=torch.float32)), 2.0 ** -121)
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


def _fp32_near_ties(low: float, high: float) -> torch.Tensor:
    """fp32 values from ``low`` to ``high`` (non-negative) whose low 12 mantissa bits are
    0, 1 or all ones: every binade's ties of a format with few mantissa bits, and their
    neighbours on either side."""
    start, stop = torch.tensor([low, high]).view(torch.int32).tolist()
    high_bits = torch.arange(start >> 12, (stop >> 12) + 1, dtype=torch.int32) << 12
    bits = torch.cat([high_bits, high_bits | 1, high_bits | 0xFFF])
    return bits[(bits >= start) & (bits <= stop)].view(torch.float32)


def test_e2m1_rounding_below_7_is_the_saturating_rounding():
    # NVFP4's scaled elements stay below 7, where rounding to nearest never passes 6
    below_7 = _fp32_near_ties(0.0, 7.0)
    below_7 = below_7[below_7 < 7.0]                        # 7 itself would round to 8
    values = torch.cat([below_7, torch.tensor([1e-45, 1e-40, float("nan")])])
    ours = _round_e2m1_below_7_(values.clone())
    theirs = round_to_format_(values.clone(), "e2m1")
    assert torch.equal(torch.isnan(ours), torch.isnan(theirs))
    assert torch.equal(ours.nan_to_num(0.0).view(torch.int32),
                       theirs.nan_to_num(0.0).view(torch.int32))
    assert ours.nan_to_num(0.0).max() == 6.0


def test_e4m3_rounding_of_an_nvfp4_block_scale_range_is_torchs_cast():
    values = torch.cat([_fp32_near_ties(2.0 ** -6, E4M3_MAX), torch.tensor([float("nan")])])
    ours = _round_in_range_(values.clone(), "e4m3")
    theirs = values.to(torch.float8_e4m3fn).float()
    assert torch.equal(torch.isnan(ours), torch.isnan(theirs))
    assert torch.equal(ours.nan_to_num(0.0), theirs.nan_to_num(0.0))


def test_16x16_blocks_leave_the_weight_alone_and_match_the_flat_blocks_of_its_tiles():
    weight = torch.randn(40, 48)
    kept = weight.clone()
    q = qdq_nvfp4(weight, square=True)
    assert torch.equal(weight, kept)
    # each 16x16 tile quantised as one block of 256 values under the tensor's scale
    padded = torch.nn.functional.pad(weight, (0, 0, 0, 8))
    tiles = padded.reshape(3, 16, 3, 16).transpose(1, 2).reshape(9, 256)
    flat = qdq_nvfp4(tiles, block=256)
    assert torch.equal(q, flat.reshape(3, 3, 16, 16).transpose(1, 2).reshape(48, 48)[:40])


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


# ------------------------------------------------- every magnitude of fp32's range
#: Tensor magnitudes (amax) from fp32's smallest normal to its largest.
MAGNITUDES = [1.17549435e-38, 1e-37, 1e-36, 1e-34, 1e-30, 1e-20, 1e-12, 1e-6, 1.0, 1e6,
              1e20, 1e30, 3.4e38]


def scaled(magnitude: float, seed: int = 11) -> torch.Tensor:
    """A (2, 64) tensor of amax ``magnitude`` whose values spread over 2^-24 .. 1 of it,
    so small magnitudes hold fp32 subnormals; one row of plain subnormals added."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(2, 64, generator=gen, dtype=torch.float64) * \
        torch.logspace(-7, 0, 64, dtype=torch.float64)
    x = (values / values.abs().max() * magnitude).float()
    x[1, :8] = torch.tensor([1e-45, -3e-45, 1e-42, -5e-41, 1e-39, -1.1e-38, 0.0, -0.0])
    return x


def reference_rowwise(x: torch.Tensor, table: list[float]) -> torch.Tensor:
    rows = []
    for row in x:
        amax = max(float(row.abs().max()), 1e-12)
        scale = float(torch.tensor(448.0 / amax, dtype=torch.float32))
        scale = 2.0 ** math.floor(math.log2(scale))
        rows.append(reference_round(row * scale, table) / scale)
    return torch.stack(rows)


@pytest.mark.parametrize("magnitude", MAGNITUDES)
def test_every_format_matches_its_reference_at_every_magnitude(magnitude):
    x = scaled(magnitude)
    assert torch.equal(qdq_tensorwise(x, "e4m3"), reference_tensorwise(x, E4M3_GRID, E4M3_MAX))
    assert torch.equal(qdq_tensorwise(x, "e5m2"), reference_tensorwise(x, E5M2_GRID, E5M2_MAX))
    assert torch.equal(qdq_rowwise(x, "e4m3", -1), reference_rowwise(x, E4M3_GRID))
    for elem, table, emax in (("e4m3", E4M3_GRID, 8), ("e2m1", E2M1_GRID, 2)):
        expected = torch.cat([reference_mx(block, table, emax) for block in x.reshape(-1, 32)])
        assert torch.equal(qdq_mx(x, elem).reshape(-1), expected), elem
    assert torch.equal(qdq_nvfp4(x), reference_nvfp4(x))


@pytest.mark.parametrize("magnitude", MAGNITUDES)
def test_nvfp4_keeps_its_accuracy_at_every_magnitude(magnitude):
    """The bug of issue 46: a tensor of amax 1e-20 came back all zeros (relative error 1)
    because the per-tensor scale was floored at the fp8 recipes' amax of 1e-12."""
    x = scaled(magnitude)[:1]       # the first row: no subnormals of its own
    error = (qdq_nvfp4(x).double() - x.double()).norm() / x.double().norm()
    accurate = 0.2 if magnitude > 1e-37 else 0.5   # at 1.2e-38 part of x is subnormal
    assert 0 < float(error) < accurate, float(error)


def test_fp8_tensorwise_flushes_below_torchaos_amax_floor_as_native_torchao_does():
    """The fp8 recipes keep torchao's 1e-12 amax floor (the native path is torchao's
    Float8Linear): a tensor far below it flushes to zero, on the GPU as here. Transformer
    Engine has no such floor; docs/lowbit-recipes.md names the difference."""
    x = scaled(1e-20)
    assert torch.equal(qdq_tensorwise(x, "e4m3"), torch.zeros_like(x))


def test_rceil_scales_round_up_so_nothing_saturates():
    amax = torch.tensor([448.0, 449.0, 0.0, 1e-45, math.inf, math.nan, 3e38, 6.0, 6.5])
    elems = ["e4m3"] * 7 + ["e2m1"] * 2
    got = [int(e8m0_exponent(a.reshape(1), elem, "rceil")) for a, elem in zip(amax, elems)]
    assert got == [0, 1, -127, -127, 127, 128, 120, 0, 1]
    torch.manual_seed(12)
    x = torch.randn(8, 64) * 5
    for elem, fmax in (("e4m3", E4M3_MAX), ("e2m1", E2M1_MAX)):
        blocks = x.reshape(-1, 32)
        exponent = e8m0_exponent(blocks.abs().amax(1, keepdim=True), elem, "rceil")
        assert (blocks.abs() <= fmax * 2.0 ** exponent.double()).all()   # within range
        assert (blocks.abs().amax(1) > fmax * 2.0 ** (exponent.double().squeeze(1) - 1)).all()
        flushed, saturated = flushed_and_saturated(x, Quantiser("mx", elem, mx_mode="rceil"))
        assert saturated == 0.0


def reference_mx_rceil(block: torch.Tensor, table: list[float]) -> torch.Tensor:
    """cuBLAS's RCEIL: X = 2^ceil(log2(fp32(amax / fmax))), clamped to [2^-127, 2^127]."""
    amax = float(block.abs().max())
    descale = float(torch.tensor(amax / table[-1], dtype=torch.float32))
    if descale == 0:
        exponent = -127
    else:
        mantissa, exp = math.frexp(descale)
        exponent = max(-127, min(127, exp - 1 if mantissa == 0.5 else exp))
    return reference_round(block / 2.0 ** exponent, table) * 2.0 ** exponent


@pytest.mark.parametrize("magnitude", [1e-36, 1e-20, 1.0, 1e30])
def test_mx_rceil_matches_its_reference(magnitude):
    x = scaled(magnitude)
    for elem, table in (("e4m3", E4M3_GRID), ("e2m1", E2M1_GRID)):
        expected = torch.cat([reference_mx_rceil(b, table) for b in x.reshape(-1, 32)])
        assert torch.equal(qdq_mx(x, elem, mode="rceil").reshape(-1), expected), elem


@pytest.mark.parametrize("scaling,elem,options", [
    ("tensorwise", "e4m3", {}), ("tensorwise", "e4m3", {"power_of_2": True}),
    ("rowwise", "e4m3", {}), ("mx", "e4m3", {}), ("mx", "e2m1", {"mx_mode": "rceil"}),
    ("nvfp4", "e2m1", {}), ("nvfp4", "e2m1", {"square": True}),
    ("nvfp4", "e2m1", {"stochastic": True}), ("blockwise", "e4m3", {}),
    ("blockwise", "e4m3", {"square": True})])
def test_zero_sized_tensors_pass_through_every_quantiser(scaling, elem, options):
    quantiser = Quantiser(scaling, elem, **options)
    for shape in ((0,), (0, 32), (4, 0)):
        empty = torch.zeros(shape) if not options.get("square") or len(shape) == 2 \
            else torch.zeros(0, 0)
        assert quantiser(empty, -1).shape == empty.shape
        assert flushed_and_saturated(empty, quantiser) == (0.0, 0.0)


# ------------------------------------ against torchao, across the range
def torchao_mx(x: torch.Tensor, elem: str, mode: str = "floor") -> tuple[torch.Tensor, ...]:
    with quiet_torchao():
        from torchao.prototype.mx_formats.config import ScaleCalculationMode
        from torchao.prototype.mx_formats.mx_tensor import to_dtype, to_mx
    dtype = torch.float8_e4m3fn if elem == "e4m3" else torch.float4_e2m1fn_x2
    scale, data = to_mx(x, dtype, 32, scaling_mode=ScaleCalculationMode(mode))
    return to_dtype(data, scale, dtype, 32, torch.float32), scale.view(torch.uint8)


def torchao_nvfp4(x: torch.Tensor) -> torch.Tensor:
    with quiet_torchao():
        from torchao.prototype.mx_formats.kernels import f4_unpacked_to_f32, unpack_uint4
        from torchao.prototype.mx_formats.nvfp4_tensor import (nvfp4_quantize,
                                                               per_tensor_amax_to_scale)
    tensor_scale = per_tensor_amax_to_scale(x.abs().amax())
    scales, packed = nvfp4_quantize(x, 16, tensor_scale)
    values = f4_unpacked_to_f32(unpack_uint4(packed.view(torch.uint8)))
    values = values.reshape(x.shape[0], -1, 16)
    return (values * (tensor_scale * scales.float()).unsqueeze(-1)).reshape(x.shape)


@needs_torchao
@pytest.mark.parametrize("magnitude", MAGNITUDES)
def test_fp8_and_nvfp4_agree_with_torchao_at_every_magnitude(magnitude):
    with quiet_torchao():
        from torchao.float8.config import ScalingGranularity
        from torchao.float8.float8_utils import tensor_to_scale, to_fp8_saturated
    x = scaled(magnitude)
    for elem, dtype in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        scale = tensor_to_scale(x, dtype)
        assert torch.equal(qdq_tensorwise(x, elem), to_fp8_saturated(x * scale, dtype).float()
                           / scale)
    scale = tensor_to_scale(x, torch.float8_e4m3fn,
                            scaling_granularity=ScalingGranularity.AXISWISE, axiswise_dim=-1,
                            round_scales_to_power_of_2=True)
    assert torch.equal(qdq_rowwise(x, "e4m3", -1),
                       to_fp8_saturated(x * scale, torch.float8_e4m3fn).float() / scale)
    theirs = torchao_nvfp4(x)
    if magnitude >= 2688 * 2.0 ** -121:      # the floor never acts: bit for bit torchao's
        assert torch.equal(qdq_nvfp4(x), theirs)
    else:   # torchao's per-tensor scale's reciprocal overflows: NaN (0 x inf) or garbage
        assert not torch.equal(qdq_nvfp4(x), theirs) and qdq_nvfp4(x).isfinite().all()


@needs_torchao
@pytest.mark.parametrize("mode", ["floor", "rceil"])
@pytest.mark.parametrize("magnitude", MAGNITUDES)
def test_mx_agrees_with_torchao_except_in_blocks_of_the_smallest_scale(magnitude, mode):
    """torchao differs from the spec in one place: a block whose e8m0 scale is 2^-127
    (code 0). FLOOR: torchao divides by 2^-126 (its workaround for subnormal scales in
    Triton) and decodes with 2^-127, halving the block; RCEIL: it leaves the block
    unscaled (reciprocal 1.0, as Transformer Engine's kernels), flushing it to zero.
    amptrain divides by the scale itself, as the OCP MX spec and cuBLAS define it."""
    x = scaled(magnitude)
    for elem in ("e4m3", "e2m1"):
        theirs, codes = torchao_mx(x, elem, mode)
        mine = qdq_mx(x, elem, mode=mode)
        smallest = (codes.reshape(-1) == 0)
        blocks_mine, blocks_theirs = mine.reshape(-1, 32), theirs.reshape(-1, 32)
        assert torch.equal(blocks_mine[~smallest], blocks_theirs[~smallest]), elem
        if mode == "floor":
            table = E4M3_GRID if elem == "e4m3" else E2M1_GRID
            for block, their in zip(x.reshape(-1, 32)[smallest], blocks_theirs[smallest]):
                # quantised as x / 2^-126, decoded as q x 2^-127: half the value
                assert torch.equal(their, reference_round(block / 2.0 ** -126, table)
                                   * 2.0 ** -127)
        else:
            assert (blocks_theirs[smallest] == 0).all()
        differ = (blocks_mine != blocks_theirs).any(1)
        assert not (differ & ~smallest).any()
        if magnitude <= 1e-37:
            assert differ.any(), "the difference is exercised"
