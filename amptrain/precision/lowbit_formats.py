"""The low-bit number formats of fp8 and Blackwell training, as quantise-dequantise functions.

Each function takes a float tensor and returns, in fp32, exactly the values that the
format's hardware would compute with: the tensor scaled, rounded to the element format
(round to nearest, ties to even), saturated at the format's largest finite value, and
scaled back. Nothing here needs a GPU or torchao; :mod:`.lowbit` builds the emulated
matmuls from these functions and ``diagnose`` counts what they saturate or flush.

The formats and their scales (the rules torchao 0.18 and the OCP Microscaling spec v1.0
give; tests/precision/test_lowbit_formats.py checks each against an explicit reference
computation and against torchao where torchao runs on the CPU):

* **fp8 e4m3** (largest 448, smallest subnormal 2^-9, no inf) and **e5m2** (largest 57344,
  smallest subnormal 2^-16): the values of torch's own casts (round to nearest even) of
  the value clamped to the format's range (torchao's ``to_fp8_saturated``: torch 2.13
  turns e5m2 overflow into inf); NaN stays NaN, inf saturates. Computed by fp32
  arithmetic (``round_to_format_``), bit for bit the casts and several times faster.
* **tensorwise scale** (torchao's default recipe): ``s = fmax / max(amax, 1e-12)``,
  computed in fp64 and rounded to fp32; quantised ``q = sat(x * s)``, dequantised ``q / s``.
* **rowwise scale** (torchao's ``rowwise`` recipe): the same per row along one axis, the
  scale rounded down to a power of two.
* **MX** (MXFP8: e4m3 elements; MXFP4: e2m1 elements): blocks of 32 along the reduction
  axis share an e8m0 scale ``X = 2^(floor(log2 amax) - emax_elem)`` (emax 8 for e4m3, 2
  for e2m1; the OCP spec's FLOOR rule, torchao's ``to_mx`` default), its exponent clamped
  to e8m0's [-127, 127]; a block whose amax is NaN gets the NaN scale (every value NaN).
  Elements ``sat(x / X)``, dequantised ``q * X``.
* **e2m1** (fp4: 0, 0.5, 1, 1.5, 2, 3, 4, 6): no torch dtype computes it; rounded by the
  same arithmetic: the spacing is 0.5 below 2, 1 below 4 and 2 above, fp32's own
  round-to-nearest-even drops the bits below it, and values beyond 6 saturate. NaN stays
  NaN.
* **NVFP4**: e2m1 elements in blocks of 16 with an e4m3 block scale, under an fp32
  per-tensor scale ``amax / (448 * 6)``: the block scale ``amax_block / 6`` divided by the
  tensor scale, clamped to [2^-6, 448] and rounded to e4m3; elements
  ``sat(x / (tensor_scale * block_scale))``, dequantised by the same product.

* **fp8 blocks** (DeepSeek-V3, torchao's ``blockwise_fp8_training``): e4m3 with the
  tensorwise rule's fp32 scale per 1 x 128 tile (activations, gradients) or per
  128 x 128 tile (weights).
* **2D blocks**: NVFP4's training recipe scales weights per 16 x 16 tile (the same tile
  whichever axis a GEMM reduces over, so forward and backward see one quantised weight).
* **Stochastic rounding** of e2m1 (the NVFP4 recipe's gradients): up or down to the
  neighbouring value with the probabilities that make the expectation exact (to
  within 2^-16 of the spacing: an odd 16-bit offset per value).

How a tensor is cut into blocks (along an axis, or 16 x 16 tiles) and each block's
largest magnitude found live in :mod:`.lowbit_blocks`; how one GEMM operand is quantised
(:class:`~.lowbit_operand.Quantiser`) and the flush and saturation counts of ``diagnose``
in :mod:`.lowbit_operand`; the differences from torchao at the edges of fp32's range are
listed in docs/lowbit-recipes.md.
"""
from __future__ import annotations

import torch

