"""Find what overflows or underflows in fp16, and what to do about it: ``amptrain diagnose``.

Four short runs of the same steps from the same initial weights and data, all through
the :class:`~amptrain.trainer.Trainer`:

1. ``32-true`` with hooks on every module that record, per module, the range of its
   activations (outputs), of the gradients arriving at those outputs, and of its own
   parameters' gradients -- abs-max, smallest non-zero magnitude, and the fractions
   that fp16 and bf16 could not hold (above max, below the smallest normal, flushed to
   zero). Statistics stay on the device (a strided sample of at most
   :data:`SAMPLE_LIMIT` values per tensor feeds a log2 histogram; abs-max covers the
   whole tensor) and are read once at the end.
2. ``16-mixed`` as the user would train it: the first module whose output or output
   gradient held inf/NaN, and at which step.
3. ``16-mixed`` with the recommendations applied (``keep_fp32`` + initial loss scale):
   does it train without non-finite steps?
4. ``bf16-mixed``: does bf16 avoid the problem?

The log2 histograms make the loss-scale arithmetic exact: multiplying by a power of
two shifts the histogram, so the fractions at the recommended scale are read off the
same data.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import fnmatch
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from .config import RunConfig, TrainConfig, build_config, flag
from .data import DataBundle
from .devices import resolve_device
from .env import cpu_flags, device_features, gpu_info, supported_precisions
from .errors import UserError
from .precision import NonFiniteHalt
from .probe import NonFiniteEvent, NonFiniteWatch, extremes, floating_tensors
from .runner import prepare_run
from .trainer import Trainer

log = logging.getLogger("amptrain")

# ------------------------------------------------------------------ formats
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
#: The recommended loss scale keeps the largest gradient this many times below fp16's max,
#: room for gradients to grow before the dynamic scaler has to back off.
SCALE_HEADROOM = 8.0
SCALE_LOG2_RANGE = (-24, 24)
#: A fraction of values above this is worth a line in the report. (Values below fp16's
#: smallest normal are not lost yet: subnormals keep some precision down to 6e-8.)
SIGNIFICANT = 1e-2
#: Activations within this factor of fp16's max are flagged as close to overflowing.
NEAR_OVERFLOW_FACTOR = 16.0

# Histogram layout: bin 0 holds zeros, bins 1.. hold floor(log2|x|) from E_MIN to E_MAX
# (every finite fp32 magnitude), and the last bin holds inf/NaN.
E_MIN, E_MAX = -150, 128
N_BINS = E_MAX - E_MIN + 3
_EXPONENTS = np.arange(E_MIN, E_MAX + 1)

#: Norm layers: autocast keeps (layer norm) or passes through (batch norm) their input
#: dtype, so unlike weight layers they do not cast a large fp32 input down to fp16.
_NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm,
               getattr(nn, "RMSNorm", nn.LayerNorm))


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
        scalars = torch.cat([self.abs_max[:, None], self.min_nonzero[:, None],
                             self.above.float()], dim=1)
        hist, scalars = (t.cpu().numpy().astype(np.float64) for t in (self.hist, scalars))
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

    def __init__(self, model: nn.Module) -> None:
        self.stats = RangeStats()
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


# --------------------------------------------------------------------- runs
@dataclass
class RunSummary:
    """One short training run: how many steps were skipped, where inf/NaN first appeared."""

    precision: str
    steps: int
    skipped_steps: int
    first_nonfinite: NonFiniteEvent | None
    halted: str | None
    keep_fp32: list[str]
    init_scale: float | None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["first_nonfinite"] = dataclasses.asdict(self.first_nonfinite) \
            if self.first_nonfinite else None
        return data


def run_steps(config: TrainConfig, data: DataBundle, model: nn.Module, steps: int,
              precision: str, attach: Callable[[Trainer], Any] | None = None,
              **overrides: Any) -> tuple[RunSummary, Any]:
    """Train ``model`` for ``steps`` steps with the Trainer; returns (summary, attached).

    ``attach(trainer)`` installs hooks on the prepared model and returns an object with
    ``remove()``. Nothing is written to disk; a run that halts on non-finite values is
    reported, not raised.
    """
    options = dict(precision=precision, max_steps=steps, epochs=steps, out=None,
                   no_progress=True, log_every=steps, eval_every=None, save_every=None,
                   resume=None, compile=False, **overrides)
    trainer = Trainer(dataclasses.replace(config, **options))
    trainer.setup(model, data.train)
    watch = NonFiniteWatch(trainer.model, lambda: trainer.step,
                           lambda: trainer.precision.loss_scale_tensor)
    attached = attach(trainer) if attach is not None else None
    halted = None
    try:
        trainer.run()
    except NonFiniteHalt as exc:
        halted = str(exc)
    finally:
        watch.remove()
        if attached is not None:
            attached.remove()
        trainer.precision.teardown()
    c = trainer.config
    summary = RunSummary(precision=trainer.precision.name, steps=trainer.step,
                         skipped_steps=trainer.precision.skipped_steps,
                         first_nonfinite=watch.first(), halted=halted,
                         keep_fp32=list(c.keep_fp32),
                         init_scale=c.init_scale if trainer.precision.spec.loss_scaling else None)
    return summary, attached


# ----------------------------------------------------------- recommendations
def _in_island(name: str, patterns: list[str]) -> bool:
    """True when ``name`` or one of its parents matches a keep_fp32 glob (runs in fp32)."""
    parts = name.split(".")
    prefixes = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatchcase(p, pattern) for p in prefixes for pattern in patterns)


def _casts_inputs_to_half(module: nn.Module) -> bool:
    """True for modules whose maths autocast runs in fp16 (layers with weights, not norms)."""
    has_weights = any(True for _ in module.parameters(recurse=False))
    return has_weights and not isinstance(module, _NORM_TYPES)


def keep_fp32_candidates(stats: dict[str, dict[str, Any]], modules: dict[str, nn.Module],
                         root: str, first: NonFiniteEvent | None,
                         kept: list[str] = ()) -> list[dict[str, str]]:
    """Modules to run in fp32, each with the reason; the most specific module wins.

    Modules that the ``kept`` patterns (the user's --keep-fp32) already cover are left out.
    """
    reasons: dict[str, str] = {}
    for name, s in stats.items():
        if name == root or _in_island(name, list(kept)):
            continue
        act = s["activation"]
        if act and _num(act["abs_max"]) > FP16_MAX:
            reasons[name] = (f"its outputs reach {_g(act['abs_max'])}, above fp16's max "
                             f"{FP16_MAX:g}")
        elif s["input_abs_max"] is not None and s["input_abs_max"] > FP16_MAX \
                and name in modules and _casts_inputs_to_half(modules[name]):
            reasons[name] = (f"its inputs reach {_g(s['input_abs_max'])}; autocast would cast "
                             f"them to fp16 (max {FP16_MAX:g})")
    if first is not None and first.phase == "forward" and first.module != root \
            and first.module not in reasons and not _in_island(first.module, list(kept)):
        reasons[first.module] = (f"first module to produce inf/NaN in 16-mixed "
                                 f"(forward, step {first.step})")
    # A module whose descendant is a candidate is covered by it (a container's output
    # is usually its last child's).
    names = [n for n in reasons if not any(o.startswith(n + ".") for o in reasons)]
    names.sort(key=lambda n: (stats[n]["order"] is None, stats[n]["order"] or 0))
    return [{"pattern": n, "reason": reasons[n]} for n in names]


def recommend_loss_scale(stats: dict[str, dict[str, Any]], islands: list[str],
                         default_scale: float) -> dict[str, Any]:
    """The largest power of two that keeps every fp16 gradient SCALE_HEADROOM x below max.

    Gradients inside fp32 islands are fp32 and do not count. Returns the scale and the
    gradient fractions fp16 cannot hold without it and with it.
    """
    hists, peaks, smallest, counted = [], [], [], []
    for name, s in stats.items():
        if _in_island(name, islands):
            continue
        for kind in ("gradient", "param_gradient"):
            if s[kind] is not None:
                hists.append(s["_hist"][kind])
                peaks.append(_num(s[kind]["abs_max"]))
                if s[kind]["min_nonzero"] is not None:
                    smallest.append(s[kind]["min_nonzero"])
                counted.append(name)
    result: dict[str, Any] = {"init_scale": default_scale, "log2": None,
                              "headroom": SCALE_HEADROOM, "grad_abs_max": None,
                              "grad_min_nonzero": min(smallest) if smallest else None,
                              "modules_counted": len(set(counted)),
                              "unscaled": None, "scaled": None, "reason": ""}
    if not hists:
        result["reason"] = "no gradients were recorded; keeping the configured scale"
        return result
    total = np.sum(hists, axis=0)
    g_max = max(peaks)
    result["grad_abs_max"] = g_max if math.isfinite(g_max) else str(g_max)
    if not math.isfinite(g_max) or total[-1] > 0:
        result["reason"] = ("gradients are non-finite even in fp32: this is not a precision "
                            "problem (lower --lr, clip with --clip-grad-norm)")
        return result
    if g_max == 0:
        result["reason"] = "all gradients are zero; keeping the configured scale"
        return result
    lo, hi = SCALE_LOG2_RANGE
    log2 = int(min(hi, max(lo, math.floor(math.log2(FP16_MAX / (g_max * SCALE_HEADROOM))))))
    result.update(init_scale=float(2.0 ** log2), log2=log2,
                  unscaled=fractions(total, FP16), scaled=fractions(total, FP16, log2))
    still = result["scaled"]["below_min_normal"]
    headroom = f"the largest gradient {_g(g_max)} x {2.0 ** log2:g} stays " \
               f"{SCALE_HEADROOM:g}x below fp16's max"
    if still > SIGNIFICANT:
        result["reason"] = (f"{headroom}, but {_pct(still)} of gradients stay below fp16's "
                            f"smallest normal: the gradient range is wider than fp16's "
                            f"(bf16 has fp32's range)")
    else:
        result["reason"] = (f"{headroom}; gradients below fp16's smallest normal: "
                            f"{_pct(result['unscaled']['below_min_normal'])} unscaled -> "
                            f"{_pct(still)} scaled")
    return result


def module_risks(name: str, s: dict[str, Any], first: NonFiniteEvent | None,
                 scale_log2: int | None, island: bool, casts_to_half: bool,
                 kept_by_user: bool = False) -> tuple[float, list[str]]:
    """A risk score (higher first in the report) and the reasons behind it.

    ``island``: the module runs in fp32 once the recommendations are applied (its
    gradients then do not count); ``kept_by_user``: it already does (--keep-fp32), so
    its forward range is no risk either.
    """
    score, reasons = 0.0, []
    if first is not None and first.module == name:
        score += 1000
        reasons.append(f"first inf/NaN in 16-mixed ({first.phase}, step {first.step})")
    act = s["activation"]
    if kept_by_user:
        reasons.append("runs in fp32 (--keep-fp32)")
    elif act:
        peak = _num(act["abs_max"])
        if peak > FP16_MAX:
            score += 100 + math.log2(peak / FP16_MAX)
            reasons.append(f"outputs reach {_g(peak)} > fp16 max")
        elif peak > FP16_MAX / NEAR_OVERFLOW_FACTOR:
            score += 20
            reasons.append(f"outputs reach {_g(peak)}, within {NEAR_OVERFLOW_FACTOR:g}x "
                           f"of fp16 max")
        if act["fp16"]["below_min_normal"] > SIGNIFICANT:
            score += 10 * act["fp16"]["below_min_normal"]
            reasons.append(f"{_pct(act['fp16']['below_min_normal'])} of outputs below fp16 "
                           f"min normal")
    if s["input_abs_max"] is not None and s["input_abs_max"] > FP16_MAX and casts_to_half \
            and not kept_by_user:
        score += 80
        reasons.append(f"inputs reach {_g(s['input_abs_max'])} > fp16 max")
    if not island:
        for kind, label in (("gradient", "output gradients"), ("param_gradient", "weight gradients")):
            g = s[kind]
            if not g:
                continue
            if _num(g["abs_max"]) > FP16_MAX:
                score += 60
                reasons.append(f"{label} reach {_g(g['abs_max'])} > fp16 max unscaled")
            # Loss scaling exists for unscaled underflow, so it weighs little; what is
            # left at the recommended scale weighs more.
            under = g["fp16"]["below_min_normal"]
            if under > SIGNIFICANT:
                score += 10 * under + 10 * g["fp16"]["flushed_to_zero"]
                reasons.append(f"{_pct(under)} of {label} below fp16 min normal unscaled")
            if scale_log2 is not None:
                left = fractions(s["_hist"][kind], FP16, scale_log2)["below_min_normal"]
                if left > SIGNIFICANT:
                    score += 50 * left
                    reasons.append(f"{_pct(left)} of {label} below it even at the "
                                   f"recommended scale")
    bad_in_bf16 = bf16_trouble(s)
    if bad_in_bf16:
        score += 40
        reasons.append(f"{', '.join(bad_in_bf16)} out of bf16's range too")
    return score, reasons


def bf16_trouble(s: dict[str, Any]) -> list[str]:
    """Which of a module's value streams overflow bf16.

    bf16 has fp32's exponent: what it flushes (below 2**-134, about 1e-40) is far below
    any optimizer's eps and nearly flushed by fp32 itself, so only overflow counts here;
    the flushed fractions are still reported.
    """
    return [kind.replace("_", " ") for kind in ("activation", "gradient", "param_gradient")
            if s[kind] and (s[kind]["bf16"]["above_max"] > 0
                            or not math.isfinite(_num(s[kind]["abs_max"])))]


# ------------------------------------------------------------------ diagnose
def diagnose(config: TrainConfig, steps: int = 20, *, data: DataBundle | None = None,
             model: nn.Module | None = None) -> dict[str, Any]:
    """Run the four diagnosis runs and build the report (a JSON-ready dict).

    ``config`` (a :class:`RunConfig`) names the model and data, built with
    :func:`~amptrain.runner.prepare_run`, unless ``data`` and ``model`` are given (then a
    plain :class:`TrainConfig` will do). Its training options (batch size, lr, seed,
    scaler settings, keep_fp32...) apply to every run.
    """
    if steps < 1:
        raise UserError(f"--steps must be an integer >= 1 (got {steps})")
    if data is None or model is None:
        if not isinstance(config, RunConfig):
            raise UserError("diagnose needs a model and data, or a RunConfig naming them")
        data, model = prepare_run(config)
    initial = copy.deepcopy(model)

    stats_run, recorder = run_steps(config, data, copy.deepcopy(initial), steps, "32-true",
                                    attach=lambda t: RangeRecorder(t.model))
    stats = recorder.read()
    device = resolve_device(config.device)
    fp16_run, _ = run_steps(config, data, copy.deepcopy(initial), steps, "16-mixed")
    first = fp16_run.first_nonfinite

    modules = {(n or type(m).__name__): m for n, m in initial.named_modules()}
    root = type(initial).__name__  # how the hooks label the model itself
    keep = keep_fp32_candidates(stats, modules, root, first, config.keep_fp32)
    islands = list(dict.fromkeys(list(config.keep_fp32) + [k["pattern"] for k in keep]))
    scale = recommend_loss_scale(stats, islands, config.init_scale)

    verify_options: dict[str, Any] = {"keep_fp32": islands, "init_scale": scale["init_scale"]}
    if scale["init_scale"] < config.min_scale:
        verify_options["min_scale"] = scale["init_scale"]
    verified, _ = run_steps(config, data, copy.deepcopy(initial), steps, "16-mixed",
                            **verify_options)
    bf16_run = None
    supported = _supported_here(device)
    if supported["bf16-mixed"] or device.type == "cpu":
        bf16_run, _ = run_steps(config, data, copy.deepcopy(initial), steps, "bf16-mixed")

    for name, s in stats.items():
        island = _in_island(name, islands)
        casts = name in modules and _casts_inputs_to_half(modules[name])
        s["fp32_with_recommendations"] = island
        s["risk"], s["reasons"] = module_risks(name, s, first, scale["log2"], island, casts,
                                               _in_island(name, list(config.keep_fp32)))
        if s["gradient"] is not None and scale["log2"] is not None:
            s["gradient"]["fp16_at_recommended_scale"] = fractions(
                s["_hist"]["gradient"], FP16, scale["log2"])
        if s["param_gradient"] is not None and scale["log2"] is not None:
            s["param_gradient"]["fp16_at_recommended_scale"] = fractions(
                s["_hist"]["param_gradient"], FP16, scale["log2"])

    report = {
        "model": getattr(config, "model", type(initial).__name__),
        "data": getattr(config, "data", None), "root": root, "steps": steps,
        "batch_size": config.batch_size, "seed": config.seed, "device": str(device),
        "sample_limit": SAMPLE_LIMIT,
        "formats": {f.name: {"max": f.max, "min_normal": f.min_normal,
                             "flush_below": f.flush_below} for f in FORMATS},
        "first_nonfinite": dataclasses.asdict(first) if first else None,
        "runs": {"32-true": stats_run.to_json(), "16-mixed": fp16_run.to_json(),
                 "16-mixed-recommended": verified.to_json(),
                 "bf16-mixed": bf16_run.to_json() if bf16_run else None},
        "recommendations": {
            "init_scale": scale["init_scale"],
            "min_scale": verify_options.get("min_scale"),
            "loss_scale": scale,
            "keep_fp32": keep,
            "bf16": _bf16_verdict(stats, first, scale, bf16_run, supported, device),
        },
        "modules": {name: {k: v for k, v in s.items() if k != "_hist"}
                    for name, s in sorted(stats.items(), key=lambda kv: (
                        -kv[1]["risk"], not kv[1]["leaf"], _order(kv[1])))},
    }
    report["recommendations"]["flags"] = _flags(report["recommendations"], islands)
    report["recommendations"]["verified"] = {
        "skipped_steps": verified.skipped_steps, "steps": verified.steps,
        "first_nonfinite": report["runs"]["16-mixed-recommended"]["first_nonfinite"],
        "clean": verified.skipped_steps == 0 and verified.halted is None}
    return report


def _supported_here(device: torch.device) -> dict[str, bool]:
    gpus = [gpu_info(i) for i in range(torch.cuda.device_count())] \
        if device.type == "cuda" else []
    return supported_precisions(device_features(device, cpu_flags(), gpus))


def _bf16_verdict(stats: dict[str, dict[str, Any]], first: NonFiniteEvent | None,
                  scale: dict[str, Any], bf16_run: RunSummary | None,
                  supported: dict[str, bool], device: torch.device) -> dict[str, Any]:
    """Does bf16-mixed avoid what goes wrong in fp16? From the ranges and the bf16 run."""
    overflow = any(s["activation"] and _num(s["activation"]["abs_max"]) > FP16_MAX
                   for s in stats.values())
    unscaled = (scale["unscaled"] or {}).get("below_min_normal", 0.0)
    fp16_problems = []
    if first is not None:
        fp16_problems.append(f"inf/NaN from step {first.step}")
    if overflow:
        fp16_problems.append(f"activations above its max {FP16_MAX:g}")
    if unscaled > SIGNIFICANT:
        fp16_problems.append(f"{_pct(unscaled)} of gradients below its smallest normal "
                             f"without loss scaling")
    fp16_problem = bool(fp16_problems)
    out_of_bf16 = [n for n, s in stats.items() if bf16_trouble(s)]
    clean_run = bf16_run is not None and bf16_run.skipped_steps == 0 and bf16_run.halted is None
    native = supported.get("bf16-mixed", False)
    where = "native on this device" if native else \
        f"but not native on this {device.type} (emulated or refused)"
    if out_of_bf16:
        reason = f"values of {', '.join(out_of_bf16[:3])} are out of bf16's range too"
    elif bf16_run is not None and not clean_run:
        reason = (f"bf16-mixed had {bf16_run.skipped_steps} non-finite steps in "
                  f"{bf16_run.steps}")
    elif fp16_problem:
        reason = (f"fp16: {', '.join(fp16_problems)}; bf16: no recorded value overflows it "
                  f"(fp32's exponent range, no loss scaling needed); "
                  f"{'0 non-finite steps in a bf16-mixed run; ' if clean_run else ''}{where}")
    else:
        reason = f"fp16 has no range problem here; bf16 would also be fine ({where})"
    return {"avoids_problem": bool(fp16_problem and not out_of_bf16
                                   and (bf16_run is None or clean_run)),
            "fp16_problem": fp16_problem, "native": native,
            "run_clean": clean_run if bf16_run is not None else None, "reason": reason}


def _flags(recs: dict[str, Any], islands: list[str]) -> str:
    parts = ["--precision 16-mixed", f"--init-scale {recs['init_scale']:g}"]
    if recs.get("min_scale") is not None:
        parts.append(f"--min-scale {recs['min_scale']:g}")
    parts += [f"--keep-fp32 '{p}'" if any(c in p for c in "*?[") else f"--keep-fp32 {p}"
              for p in islands]
    return " ".join(parts)


def _order(s: dict[str, Any]) -> int:
    return s["order"] if s["order"] is not None else 1 << 30


def _num(value: Any) -> float:
    """abs_max as a float (non-finite ones are stored as the strings 'inf'/'nan')."""
    return float(value) if value is not None else 0.0


def _g(value: Any) -> str:
    return f"{_num(value):.3g}"


def _pct(fraction: float) -> str:
    if fraction == 0:
        return "0%"
    if fraction < 1e-4:
        return f"{fraction * 100:.1g}%"
    return f"{fraction * 100:.2f}%" if fraction < 0.1 else f"{fraction * 100:.1f}%"


# ------------------------------------------------------------------ reports
def summary_lines(report: dict[str, Any]) -> list[str]:
    """The short summary printed by the command (and atop diagnose.md)."""
    recs = report["recommendations"]
    lines = [f"diagnose: {report['model']} on {report['data'] or 'the given data'}, "
             f"{report['steps']} steps of "
             f"{report['batch_size']} on {report['device']} (32-true statistics, then 16-mixed)"]
    first = report["first_nonfinite"]
    fp16 = report["runs"]["16-mixed"]
    if first:
        scale = f", loss scale {first['loss_scale']:g}" if first["loss_scale"] else ""
        lines.append(f"first non-finite in 16-mixed: module '{first['module']}' "
                     f"({first['phase']}) at step {first['step']}{scale}; "
                     f"{fp16['skipped_steps']} of {fp16['steps']} steps skipped"
                     + (" (halted)" if fp16["halted"] else ""))
    else:
        lines.append(f"16-mixed: no non-finite values in {fp16['steps']} steps")
    fp32 = report["runs"]["32-true"]
    if fp32["skipped_steps"]:
        lines.append(f"32-true itself had {fp32['skipped_steps']} non-finite steps of "
                     f"{fp32['steps']}: that is not a precision problem (lower --lr, "
                     f"--clip-grad-norm)")
    risky: list[tuple[str, dict[str, Any]]] = []
    for name, m in report["modules"].items():
        # A container usually repeats its last child's numbers: name the child only.
        if m["risk"] > 0 and len(risky) < 3 and not any(
                name == report["root"] or other.startswith(name + ".") for other, _ in risky):
            risky.append((name, m))
    if risky:
        lines.append("riskiest: " + "; ".join(f"{n} ({m['reasons'][0]})" for n, m in risky))
    for k in recs["keep_fp32"]:
        lines.append(f"keep in fp32: {k['pattern']} -- {k['reason']}")
    ls = recs["loss_scale"]
    lines.append(f"initial loss scale: {recs['init_scale']:g} -- {ls['reason']}")
    v = recs["verified"]
    lines.append(f"recommended: {recs['flags']}")
    lines.append(f"  checked: {v['steps']} steps of 16-mixed with it -> {v['skipped_steps']} "
                 f"non-finite steps")
    b = recs["bf16"]
    lines.append(f"bf16-mixed {'avoids the problem' if b['avoids_problem'] else 'does not avoid it' if b['fp16_problem'] else 'is also fine'}: "
                 f"{b['reason']}")
    return lines


def _cell(stats: dict[str, Any] | None, key: str, fmt: str = "frac") -> str:
    if not stats:
        return ""
    if fmt == "num":
        value = stats[key]
        return "" if value is None else _g(value)
    fmt_name, field_name = key.split(".")
    return _pct(stats[fmt_name][field_name])


def markdown_report(report: dict[str, Any]) -> str:
    """diagnose.md: the summary, the recommendations and a table, riskiest modules first."""
    recs = report["recommendations"]
    lines = ["# amptrain diagnose", "", *[f"- {line}" for line in summary_lines(report)], ""]
    ls = recs["loss_scale"]
    if ls["unscaled"] and ls["scaled"]:
        lines += ["## Loss scale", "",
                  f"Gradient values fp16 cannot hold ({ls['modules_counted']} modules outside "
                  f"fp32 islands, sampled):", "",
                  "| scale | above fp16 max | below fp16 min normal | flushed to zero |",
                  "|---|---|---|---|"]
        for label, f in (("1", ls["unscaled"]), (f"{recs['init_scale']:g} (recommended)",
                                                 ls["scaled"])):
            lines.append(f"| {label} | {_pct(f['above_max'])} | {_pct(f['below_min_normal'])} "
                         f"| {_pct(f['flushed_to_zero'])} |")
        lines.append("")
    lines += ["## Modules (riskiest first)", "",
              "Fractions are of sampled values; fp16: max 65504, min normal 6.1e-05, "
              "values below 3.0e-08 flush to zero. Gradients are unscaled (fp32 run); "
              "\"x scale\" multiplies them by the recommended loss scale, and (fp32) marks "
              "modules that run in fp32 once the recommendations are applied.", "",
              "| module | type | risk | act abs-max | act min≠0 | act >fp16 max "
              "| act <fp16 normal | act flushed | grad abs-max | grad min≠0 "
              "| grad <fp16 normal | grad flushed | grad <normal x scale | weight-grad abs-max "
              "| out of bf16 range | why |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in report["modules"].items():
        act, grad = m["activation"], m["gradient"]
        scaled = "(fp32)" if m["fp32_with_recommendations"] else \
            _pct(grad["fp16_at_recommended_scale"]["below_min_normal"]) \
            if grad and "fp16_at_recommended_scale" in grad else ""
        bf16_bad = bf16_trouble(m)
        lines.append(
            f"| `{name}` | {m['type']} | {m['risk']:.0f} | {_cell(act, 'abs_max', 'num')} "
            f"| {_cell(act, 'min_nonzero', 'num')} | {_cell(act, 'fp16.above_max')} "
            f"| {_cell(act, 'fp16.below_min_normal')} | {_cell(act, 'fp16.flushed_to_zero')} "
            f"| {_cell(grad, 'abs_max', 'num')} | {_cell(grad, 'min_nonzero', 'num')} "
            f"| {_cell(grad, 'fp16.below_min_normal')} | {_cell(grad, 'fp16.flushed_to_zero')} "
            f"| {scaled} | {_cell(m['param_gradient'], 'abs_max', 'num')} "
            f"| {', '.join(bf16_bad) or 'none'} | {'; '.join(m['reasons'])} |")
    return "\n".join(lines) + "\n"


def write_reports(report: dict[str, Any], out: str | Path) -> tuple[Path, Path]:
    """Write DIR/diagnose.json and DIR/diagnose.md."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "diagnose.json", out / "diagnose.md"
    json_path.write_text(json.dumps(report, indent=2, allow_nan=False, default=_jsonable))
    md_path.write_text(markdown_report(report))
    return json_path, md_path


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


# ---------------------------------------------------------------- command
#: Train options that make no sense for a fixed number of diagnosis steps.
_NOT_FLAGS = {"precision", "epochs", "max_steps", "resume", "save_every", "keep_last",
              "eval_every", "log_every", "compile", "strategy", "no_progress"}


def add_diagnose_args(parser: argparse.ArgumentParser) -> None:
    """Flags of ``amptrain diagnose``: --steps plus the train options that apply."""
    from .cli import add_config_flags

    parser.add_argument("--config", help="YAML file of options (flags override it)")
    parser.add_argument("--steps", type=int, default=20,
                        help="optimizer steps per diagnosis run (default: 20)")
    add_config_flags(parser, RunConfig, only=[f.name for f in dataclasses.fields(RunConfig)
                                              if f.name not in _NOT_FLAGS])


def run_diagnose(args: argparse.Namespace) -> int:
    """``amptrain diagnose``: run, write DIR/diagnose.{json,md}, print the summary."""
    from .cli import default_out, merged_values

    values = merged_values(args)
    ignored = sorted(k for k in values if k in _NOT_FLAGS)
    if ignored:  # only a --config YAML can bring these (a train config reused)
        log.info("diagnose ignores %s from --config: it runs --steps steps in each precision",
                 ", ".join(flag(k) for k in ignored))
        for key in ignored:
            del values[key]
    config = build_config(RunConfig, values, source="option")
    if not config.out:
        config.out = default_out(config)
    report = diagnose(config, args.steps)
    json_path, md_path = write_reports(report, config.out)
    print("\n".join(summary_lines(report)))
    print(f"reports: {json_path}, {md_path}")
    return 0
