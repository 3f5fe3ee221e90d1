"""The recommender: which modules to keep in fp32, the initial loss scale, per-module risk,
and whether bf16 avoids what goes wrong in fp16 -- all read off :mod:`.ranges` statistics.
"""
from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from ..models.gpt import AttentionScores, CausalSoftmax
from ..precision.hardware.advice import bf16_where
from ..precision.nonfinite import NonFiniteEvent
from .ranges import FP16, FP16_MAX, fractions

#: The recommended loss scale keeps the largest gradient this many times below fp16's max,
#: room for gradients to grow before the dynamic scaler has to back off.
SCALE_HEADROOM = 8.0
SCALE_LOG2_RANGE = (-24, 24)
#: A fraction of values above this is worth a line in the report. (Values below fp16's
#: smallest normal are not lost yet: subnormals keep some precision down to 6e-8.)
SIGNIFICANT = 1e-2
#: Activations within this factor of fp16's max are flagged as close to overflowing.
NEAR_OVERFLOW_FACTOR = 16.0

#: Norm layers: autocast keeps (layer norm) or passes through (batch norm) their input
#: dtype, so unlike weight layers they do not cast a large fp32 input down to fp16.
_NORM_TYPES = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm,
               getattr(nn, "RMSNorm", nn.LayerNorm))


#: Attention's fused kernel hides the scores and their softmax; models that expose them as
#: modules (``gpt``: ``blocks.N.attn.scores`` / ``.softmax``) get them named as such.
ATTENTION_PARTS = {AttentionScores.__name__: "attention scores (q.k^T/sqrt(d), the softmax's "
                                             "input)",
                   CausalSoftmax.__name__: "attention softmax"}


class _RunOutcome(Protocol):
    """What :func:`_bf16_verdict` reads of a run: a :class:`~.run.RunSummary`, typed by
    shape because :mod:`.run` imports this module (importing it back would be a circle)."""

    steps: int
    skipped_steps: int
    halted: str | None


def _in_island(name: str, patterns: list[str]) -> bool:
    """True when ``name`` or one of its parents matches a keep_fp32 glob (runs in fp32)."""
    parts = name.split(".")
    prefixes = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatchcase(p, pattern) for p in prefixes for pattern in patterns)


def _casts_inputs_to_half(module: nn.Module) -> bool:
    """True for modules whose maths autocast runs in fp16 (layers with weights, not norms)."""
    has_weights = any(True for _ in module.parameters(recurse=False))
    return has_weights and not isinstance(module, _NORM_TYPES)


def _passes_on(module: nn.Module, s: dict[str, Any]) -> bool:
    """A module without weights (GELU, Dropout) whose inputs already left fp16's range:
    it passes on an overflow made before it, and in fp32 it would change nothing."""
    return next(module.parameters(), None) is None and s["input_abs_max"] is not None \
        and _num(s["input_abs_max"]) > FP16_MAX