from .lowbit_blocks import block_amax, blocks
from .lowbit_scratch import scratch

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
E4M3_MAX = 448.0
E5M2_MAX = 57344.0
E2M1_MAX = 6.0
#: torchao's floor on amax before a tensorwise/rowwise scale is computed.
AMAX_EPS = 1e-12
MX_BLOCK = 32
NVFP4_BLOCK = 16
#: DeepSeek-V3's fp8 tiles: 1 x 128 for activations and gradients, 128 x 128 for weights.
FP8_BLOCK = 128
#: e8m0 scale exponents: 2^-127 .. 2^127; the all-ones code (255) is NaN.
E8M0_BIAS = 127
#: The largest power of two of each element format (the MX FLOOR rule's emax).
EMAX = {"e4m3": 8, "e5m2": 15, "e2m1": 2}
FORMAT_MAX = {"e4m3": E4M3_MAX, "e5m2": E5M2_MAX, "e2m1": E2M1_MAX}
#: Half the spacing of each format's top binade: values beyond max + this are clamped.
HALF_TOP_STEP = {"e4m3": 16.0, "e5m2": 4096.0, "e2m1": 1.0}
#: NVFP4 block scales are clamped below at e4m3's smallest normal (torchao's E4M3_EPS).
E4M3_TINY = 2.0 ** -6
#: NVFP4's per-tensor scale floor: ``2^121 / 2^-6`` is the largest element factor that
#: stays finite in fp32 (see :func:`nvfp4_tensor_scale`).
NVFP4_MIN_TENSOR_SCALE = 2.0 ** -121


#: Each format's mantissa bits and smallest normal exponent (below it: subnormals, with
#: that binade's spacing).
_MANTISSA_BITS = {"e4m3": 3, "e5m2": 2, "e2m1": 1}
_MIN_EXPONENT = {"e4m3": -6, "e5m2": -14, "e2m1": 0}
_EXPONENT_MASK = 0x7F800000


def round_to_format_(values: torch.Tensor, elem: str) -> torch.Tensor:
    """``values`` (fp32) rounded in place to the element format ``elem``, ties to even,
    saturated at its largest value (either sign); NaN stays NaN; returns ``values``.

    The format's spacing at a value is ``2^(max(e, emin) - mantissa_bits)`` for its fp32
    exponent ``e``: adding and subtracting ``M = 1.5 * 2^23`` times the spacing makes
    fp32's own round-to-nearest-even drop exactly the bits below it. ``2^max(e, emin)``
    is read from the exponent bits (integer ops: one cheap pass each; torch's float8
    casts, ``log2``/``exp2`` and ``torch.where`` are many times slower on the CPU), and
    the factor ``1.5 * 2^(23 - mantissa_bits)`` rides on the adds' ``alpha`` (a power of
    two times 1.5: the product is exact, so each add rounds once). Signed values need no
    ``abs`` and no sign restored after: the exponent bits are the magnitude's, and
    ``M - |v|`` rounds to ``M`` minus ``|v|`` rounded (fp32's rounding is symmetric and
    ``M`` is an even number of spacings, so ties go to the same even value). The one
    difference from rounding magnitudes: a negative value that rounds to zero gives +0,
    not -0 (the same number: products and sums do not see the sign of a zero)."""
    values.clamp_(-FORMAT_MAX[elem], FORMAT_MAX[elem])
    if elem in _CASTS and values.numel() <= _CAST_BELOW:   # a few values: fewer operations
        return values.copy_(values.to(_CASTS[elem]))
    return _add_sub_magic_(values, _binade_power(values, _MIN_EXPONENT[elem]), elem)


def _binade_power(values: torch.Tensor, min_exponent: int | None = None) -> torch.Tensor:
    """The power of two of each value's binade, ``2^e`` for the fp32 exponent ``e`` of
    ``|value|`` (at least ``2^min_exponent`` where given), as fp32 in the reused
    temporary ``magic`` (computed on the bits: the sign bit masked off)."""
    power = torch.bitwise_and(values.view(torch.int32), _EXPONENT_MASK,
                              out=scratch("magic", values.shape, torch.int32, values.device))
    if min_exponent is not None:
        power.clamp_(min=(min_exponent + 127) << 23)
    return power.view(torch.float32)


