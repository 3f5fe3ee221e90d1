"""What one tensor looks like in a number format: its abs-max, the share of its values a
format flushes to zero or saturates, and the quantisation SNR -- for the run's own format
and for every what-if format (:data:`WHATIF`).

The low-bit formats are amptrain's own quantisers (:mod:`amptrain.precision.lowbit_operand`,
packed for many tensors at once by :mod:`amptrain.precision.lowbit_packed`, which
counts flushes and saturation as :func:`~amptrain.precision.lowbit_operand.loss_counts` does);
fp16 and bf16 are plain casts, saturating at :data:`amptrain.diagnose.ranges` limits' max.
Everything stays on the device: :func:`tensor_stats` returns one small fp32 vector, and a
sampled step reads all its vectors at once.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..precision.lowbit_operand import Quantiser
from ..precision.lowbit_packed import PackedRows

#: The what-if formats, in the order of :func:`tensor_stats`'s vector (fp8 e4m3 is the
#: forward format, e5m2 the gradients'; both are reported for every tensor).
WHATIF: dict[str, Quantiser | torch.dtype] = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8-e4m3": Quantiser("tensorwise", "e4m3"),
    "fp8-e4m3-rowwise": Quantiser("rowwise", "e4m3"),
    "fp8-e5m2": Quantiser("tensorwise", "e5m2"),
    "mxfp8": Quantiser("mx", "e4m3"),
    "mxfp4": Quantiser("mx", "e2m1"),
    "nvfp4": Quantiser("nvfp4", "e2m1"),
}
#: The run's own format for 32-bit runs: nothing is flushed or saturated beyond fp32.
FP32 = "fp32"
#: Values per tensor that the shares and SNR are computed on (whole rows, from the start;
#: the abs-max always covers the whole tensor). Block scales need whole rows.
VALUE_LIMIT = 1 << 14
#: The SNR reported when a format holds the values exactly (an infinite SNR, e.g. a bf16
#: weight "quantised" to bf16), so that every field stays a JSON number.
EXACT_SNR_DB = 200.0

#: Offsets in the vector: amax, own flushed, own saturated, then 3 per what-if format.
OWN = 1
WHATIF_AT = 3
WIDTH = WHATIF_AT + 3 * len(WHATIF)


def run_formats(precision: str) -> dict[str, str]:
    """The run's own format per tensor kind (``activation``, ``weight``, ``gradient``) for a
    resolved precision name: fp8 runs compute forward in e4m3 and gradients in e5m2
    (tensorwise) or e4m3 (rowwise recipes), the MX and NVFP4 runs in their element formats;
    16-bit runs in fp16 or bf16; 32-true and tf32 in fp32."""
    name = precision
    if name.startswith("bf16"):
        own = {"activation": "bf16", "weight": "bf16", "gradient": "bf16"}
    elif name.startswith("16"):
        own = {"activation": "fp16", "weight": "fp16", "gradient": "fp16"}
    elif name == "fp8":
        own = {"activation": "fp8-e4m3", "weight": "fp8-e4m3", "gradient": "fp8-e5m2"}
    elif name.startswith("fp8-rowwise"):
        own = dict.fromkeys(("activation", "weight", "gradient"), "fp8-e4m3-rowwise")
    elif name.startswith("fp8"):   # blockwise: e4m3 tiles, closest to tensorwise e4m3
        own = dict.fromkeys(("activation", "weight", "gradient"), "fp8-e4m3")
    elif name.startswith("nvfp4"):
        own = dict.fromkeys(("activation", "weight", "gradient"), "nvfp4")
    elif name in ("mxfp8", "mxfp4"):
        own = dict.fromkeys(("activation", "weight", "gradient"), name)
    else:
        own = dict.fromkeys(("activation", "weight", "gradient"), FP32)
    return own


def as_rows(x: torch.Tensor, weight: bool = False) -> torch.Tensor:
    """``x`` as a 2-D fp32 matrix whose rows run along the GEMM's reduction axis (a weight:
    one row per output unit; anything else: its last dimension), cut to about
    :data:`VALUE_LIMIT` values in whole rows; inf/NaN become 0 (they are counted apart)."""
    x = x.detach().float()
    if x.dim() < 2:
        x = x.reshape(1, -1)
    x = x.reshape(x.shape[0], -1) if weight else x.reshape(-1, x.shape[-1])
    x = x[:max(1, VALUE_LIMIT // max(1, x.shape[1]))]
    return torch.where(torch.isfinite(x), x, torch.zeros((), device=x.device))


def _cast(packed: PackedRows, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A plain cast of the packed values: ``[count, flushed, saturated]`` per matrix, and
    the dequantised values (a value beyond the format's largest saturates there, as a
    saturating conversion does)."""
    top = torch.finfo(dtype).max
    cast = packed.blocks.to(dtype)
    nonzero = packed.nonzero
    counts = packed.counts(nonzero, nonzero & (cast == 0), torch.isinf(cast))
    return counts, torch.nan_to_num(cast.float(), posinf=top, neginf=-top)


