"""Number formats and the range statistics of a 32-true run: the tracer behind ``diagnose``.

:class:`RangeRecorder` hooks every module and records, per module, the range of its
activations (outputs), of the gradients arriving at those outputs, and of its own
parameters' gradients -- abs-max, smallest non-zero magnitude, and the fractions that
fp16 and bf16 could not hold (above max, below the smallest normal, flushed to zero).
Statistics stay on the device (a strided sample of at most :data:`SAMPLE_LIMIT` values
per tensor feeds a log2 histogram; abs-max covers the whole tensor) and are read once at
the end.

The log2 histograms make the loss-scale arithmetic exact: multiplying by a power of two
shifts the histogram, so the fractions at any power-of-two scale are read off the same
data (:func:`fractions`).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from ..precision.nonfinite import extremes, floating_tensors
from ..precision.fp8 import plan_float8
from ..precision.lowbit import RECIPES, Recipe, format_recipe
from ..precision.lowbit_operand import Quantiser, loss_counts

FP16_MAX = 65504.0
BF16_MAX = float(torch.finfo(torch.bfloat16).max)


@dataclass(frozen=True)
class FormatLimits:
    """The range of a floating-point format, as powers of two where they are ones.

    ``min_normal_log2``: smallest normal is 2**that. ``flush_log2``: magnitudes below
    2**that round to zero (half the smallest subnormal; round-to-nearest-even).
    """

    name: str
    max: float
    min_normal_log2: int
    flush_log2: int

    @property
    def min_normal(self) -> float:
        return 2.0 ** self.min_normal_log2

    @property
    def flush_below(self) -> float:
        return 2.0 ** self.flush_log2


FP16 = FormatLimits("fp16", FP16_MAX, -14, -25)
BF16 = FormatLimits("bf16", BF16_MAX, -126, -134)
FORMATS = (FP16, BF16)

#: Values per tensor per call that feed the histogram (abs-max always sees everything).
SAMPLE_LIMIT = 1 << 12

# Histogram layout: bin 0 holds zeros, bins 1.. hold floor(log2|x|) from E_MIN to E_MAX
# (every finite fp32 magnitude), and the last bin holds inf/NaN.
E_MIN, E_MAX = -150, 128
N_BINS = E_MAX - E_MIN + 3
_EXPONENTS = np.arange(E_MIN, E_MAX + 1)


def floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2(a)) of positive finite float32 values, exactly, from the exponent bits.

    (``torch.frexp`` is a scalar loop on CPU; this is a few vectorised integer ops.)
    Subnormals are scaled by 2**24 into the normal range first, which is exact.
    """
    def exponent(x: torch.Tensor) -> torch.Tensor:
        return ((x.view(torch.int32) >> 23) & 0xFF).to(torch.int64) - 127

    e = exponent(a)
    return torch.where(e == -127, exponent(a * 2.0 ** 24) - 24, e)