def _add_sub_magic_(values: torch.Tensor, power: torch.Tensor, elem: str) -> torch.Tensor:
    """``values`` rounded in place at the spacing ``power * 2^-mantissa_bits`` (``power``:
    the power of two of each value's binade, clamped at the format's smallest normal)."""
    factor = 1.5 * 2.0 ** (23 - _MANTISSA_BITS[elem])
    return values.add_(power, alpha=factor).sub_(power, alpha=factor)


def _round_in_range_(values: torch.Tensor, elem: str) -> torch.Tensor:
    """:func:`round_to_format_` for ``values`` known to be NaN or within the format's
    normal range (no clamp at either end: an NVFP4 block scale, clamped to [2^-6, 448]
    before)."""
    return _add_sub_magic_(values, _binade_power(values), elem)


def _round_e2m1_below_7_(values: torch.Tensor) -> torch.Tensor:
    """:func:`round_to_format_` to e2m1 for ``values`` known to be below 7 in magnitude,
    or NaN (NVFP4's scaled elements: at most ``6 / (1 - 2^-4)``, the e4m3 block scale's
    rounding), where rounding to nearest never goes past 6 and the saturating clamp is a
    no-op: four passes."""
    return _add_sub_magic_(values, _binade_power(values, _MIN_EXPONENT["e2m1"]), "e2m1")


#: torch's own casts give the same values (round to nearest even of the clamped value):
#: for a few thousand values (an NVFP4 weight's block scales) one cast costs less than
#: the arithmetic's six operations; for more, the cast is the slower (5 ns a value).
_CASTS = {"e4m3": E4M3, "e5m2": E5M2}
_CAST_BELOW = 4096


def round_fp8(x: torch.Tensor, elem: str) -> torch.Tensor:
    """``x`` (fp32) rounded to e4m3 or e5m2, saturated at the format's largest value
    (inf too, as torchao's ``to_fp8_saturated``); NaN stays NaN. Bit for bit torch's own
    float8 cast of the clamped value."""
    return round_to_format_(x.abs(), elem).copysign_(x)


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """``x`` (fp32) rounded to fp4 e2m1, ties to even, saturated at 6 (NaN stays NaN)."""
    return round_to_format_(x.abs(), "e2m1").copysign_(x)


def _qdq(x: torch.Tensor, mag: torch.Tensor, scale: torch.Tensor, elem: str) -> torch.Tensor:
    """``x`` (with ``mag = |x|``, a temporary) times ``scale`` rounded to ``elem`` and
    divided by ``scale`` again. ``|x| * scale`` is ``|x * scale|`` exactly (rounding is
    symmetric in the sign), so rounding magnitudes and restoring the sign after is bit for
    bit the same as rounding ``x * scale``; the scales are positive (or NaN)."""
    return round_to_format_(mag.mul_(scale), elem).copysign_(x).div_(scale)


# ------------------------------------------------------------ tensorwise / rowwise
def amax_to_scale(amax: torch.Tensor, elem: str, power_of_2: bool = False) -> torch.Tensor:
    """torchao's fp8 scale: ``fmax / max(amax, 1e-12)`` in fp64, as fp32; optionally
    rounded down to a power of two (the rowwise recipe)."""
    scale = (FORMAT_MAX[elem] / amax.double().clamp(min=AMAX_EPS)).float()
    return torch.exp2(torch.floor(torch.log2(scale))) if power_of_2 else scale


def qdq_tensorwise(x: torch.Tensor, elem: str, power_of_2: bool = False) -> torch.Tensor:
    """fp8 with one dynamic scale for the whole tensor (torchao's default recipe;
    ``power_of_2``: the scale rounded down to a power of two, as the weight of
    ``ROWWISE_WITH_GW_HP``'s grad-input GEMM)."""
    x = x.float()
    mag = x.abs()
    return _qdq(x, mag, amax_to_scale(mag.amax(), elem, power_of_2), elem)


def qdq_rowwise(x: torch.Tensor, elem: str, dim: int) -> torch.Tensor:
    """fp8 with one power-of-two scale per slice along ``dim`` (``-1``: one per row)."""
    x = x.float()
    mag = x.abs()
    scale = amax_to_scale(mag.amax(dim=dim, keepdim=True), elem, power_of_2=True)
    return _qdq(x, mag, scale, elem)