def keep_fp32_candidates(stats: dict[str, dict[str, Any]], modules: dict[str, nn.Module],
                         root: str, first: NonFiniteEvent | None,
                         kept: Sequence[str] = ()) -> list[dict[str, str]]:
    """Modules to run in fp32, each with the reason; the most specific module wins.

    Modules that the ``kept`` patterns (the user's --keep-fp32) already cover are left out.
    """
    reasons: dict[str, str] = {}
    for name, s in stats.items():
        if name == root or _in_island(name, list(kept)):
            continue
        if name in modules and _passes_on(modules[name], s):
            continue
        act = s["activation"]
        if act and _num(act["abs_max"]) > FP16_MAX:
            part = ATTENTION_PARTS.get(s.get("type", ""))
            reasons[name] = (f"{part} reach {_g(act['abs_max'])}, above fp16's max "
                             f"{FP16_MAX:g}: the softmax of inf is NaN" if part else
                             f"its outputs reach {_g(act['abs_max'])}, above fp16's max "
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
    return _attention_globs([{"pattern": n, "reason": reasons[n]} for n in names], stats)


def _attention_globs(candidates: list[dict[str, str]],
                     stats: dict[str, dict[str, Any]]) -> list[dict[str, str]]:
    """One pattern for the same attention part of several blocks (``blocks.*.attn.scores``):
    when one block's scores overflow, the others' are as likely to on other data."""
    out: list[dict[str, str]] = []
    merged: dict[str, dict[str, str]] = {}
    for c in candidates:
        name = c["pattern"]
        glob = re.sub(r"(^|\.)\d+(?=\.)", r"\1*", name)
        if stats[name].get("type") not in ATTENTION_PARTS or glob == name:
            out.append(c)
        elif glob in merged:
            merged[glob]["reason"] += f"; {name} too"
        else:
            merged[glob] = {"pattern": glob, "reason": f"{name}: {c['reason']}"}
            out.append(merged[glob])
    return out


def attention_overflow(stats: dict[str, dict[str, Any]], first: NonFiniteEvent | None,
                       range_safe: str = "bf16-mixed (fp32's range)") -> dict[str, Any] | None:
    """Attention scores or softmax outputs beyond fp16's range (or the first inf/NaN of
    16-mixed among them): which modules, how far, and what to do (``range_safe``: what to
    train in instead on this device, :func:`~amptrain.precision.hardware.advice.range_safe_choice`).
    None when neither."""
    hit = sorted(name for name, s in stats.items() if s.get("type") in ATTENTION_PARTS and (
        (s["activation"] and _num(s["activation"]["abs_max"]) > FP16_MAX)
        or (first is not None and first.module == name)))
    if not hit:
        return None
    peak = max(_num(stats[n]["activation"]["abs_max"]) if stats[n]["activation"] else 0.0
               for n in hit)
    return {"modules": hit, "abs_max": peak,
            "reason": (f"{ATTENTION_PARTS[stats[hit[0]]['type']]} reach {_g(peak)} in 32-true, "
                       f"above fp16's max {FP16_MAX:g} ({', '.join(hit[:4])}"
                       f"{', ...' if len(hit) > 4 else ''}): computed unfused in fp16 they "
                       f"overflow to inf and the softmax turns them into NaN (fused attention "
                       f"kernels accumulate them in fp32, their math fallback and eager "
                       f"attention code do not). Keep them in fp32 (--keep-fp32 "
                       f"'*.attn.scores': that attention then runs unfused) or train with "
                       f"{range_safe}")}


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


def run_scale_overflow(stats: dict[str, dict[str, Any]], islands: list[str], scale: float,
                       loss_paths: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The modules whose gradients (32-true run) times the loss scale the 16-mixed run began
    with pass fp16's max: the backward that skips those steps, named at its module (a
    weight gradient's overflow shows in no module's output). Largest first; each with the
    loss the task says trains that module alone (``loss_paths``: a module name, which
    covers its children as --keep-fp32 does, -> what that loss is) and that ``path``."""
    found = []
    for name, s in stats.items():
        if not s["leaf"] or _in_island(name, islands):
            continue  # a container repeats its last child's output gradient
        for kind, label in (("param_gradient", "weight gradients"),
                            ("gradient", "output gradients")):
            peak = _num((s[kind] or {}).get("abs_max", 0.0))
            if math.isfinite(peak) and peak * scale > FP16_MAX:
                path = next((p for p in (loss_paths or {}) if _in_island(name, [p])), None)
                found.append({"module": name, "kind": label, "abs_max": peak,
                              "scaled": peak * scale, "path": path,
                              "loss": (loss_paths or {}).get(path) if path else None})
    return sorted(found, key=lambda f: -f["scaled"])


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
            part = ATTENTION_PARTS.get(s.get("type", ""))
            reasons.append(f"{part + ' ' if part else 'outputs '}reach {_g(peak)} > fp16 max")
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
        for kind, label in (("gradient", "output gradients"),
                            ("param_gradient", "weight gradients")):
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


def _bf16_verdict(stats: dict[str, dict[str, Any]], first: NonFiniteEvent | None,
                  scale: dict[str, Any], bf16_run: _RunOutcome | None,
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
    where = bf16_where(device)  # true on this device: native, or emulated/refused and why
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


# Number formatting for the reasons above; the writer imports it from here, since data
# flows one way in the package (ranges <- recommend <- writer).
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


def computes_in_fp16(precision: str) -> bool:
    """Whether a run in ``precision`` computed in fp16 (its overflows are fp16's)."""
    return precision.split("-")[0] in ("16", "fp16")


def beyond_fp16(stats: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``stats`` with each non-finite abs-max replaced by twice fp16's max (what it is
    known to be: beyond fp16), for the bf16 judgement of an fp16 run."""
    judged = {}
    for name, s in stats.items():
        copy = dict(s)
        for kind in ("activation", *("gradient", "param_gradient")):
            stream = s.get(kind)
            if stream and not math.isfinite(float(stream["abs_max"])):
                copy[kind] = {**stream, "abs_max": 2 * FP16.max,
                              "bf16": {**stream["bf16"], "above_max": 0.0}}
        judged[name] = copy
    return judged


#: A low-bit format "loses" an operand when more than this share of its non-zero values
#: flush to zero or saturate; fp4's two mantissa values lose far more than fp8 by nature,
#: so the 4-bit formats are judged against the 8-bit ones rather than alone.
LOWBIT_LOSS = 1e-2
_EIGHT_BIT = ("fp8", "fp8-rowwise", "mxfp8")


def lowbit_advice(shares: dict[str, dict[str, dict[str, dict[str, float]]]],
                  labels: dict[str, str] | None = None) -> dict[str, Any]:
    """What the low-bit formats lose per eligible Linear layer (from
    :class:`~.ranges.LowBitRecorder`) and the advice that follows: rowwise instead of
    tensorwise scales, a format with more mantissa, or keeping a layer out (``--keep-fp32``).
    ``labels``: a format's name where it was measured as a recipe of its own
    (:attr:`~.ranges.LowBitRecorder.labels`: ``nvfp4 without 2d``), in the advice and in
    the result's ``labels``.
    """
    labels = dict(labels or {})

    def lost(module: str, fmt: str, operand: str) -> float:
        s = shares.get(module, {}).get(fmt, {}).get(operand)
        return s["flushed"] + s["saturated"] if s else 0.0

    worst: dict[str, dict[str, Any]] = {}
    for module, formats in shares.items():
        for fmt, operands in formats.items():
            for operand, s in operands.items():
                if fmt not in worst or lost(module, fmt, operand) > worst[fmt]["lost"]:
                    worst[fmt] = {"module": module, "operand": operand, **s,
                                  "lost": lost(module, fmt, operand)}
    advice: list[str] = []
    for module in shares:
        operand = max(("activation", "weight", "gradient"),
                      key=lambda o: min(lost(module, f, o) for f in _EIGHT_BIT))
        best8 = min(_EIGHT_BIT, key=lambda f: lost(module, f, operand))
        if lost(module, best8, operand) > LOWBIT_LOSS:
            advice.append(f"keep {module} out of the low-bit formats (--keep-fp32 {module}): "
                          f"even {best8} loses {_pct(lost(module, best8, operand))} of its "
                          f"{operand} values")
    tensorwise = worst.get("fp8")
    if tensorwise and tensorwise["lost"] > LOWBIT_LOSS:
        m, o = tensorwise["module"], tensorwise["operand"]
        if lost(m, "fp8-rowwise", o) < tensorwise["lost"] / 2:
            advice.append(f"fp8-rowwise rather than fp8: one scale per tensor loses "
                          f"{_pct(tensorwise['lost'])} of {m}'s {o} values, a scale per row "
                          f"{_pct(lost(m, 'fp8-rowwise', o))}")
    for fmt in ("mxfp4", "nvfp4"):
        w = worst.get(fmt)
        if w and w["lost"] > LOWBIT_LOSS and lost(w["module"], "mxfp8", w["operand"]) \
                < w["lost"] / 4:
            advice.append(f"a format with more mantissa than {labels.get(fmt, fmt)}: it "
                          f"loses {_pct(w['lost'])} of {w['module']}'s {w['operand']} values "
                          f"(flushed {_pct(w['flushed'])}, saturated {_pct(w['saturated'])});"
                          f" mxfp8 {_pct(lost(w['module'], 'mxfp8', w['operand']))}")
    return {"modules": shares, "worst": worst, "advice": advice, "labels": labels}