class RangeStats:
    """Range statistics of many value streams ("slots"), accumulated on the device.

    :meth:`add` costs two small device ops per tensor: its extremes and a copy of a
    strided sample (a copy, because in-place layers may change the tensor afterwards).
    All samples are binned together in :meth:`flush` (once per forward/backward), so
    the binning's kernel launches do not grow with the number of modules.
    """

    def __init__(self) -> None:
        self.slots: dict[Any, int] = {}
        self._samples: list[torch.Tensor] = []
        self._sample_slots: list[int] = []
        self._peaks: list[torch.Tensor] = []
        self._peak_slots: list[int] = []
        self._index_cache: dict[tuple, torch.Tensor] = {}
        self.hist: torch.Tensor | None = None        # [slots, N_BINS] counts
        self.abs_max: torch.Tensor | None = None     # [slots]
        self.min_nonzero: torch.Tensor | None = None  # [slots]
        self.above: torch.Tensor | None = None       # [slots, len(FORMATS)] counts

    def slot(self, key: Any) -> int:
        return self.slots.setdefault(key, len(self.slots))

    def add_peak(self, key: Any, tensor: torch.Tensor) -> None:
        """Queue only the abs-max of a tensor (over all its values)."""
        if tensor.numel():
            self._peaks.append(extremes(tensor))
            self._peak_slots.append(self.slot(key))

    def add(self, key: Any, tensor: torch.Tensor) -> None:
        """Queue one tensor of stream ``key``: its abs-max and a sample (no host-device sync)."""
        x = tensor.detach()
        if x.numel() == 0:
            return
        self.add_peak(key, x)
        slot = self.slot(key)
        flat = x.reshape(-1)
        stride = flat.numel() // SAMPLE_LIMIT
        if stride > 1:
            flat = flat[::stride | 1]  # an odd stride never lines up with channel counts
        self._samples.append(flat.to(torch.float32, copy=True))
        self._sample_slots.append(slot)

    def _allocate(self, device: torch.device) -> None:
        n = len(self.slots)
        old = self.hist.shape[0] if self.hist is not None else 0
        if n <= old:
            return

        def grow(t: torch.Tensor | None, shape: tuple, fill: float, dtype: torch.dtype):
            new = torch.full(shape, fill, dtype=dtype, device=device)
            return new if t is None else torch.cat([t, new[old:]])
        self.hist = grow(self.hist, (n, N_BINS), 0, torch.int64)
        self.abs_max = grow(self.abs_max, (n,), 0.0, torch.float32)
        self.min_nonzero = grow(self.min_nonzero, (n,), math.inf, torch.float32)
        self.above = grow(self.above, (n, len(FORMATS)), 0, torch.float64)
        self._index_cache.clear()

    def _index(self, slots: list[int], sizes: list[int] | None,
               device: torch.device) -> torch.Tensor:
        # The same modules queue the same sizes every step: build each index tensor once
        # per pattern, so steady-state flushes copy nothing from the host.
        key = (tuple(slots), tuple(sizes) if sizes is not None else None)
        cached = self._index_cache.get(key)
        if cached is None:
            index = torch.tensor(slots)
            if sizes is not None:
                index = torch.repeat_interleave(index, torch.tensor(sizes))
            cached = self._index_cache[key] = index.to(device)
        return cached

    def flush(self) -> None:
        """Bin everything queued since the last flush."""
        if not self._peaks:
            return  # every queued sample comes with its peak
        device = self._peaks[0].device
        self._allocate(device)
        assert self.hist is not None and self.abs_max is not None \
            and self.min_nonzero is not None and self.above is not None  # allocated above
        peak_slots = self._index(self._peak_slots, None, device)
        peaks = torch.stack(self._peaks).abs().amax(dim=1)
        self.abs_max.scatter_reduce_(0, peak_slots, peaks, "amax")
        self._peaks.clear()
        self._peak_slots.clear()
        if not self._samples:
            return
        sizes = [t.numel() for t in self._samples]
        segment = self._index(self._sample_slots, sizes, device)
        n = self.hist.shape[0]
        a = torch.cat(self._samples).abs_()
        finite = torch.isfinite(a)
        index = (floor_log2(a) - E_MIN + 1).clamp_(1, N_BINS - 2)
        index = torch.where(a == 0, 0, torch.where(finite, index, N_BINS - 1))
        self.hist += torch.bincount(segment * N_BINS + index,
                                    minlength=n * N_BINS).view(n, N_BINS)
        positive = torch.where(finite & (a > 0), a, math.inf)
        # One vectorised min per queued tensor beats a scatter over every value.
        mins = torch.stack([part.amin() for part in positive.split(sizes)])
        self.min_nonzero.scatter_reduce_(0, self._index(self._sample_slots, None, device),
                                         mins, "amin")
        for j, f in enumerate(FORMATS):
            self.above[:, j] += torch.bincount(segment, weights=(a > f.max).to(torch.float32),
                                               minlength=n)
        self._samples.clear()
        self._sample_slots.clear()

    def read(self) -> dict[Any, tuple[np.ndarray, np.ndarray]]:
        """{key: (histogram, [abs_max, min_nonzero, above per format])}, one transfer."""
        self.flush()
        if self.hist is None:
            return {}
        # All four are allocated together.
        assert self.abs_max is not None and self.min_nonzero is not None \
            and self.above is not None
        table = torch.cat([self.abs_max[:, None], self.min_nonzero[:, None],
                           self.above.float()], dim=1)
        hist, scalars = (t.cpu().numpy().astype(np.float64) for t in (self.hist, table))
        return {key: (hist[i], scalars[i]) for key, i in self.slots.items()}