# ------------------------------------------------------------------------- MX
def e8m0_exponent(amax: torch.Tensor, elem: str, mode: str = "floor") -> torch.Tensor:
    """The unbiased e8m0 exponent of each block's MX scale, as int32, clamped to
    [-127, 127]; 128 marks a NaN amax (the NaN scale).

    ``floor`` (the OCP MX spec v1.0, torchao's default): ``floor(log2 amax) - emax``,
    read from amax's fp32 exponent bits. ``rceil`` (NVIDIA's, cuBLAS's "round up" e8m0
    conversion; torchao's ``ScaleCalculationMode.RCEIL``): ``ceil(log2(amax / fmax))``,
    the smallest power of two that keeps the block's largest value within the format,
    so nothing saturates."""
    if mode == "rceil":
        # ceil(log2 d) exactly, from frexp (d = m 2^e, m in [0.5, 1)): e, or e - 1 where d
        # is a power of two; fp32's log2 rounds to the integer near large |log2 d|, which
        # the hardware's round-up conversion (cvt.rp.ue8m0) does not.
        # A descale that underflows to 0 (amax below 2^-150 fmax, or 0) takes 2^-127.
        descale = amax.float() / FORMAT_MAX[elem]
        mantissa, exponent = torch.frexp(descale)
        exponent = exponent.sub_((mantissa == 0.5).int()).clamp_(-E8M0_BIAS, E8M0_BIAS)
        exponent = torch.where(torch.isinf(amax), E8M0_BIAS, exponent)
        exponent = torch.where(descale == 0, -E8M0_BIAS, exponent)
        return torch.where(torch.isnan(amax), E8M0_BIAS + 1, exponent)
    bits = amax.float().contiguous().view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - E8M0_BIAS - EMAX[elem]
    exponent = exponent.clamp_(-E8M0_BIAS, E8M0_BIAS)
    return torch.where(torch.isnan(amax), E8M0_BIAS + 1, exponent)


def e8m0_value(exponent: torch.Tensor) -> torch.Tensor:
    """2^exponent in fp32 (2^-127 is an fp32 subnormal, exactly), NaN for code 128."""
    value = torch.exp2(exponent.float())       # code 128: 2^128 overflows to inf
    return value.add_(value * 0.0)             # + 0, or inf + NaN (cheaper than where)


def qdq_mx(x: torch.Tensor, elem: str, dim: int = -1, block: int = MX_BLOCK,
           mode: str = "floor", overwrite: bool = False, into: str | None = None
           ) -> torch.Tensor:
    """MX (MXFP8 ``e4m3``, MXFP4 ``e2m1``): blocks of ``block`` values along ``dim`` share
    a power-of-two e8m0 scale (``mode``: ``floor`` or ``rceil``, see :func:`e8m0_exponent`);
    ``overwrite``: ``x``'s storage may hold the result (the caller gives ``x`` up);
    ``into``: else the result may be the reused temporary of that name (see
    :func:`_output`).

    Elements are ``x / X`` for the block's scale ``X`` itself, 2^-127 included (the OCP
    spec); torchao 0.18 divides by 2^-126 there (a workaround for subnormal scales in
    Triton) while decoding with 2^-127, which halves every value of a block whose amax is
    below 2^(emax - 126) (its RCEIL path likewise leaves such blocks unscaled: all zero)."""
    rows, restore, dims = blocks(x, dim, block)
    out = _output(x, rows, overwrite, into)
    scale = e8m0_value(e8m0_exponent(block_amax(_magnitudes(rows), dims), elem, mode))
    scaled = torch.div(rows, scale, out=out)
    return restore(round_to_format_(scaled, elem).mul_(scale))