def _format_stats(packed: PackedRows, signal: torch.Tensor,
                  fmt: Quantiser | torch.dtype) -> torch.Tensor:
    """``[flushed share, saturated share, SNR dB]`` per packed matrix in ``fmt``
    (``[matrices, 3]``); ``signal``: each matrix's sum of squares."""
    if isinstance(fmt, torch.dtype):
        counts, q = _cast(packed, fmt)
    else:
        q, counts = packed.quantise_counted(fmt)
    count = counts[:, 0].clamp_min(1)
    noise = packed.per_matrix_sum((packed.blocks - q).square_().sum(1))
    snr = 10 * torch.log10(signal / noise)
    snr = torch.where((noise > 0) | (signal == 0), snr, torch.full_like(snr, EXACT_SNR_DB))
    snr = torch.nan_to_num(snr.clamp(max=EXACT_SNR_DB), nan=0.0, neginf=0.0)
    return torch.stack([counts[:, 1] / count, counts[:, 2] / count, snr], dim=1)


def abs_max(x: torch.Tensor) -> torch.Tensor:
    """``x``'s abs-max over the whole tensor, as a 0-d fp32 tensor on its device (inf or
    NaN where ``x`` holds one)."""
    with torch.no_grad():
        return x.detach().abs().amax().float() if x.numel() else \
            torch.zeros((), device=x.device)


def many_stats(items: Sequence[tuple[torch.Tensor, torch.Tensor, str]]) -> torch.Tensor:
    """One :func:`tensor_stats` vector per ``(amax, rows, own)`` -- an :func:`abs_max`, an
    :func:`as_rows` matrix and the run's format (a key of :data:`WHATIF` or :data:`FP32`)
    -- as a ``[len(items), WIDTH]`` matrix on the device, computed for all of them at once
    (:class:`~amptrain.precision.lowbit_packed.PackedRows`): a sampled step costs about
    what one tensor costs."""
    with torch.no_grad():
        packed = PackedRows.pack([rows for _, rows, _ in items])
        signal = packed.per_matrix_sum(packed.blocks.square().sum(1))
        whatif = torch.cat([_format_stats(packed, signal, fmt) for fmt in WHATIF.values()],
                           dim=1)
        # the run's own format's flushed and saturated columns (zeros for fp32)
        names = list(WHATIF)
        at = [3 * names.index(fmt) if fmt != FP32 else 0 for _, _, fmt in items]
        columns = torch.tensor(at, device=whatif.device).unsqueeze(1) + \
            torch.arange(2, device=whatif.device)
        kept = torch.tensor([fmt != FP32 for _, _, fmt in items], device=whatif.device)
        own = whatif.gather(1, columns) * kept.unsqueeze(1)
        amax = torch.stack([a.reshape(()) for a, _, _ in items]).reshape(-1, 1)
        return torch.cat([amax, own, whatif], dim=1)


def tensor_stats(x: torch.Tensor, own: str, *, weight: bool = False) -> torch.Tensor:
    """The vector ``[amax, own flushed, own saturated, (flushed, saturated, snr_db) per
    what-if format]`` of ``x`` on its device (no host sync). ``own`` is a key of
    :data:`WHATIF` or :data:`FP32`."""
    return many_stats([(abs_max(x), as_rows(x, weight), own)])[0]


def unpack(vector: list[float], fmt: str) -> dict[str, object]:
    """One read-back vector as the JSON record's fields ``format`` (``fmt``, the run's
    format), ``amax``, ``flushed``, ``saturated`` and ``whatif``."""
    whatif = {}
    for i, name in enumerate(WHATIF):
        flushed, saturated, snr = vector[WHATIF_AT + 3 * i: WHATIF_AT + 3 * i + 3]
        whatif[name] = {"flushed": flushed, "saturated": saturated, "snr_db": snr}
    amax = vector[0]
    return {"format": fmt, "amax": amax if math.isfinite(amax) else None,
            "flushed": vector[OWN], "saturated": vector[OWN + 1], "whatif": whatif}