def fractions(hist: np.ndarray, limits: FormatLimits, scale_log2: int = 0,
              above_exact: float | None = None) -> dict[str, float]:
    """Share of the sampled values that ``limits`` cannot hold after scaling by 2**scale_log2.

    Zeros are exact in every format and count as held. ``above_exact`` replaces the
    histogram's power-of-two overflow estimate when the exact count is known (scale 1).
    """
    total = hist.sum()
    if total == 0:
        return {"above_max": 0.0, "below_min_normal": 0.0, "flushed_to_zero": 0.0}
    counts = hist[1:-1]
    shifted = _EXPONENTS + scale_log2
    above = above_exact if above_exact is not None else \
        counts[shifted >= math.ceil(math.log2(limits.max))].sum() / total
    return {"above_max": float(above),
            "below_min_normal": float(counts[shifted < limits.min_normal_log2].sum() / total),
            "flushed_to_zero": float(counts[shifted < limits.flush_log2].sum() / total)}


def summarize(hist: np.ndarray, scalars: np.ndarray) -> dict[str, Any]:
    """The JSON form of one stream's statistics after :meth:`RangeStats.read`."""
    total = float(hist.sum())
    abs_max, min_nonzero = float(scalars[0]), float(scalars[1])
    above = dict(zip((f.name for f in FORMATS), scalars[2:]))
    nonzero = {str(e): int(c) for e, c in zip(_EXPONENTS, hist[1:-1]) if c}
    return {
        "abs_max": abs_max if math.isfinite(abs_max) else str(abs_max),
        "min_nonzero": min_nonzero if math.isfinite(min_nonzero) else None,
        "values_sampled": int(total),
        "zeros": float(hist[0] / total) if total else 0.0,
        "nonfinite": float(hist[-1] / total) if total else 0.0,
        **{f.name: fractions(hist, f, above_exact=above[f.name] / total if total else 0.0)
           for f in FORMATS},
        "log2_histogram": nonzero,
    }


class RangeRecorder:
    """Forward hooks (and tensor gradient hooks) on every module of ``model``.

    Per module it records three streams: ``activation`` (outputs), ``gradient`` (the
    gradient arriving at those outputs) and ``param_gradient`` (its own parameters'),
    plus the abs-max of its floating inputs. Gradients are caught with hooks on output
    tensors and on parameters, not with module backward hooks, which break on in-place
    activations (``ReLU(inplace=True)``).
    """

    def __init__(self, model: nn.Module, lowbit: bool = False,
                 mx_scale: str = "floor", without: str = "none") -> None:
        self.stats = RangeStats()
        #: ``lowbit``: also what the low-bit formats would lose (:class:`LowBitRecorder`,
        #: the MX formats' block scales chosen by ``mx_scale``, nvfp4 ``without`` a part)
        self.lowbit = LowBitRecorder(model, mx_scale=mx_scale, without=without) \
            if lowbit else None
        self.modules: dict[str, tuple[str, bool]] = {}   # label -> (type, leaf)
        self.order: dict[str, int] = {}
        self._handles: list[Any] = []
        for name, module in model.named_modules():
            label = name or type(module).__name__
            self.modules[label] = (type(module).__name__, not any(module.children()))
            self._handles.append(module.register_forward_hook(self._forward_hook(label)))
            for param in module.parameters(recurse=False):
                if param.requires_grad:
                    self._handles.append(param.register_hook(
                        lambda grad, key=(label, "param_gradient"): self.stats.add(key, grad)))
        # A new forward means the previous backward has finished: bin what it queued.
        self._handles.append(model.register_forward_pre_hook(lambda *_: self.stats.flush()))

    def _forward_hook(self, label: str) -> Callable:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            self.order.setdefault(label, len(self.order))
            for t in floating_tensors(args):
                self.stats.add_peak((label, "input"), t)
            for t in floating_tensors(output):
                self.stats.add((label, "activation"), t)
                if t.requires_grad:
                    t.register_hook(lambda grad: self.stats.add((label, "gradient"), grad))
        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.lowbit is not None:
            self.lowbit.remove()

    def read(self) -> dict[str, dict[str, Any]]:
        """Every module's statistics, read from the device in one transfer."""
        values = self.stats.read()
        out: dict[str, dict[str, Any]] = {
            label: {"type": kind, "leaf": leaf, "order": self.order.get(label),
                    "input_abs_max": None, "activation": None, "gradient": None,
                    "param_gradient": None, "_hist": {}}
            for label, (kind, leaf) in self.modules.items()}
        for (label, stream), (hist, scalars) in values.items():
            if stream == "input":
                out[label]["input_abs_max"] = float(scalars[0])
            else:
                out[label][stream] = summarize(hist, scalars)
                out[label]["_hist"][stream] = hist
        return out