def _output(x: torch.Tensor, rows: torch.Tensor, overwrite: bool, into: str | None
            ) -> torch.Tensor | None:
    """Where a block quantiser's values go (scaled, rounded, scaled back, all in place):
    ``rows`` itself where it is a copy of ``x`` or ``overwrite`` (the caller gives ``x``
    up); else the reused temporary ``into`` where the caller names one
    (:mod:`.lowbit_scratch`); else None, a new tensor. Not where autograd records
    (``out=`` has no gradient)."""
    if rows.requires_grad and torch.is_grad_enabled():
        return None
    if overwrite or rows.data_ptr() != x.data_ptr():   # rows: a view of x, or a copy
        return rows
    return None if into is None else scratch(into, rows.shape, rows.dtype, rows.device)


def _magnitudes(rows: torch.Tensor) -> torch.Tensor:
    """``|rows|``, for the block maxima only, in a reused temporary (a new tensor where
    autograd records)."""
    if rows.requires_grad and torch.is_grad_enabled():
        return rows.abs()
    return torch.abs(rows, out=scratch("magnitudes", rows.shape, rows.dtype, rows.device))


def nvfp4_tensor_scale(amax: torch.Tensor) -> torch.Tensor:
    """NVFP4's fp32 per-tensor scale: ``amax / (448 * 6)`` (torchao's
    ``per_tensor_amax_to_scale``), floored at :data:`NVFP4_MIN_TENSOR_SCALE`.

    The floor is what keeps the format exact at every magnitude: the elements are scaled
    by ``(1 / tensor_scale) / block_scale`` with block scales down to 2^-6, which stays
    finite only while the tensor scale exceeds 2^-122. torchao has no floor (its
    reciprocal overflows and its result turns to NaN or saturates below amax ~5e-34);
    Transformer Engine clamps its encode scale at fp32's largest value to the same end.
    Above amax = 2688 x 2^-121 (~1.0e-33) the floor never acts and the result is
    torchao's bit for bit. (It must not be the fp8 recipes' 1e-12 amax floor: that one
    flushed every tensor with amax below ~3e-17 to zero.)"""
    return (_fp32(amax) / (E4M3_MAX * E2M1_MAX)).clamp_(min=NVFP4_MIN_TENSOR_SCALE)


def nvfp4_block_scales(block_amax: torch.Tensor, tensor_scale: torch.Tensor) -> torch.Tensor:
    """Each block's e4m3 scale relative to the tensor scale, as fp32."""
    return _nvfp4_block_scales_(block_amax / E2M1_MAX, tensor_scale, divided=True)


def _nvfp4_block_scales_(block_amax: torch.Tensor, tensor_scale: torch.Tensor,
                         divided: bool = False) -> torch.Tensor:
    """:func:`nvfp4_block_scales` computed in place in ``block_amax`` (``divided``: by 6
    already)."""
    scaled = block_amax if divided else block_amax.div_(E2M1_MAX)
    scaled.div_(tensor_scale).clamp_(E4M3_TINY, E4M3_MAX)
    return _round_in_range_(scaled, "e4m3")    # the e4m3 cast's values


def _fp32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.dtype == torch.float32 else tensor.float()


#: Bits per stochastic-rounding offset, four from each 64-bit draw (the lowest set to 1:
#: 15 of them random, see :func:`uniform_offsets`).
SR_BITS = 16
#: The lowest bit of each 16-bit lane of a 64-bit word: set, it makes every offset odd.
_ODD_LANES = 0x0001_0001_0001_0001