#: The GEMM operands whose low-bit losses diagnose counts, with the axis each is scaled
#: along in the forward GEMM (input, weight: the reduction axis) and the grad_input GEMM.
LOWBIT_OPERANDS = ("activation", "weight", "gradient")


def counted(recipe: Recipe) -> tuple[Quantiser, Quantiser, Quantiser]:
    """The quantisers :class:`LowBitRecorder` counts ``recipe``'s losses with, as it counts
    them: the forward GEMM's input and weight and the grad-input GEMM's gradient, rounded
    to nearest (:func:`~amptrain.precision.lowbit_operand.loss_counts`). Two recipes alike
    here have the same report: nvfp4 without ``sr`` (rounding) or ``rht`` (a transform
    on the weight-gradient GEMM's operands only) counts as nvfp4 does."""
    return (replace(recipe.input, stochastic=False), replace(recipe.weight, stochastic=False),
            replace(recipe.grad_output, stochastic=False))


class LowBitRecorder:
    """Per Linear layer that the low-bit precisions would take (their default rules:
    plain ``nn.Linear``, aligned dimensions, not the first or last), the share of each
    GEMM operand that each format flushes to zero or saturates under its own scaling:
    the layer's input (``activation``), its ``weight`` and the gradient at its output
    (``gradient``; e5m2 for fp8, the recipe's element format for the others).

    Counts stay on the device and are read once (:meth:`read`)."""

    def __init__(self, model: nn.Module, formats: tuple[str, ...] | None = None,
                 layers: list[str] | None = None, mx_scale: str = "floor",
                 without: str = "none") -> None:
        """``formats``: only these recipes (default: all); ``layers``: these Linear layers
        instead of the low-bit precisions' default choice (``amptrain plan`` asks about
        every aligned Linear, the first and the last too); ``mx_scale``: how the MX
        formats choose their block scales (``--mx-scale``: floor or rceil); ``without``:
        the part of the NVFP4 training recipe left out (``--nvfp4-without``). Counts stay
        keyed by the format's name (``nvfp4``); :attr:`labels` names what was measured."""
        self.recipes = {name: format_recipe(name, mx_scale, without) for name in RECIPES}
        modules = dict(model.named_modules())
        #: label -> the formats that would take it
        self.formats: dict[str, list[str]] = {}
        for name, recipe in self.recipes.items():
            if formats is not None and name not in formats:
                continue
            chosen = plan_float8(model, dim_multiple=recipe.dim_multiple).convert \
                if layers is None else layers
            for label in chosen:
                self.formats.setdefault(label, []).append(name)
        self.counts: dict[tuple[str, str, str], torch.Tensor] = {}
        self._handles = [modules[label].register_forward_hook(self._hook(label))
                         for label in self.formats]

    def _add(self, label: str, operand: str, tensor: torch.Tensor) -> None:
        for name in self.formats[label]:
            recipe = self.recipes[name]
            quantiser = {"activation": recipe.input, "weight": recipe.weight,
                         "gradient": recipe.grad_output}[operand]
            counts = loss_counts(tensor.reshape(-1, tensor.shape[-1]), quantiser, -1)
            key = (label, name, operand)
            self.counts[key] = self.counts[key] + counts if key in self.counts else counts

    def _hook(self, label: str) -> Callable:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            with torch.no_grad():
                self._add(label, "activation", args[0])
                self._add(label, "weight", module.get_parameter("weight"))
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(lambda grad: self._add(label, "gradient", grad))
        return hook

    @property
    def labels(self) -> dict[str, str]:
        """Format -> the recipe it was measured as, where that has a name of its own and
        counts otherwise than the format's (``nvfp4`` -> ``nvfp4 without 2d``; nvfp4
        without sr or rht counts as nvfp4, :func:`counted`, and keeps its name)."""
        return {name: r.name for name, r in self.recipes.items()
                if r.name != name and counted(r) != counted(RECIPES[name])}

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def read(self) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
        """``{module: {format: {operand: {"flushed": share, "saturated": share}}}}``."""
        keys = list(self.counts)
        values = torch.stack([self.counts[k] for k in keys]).tolist() if keys else []
        out: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
        for (label, name, operand), (count, flushed, saturated) in zip(keys, values):
            out.setdefault(label, {}).setdefault(name, {})[operand] = {
                "flushed": flushed / count if count else 0.0,
                "saturated": saturated / count if count else 0.0}
        return out