def uniform_offsets(shape: torch.Size, generator: torch.Generator | None,
                    device: torch.device) -> torch.Tensor:
    """Stochastic rounding's offsets, as an int16 tensor of ``shape`` holding odd ``k``
    (``-2^15 < k < 2^15``, all 2^15 of them equally likely): the offset in units of the
    spacing is ``k / 2^16``, uniform in (-1/2, 1/2) and symmetric about 0, so a value
    rounds up with its distance from the value below over the spacing, to within 2^-16,
    and a value on the grid stays where it is. Each 64-bit draw of ``generator`` gives
    four (torch's CPU generator costs per draw, and ``torch.rand`` spends one 32-bit draw
    and a conversion on each float: 3.5x the time); Blackwell's ``cvt.rs`` likewise
    rounds with a few random bits per value, not a full-precision uniform. The tensor is
    a reused temporary (:mod:`.lowbit_scratch`): valid until the next call on this
    thread."""
    count = shape.numel()
    words = scratch("random", ((count + 3) // 4,), torch.int64, device)
    words.random_(-2 ** 63, None, generator=generator)   # the full 64-bit range
    words.bitwise_or_(_ODD_LANES)
    return words.view(torch.int16)[:count].view(shape)


def round_e2m1_stochastic_(values: torch.Tensor, generator: torch.Generator | None
                           ) -> torch.Tensor:
    """``values`` (fp32) rounded in place to e2m1 *stochastically*: each to the neighbour
    above its magnitude with probability (distance from the one below) / spacing, so the
    rounded value's expectation is the value (unbiased, below saturation at 6); NaN stays
    NaN. Computed as ``value + u * spacing`` rounded to nearest at the value's own
    spacing, for a uniform ``u`` in (-1/2, 1/2) (:func:`uniform_offsets`, symmetric, so
    the sign does not matter), drawn from ``generator`` only (never torch's global RNG):
    the nearer of the value's two neighbours is the upper one exactly when ``u`` exceeds
    1/2 minus the value's distance above the lower one over the spacing. An offset that
    carries a value into the binade below still rounds on the value's own spacing (the
    magic number of :func:`round_to_format_` comes from the value, before the offset)."""
    values.clamp_(-E2M1_MAX, E2M1_MAX)
    power = _binade_power(values, _MIN_EXPONENT["e2m1"])    # spacing / 2
    # the int16 offsets converted into reused storage (a multiply-add of mixed dtypes
    # converts them into a new tensor), then value + (k / 2^16) * spacing in one pass
    offsets = scratch("offsets", values.shape, torch.float32, values.device)
    offsets.copy_(uniform_offsets(values.shape, generator, values.device))
    values.addcmul_(offsets, power, value=2.0 ** -(SR_BITS + 1))
    return _add_sub_magic_(values, power, "e2m1")


def qdq_nvfp4(x: torch.Tensor, dim: int = -1, block: int = NVFP4_BLOCK, square: bool = False,
              generator: torch.Generator | None = None, stochastic: bool = False,
              overwrite: bool = False, into: str | None = None) -> torch.Tensor:
    """NVFP4: e2m1 values, an e4m3 scale per ``block`` values along ``dim`` (``square``:
    per ``block x block`` tile of a matrix, the recipe's weights) and an fp32 scale per
    tensor (torchao's two-level ``nvfp4_quantize``); ``stochastic``: the elements rounded
    stochastically with ``generator`` (the recipe's gradients); ``overwrite``: ``x``'s
    storage may hold the result (the caller gives ``x`` up); ``into``: else the result
    may be the reused temporary of that name (see :func:`_output`)."""
    rows, restore, dims = blocks(x, dim, block, square)
    out = _output(x, rows, overwrite, into)
    # a new tensor: the maxima, then the scales
    block_scale = block_amax(_magnitudes(rows), dims)
    tensor_scale = nvfp4_tensor_scale(block_scale.amax())   # the max of the blocks' maxima
    _nvfp4_block_scales_(block_scale, tensor_scale)
    scaled = torch.mul(rows, torch.div(tensor_scale.reciprocal(), block_scale),  # (1/ts)/bs
                       out=out)
    rounded = round_e2m1_stochastic_(scaled, generator) if stochastic \
        else _round_e2m1_below_7_(scaled)
    return restore(rounded.mul_(block_scale.mul_(tensor_scale)))


def qdq_fp8_blocks(x: torch.Tensor, dim: int = -1, block: int = FP8_BLOCK,
                   square: bool = False) -> torch.Tensor:
    """DeepSeek-V3's blockwise fp8 (torchao's ``blockwise_fp8_training``): e4m3 with one
    fp32 scale ``448 / max(amax, 1e-12)`` per ``1 x block`` tile along ``dim``
    (activations, gradients) or per ``block x block`` tile of a matrix (``square``:
    weights)."""
    rows, restore, dims = blocks(x, dim, block, square)
    mag = rows.abs()
    scale = amax_to_scale(block_amax(mag, dims), "e4m3")
    return restore(_qdq(rows, mag, scale, "e4m3"))
