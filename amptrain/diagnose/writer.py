"""The report writers: the printed summary, diagnose.md and diagnose.json."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from .recommend import _g, _pct, bf16_trouble
from ..common import outdir


def summary_lines(report: dict[str, Any]) -> list[str]:
    """The short summary printed by the command (and atop diagnose.md)."""
    recs = report["recommendations"]
    lines = [(f"diagnose: {report['model']} on {report['data'] or 'the given data'}, "
             f"{report['steps']} steps of "
             f"{report['batch_size']} on {report['device']} (32-true statistics, then 16-mixed)")]
    first = report["first_nonfinite"]
    fp16 = report["runs"]["16-mixed"]
    if first:
        scale = f", loss scale {first['loss_scale']:g}" if first["loss_scale"] else ""
        lines.append(f"first non-finite in 16-mixed: module '{first['module']}' "
                     f"({first['phase']}){_part_and_loss(first)} at step {first['step']}{scale}; "
                     f"{fp16['skipped_steps']} of {_steps(fp16)} skipped"
                     + (" (halted)" if fp16["halted"] else ""))
    elif fp16["skipped_steps"]:  # the scaler saw inf/NaN gradients no module output held
        lines.append(f"16-mixed: {fp16['skipped_steps']} of {_steps(fp16)} skipped with no "
                     f"non-finite module output: the scaled backward overflowed")
    else:
        lines.append(f"16-mixed: no non-finite values in {fp16['steps']} steps")
    lines += overflow_lines(recs)
    asked = report.get("asked_precision")
    if asked:
        lines.append(_asked_line(asked, report["runs"][asked]))
    fp32 = report["runs"]["32-true"]
    if fp32["skipped_steps"]:
        lines.append(f"32-true itself had {fp32['skipped_steps']} non-finite steps of "
                     f"{_steps(fp32)}: that is not a precision problem (lower --lr, "
                     f"--clip-grad-norm)")
    lines += finding_lines(report)
    ls = recs["loss_scale"]
    lines.append(f"initial loss scale: {recs['init_scale']:g} -- {ls['reason']}")
    v = recs["verified"]
    lines.append(f"recommended: {recs['flags']}")
    if v.get("not_checked"):
        lines.append(f"  not checked: {v['not_checked']}")
    else:
        lines.append(f"  checked: {v['steps']} steps of 16-mixed with it -> "
                     f"{v['skipped_steps']} non-finite steps"
                     + (f" (of {_steps(v)})" if v.get("parts", 1) > 1 else ""))
    if recs.get("device_note"):  # these flags are fp16's; this device may only emulate fp16
        lines.append(f"  note: {recs['device_note']}")
    b = recs["bf16"]
    verdict = ("avoids the problem" if b["avoids_problem"]
               else "does not avoid it" if b["fp16_problem"] else "is also fine")
    lines.append(f"bf16-mixed {verdict}: "
                 f"{b['reason']}")
    return lines + lowbit_lines(recs.get("lowbit") or {})


def overflow_lines(recs: dict[str, Any]) -> list[str]:
    """The gradients that overflow fp16 at the loss scale the 16-mixed run began with, by
    module and the loss behind them, and what follows: the recommended lower scale, or
    that loss's modules in fp32 (checked)."""
    over = recs.get("run_scale_overflow") or {}
    modules = over.get("modules") or []
    if not modules:
        return []
    shown = modules[:3]
    named = "; ".join(f"{o['module']} {o['kind']} {_g(o['abs_max'])} -> {o['scaled']:.3g}"
                      for o in shown) + (f" (+{len(modules) - 3} more)" if len(modules) > 3
                                         else "")
    losses = list(dict.fromkeys(o["loss"] for o in modules if o["loss"]))
    lines = [f"overflow at the loss scale {over['init_scale']:g}: {named} > fp16 max (65504)"
             + (f": {'; '.join(losses)}" if losses else "")]
    follows = [f"--init-scale {recs['init_scale']:g} (checked below)"]
    check = over.get("keep_fp32_paths")
    if check:
        kept = " ".join(f"--keep-fp32 {p}" for p in check["keep_fp32"])
        follows.append(f"{kept} at the scale {over['init_scale']:g} (checked: "
                       f"{check['skipped_steps']} of {check['steps']} steps skipped)")
    if any("unnormalised" in (o["loss"] or "") for o in modules):
        follows.append("smaller returns (rewards scaled or normalised)")
    lines.append("  follows: " + ", or ".join(follows))
    return lines


def lowbit_lines(lowbit: dict[str, Any]) -> list[str]:
    """What each low-bit format loses at worst (flushed to zero / saturated) and the advice;
    the MX block scales named where ``--mx-scale`` chose rceil, a format measured as a
    recipe of its own by that recipe's name (``nvfp4 without 2d``)."""
    worst = lowbit.get("worst") or {}
    if not worst:
        return []
    labels = lowbit.get("labels") or {}
    cells = [f"{labels.get(fmt, fmt)} {_pct(w['flushed'])}/{_pct(w['saturated'])} "
             f"({w['module']} {w['operand']})"
             for fmt, w in worst.items()]
    mx_scale = lowbit.get("mx_scale")
    scales = f" (MX block scales: {mx_scale})" if mx_scale not in (None, "floor") else ""
    return ([f"low-bit formats{scales}, worst flushed/saturated share: {'; '.join(cells)}"]
            + [f"  {line}" for line in lowbit.get("advice", [])])


def finding_lines(report: dict[str, Any], keep_hint: str = "") -> list[str]:
    """The riskiest modules, attention's trouble and the modules to keep in fp32 (one line
    each), for ``amptrain diagnose``'s summary and the trainer callbacks' (``keep_hint``
    follows each keep-in-fp32 line)."""
    lines: list[str] = []
    recs = report["recommendations"]
    risky: list[tuple[str, dict[str, Any]]] = []
    for name, m in report["modules"].items():
        # A container usually repeats its last child's numbers: name the child only.
        if m["risk"] > 0 and m["reasons"] and len(risky) < 3 and name != report["root"] \
                and not any(other.startswith(name + ".") for other, _ in risky):
            risky.append((name, m))
    if risky:
        lines.append("riskiest: " + "; ".join(f"{n} ({m['reasons'][0]})" for n, m in risky))
    if recs.get("attention"):
        lines.append(f"attention: {recs['attention']['reason']}")
    for k in recs["keep_fp32"]:
        lines.append(f"keep in fp32: {k['pattern']} -- {k['reason']}{keep_hint}")
    return lines


def _cell(stats: dict[str, Any] | None, key: str, fmt: str = "frac") -> str:
    if not stats:
        return ""
    if fmt == "num":
        value = stats[key]
        return "" if value is None else _g(value)
    fmt_name, field_name = key.split(".")
    return _pct(stats[fmt_name][field_name])


def markdown_report(report: dict[str, Any], summary: list[str] | None = None) -> str:
    """diagnose.md: the summary (``summary``, else :func:`summary_lines`), the
    recommendations and a table, riskiest modules first."""
    recs = report["recommendations"]
    summary = summary_lines(report) if summary is None else summary
    lines = ["# amptrain diagnose", "", *[f"- {line}" for line in summary], ""]
    ls = recs["loss_scale"]
    if ls["unscaled"] and ls["scaled"]:
        lines += ["## Loss scale", "",
                  (f"Gradient values fp16 cannot hold ({ls['modules_counted']} modules outside "
                  f"fp32 islands, sampled):"), "",
                  "| scale | above fp16 max | below fp16 min normal | flushed to zero |",
                  "|---|---|---|---|"]
        for label, f in (("1", ls["unscaled"]), (f"{recs['init_scale']:g} (recommended)",
                                                 ls["scaled"])):
            lines.append(f"| {label} | {_pct(f['above_max'])} | {_pct(f['below_min_normal'])} "
                         f"| {_pct(f['flushed_to_zero'])} |")
        lines.append("")
    lines += ["## Modules (riskiest first)", "",
              ("Fractions are of sampled values; fp16: max 65504, min normal 6.1e-05, "
              "values below 3.0e-08 flush to zero. Gradients are unscaled (fp32 run); "
              "\"x scale\" multiplies them by the recommended loss scale, and (fp32) marks "
              "modules that run in fp32 once the recommendations are applied."), "",
              ("| module | type | risk | act abs-max | act min≠0 | act >fp16 max "
              "| act <fp16 normal | act flushed | grad abs-max | grad min≠0 "
              "| grad <fp16 normal | grad flushed | grad <normal x scale | weight-grad abs-max "
              "| out of bf16 range | why |"),
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


def write_reports(report: dict[str, Any], out: str | Path,
                  summary: list[str] | None = None) -> tuple[Path, Path]:
    """Write DIR/diagnose.json and DIR/diagnose.md (its summary: see :func:`markdown_report`)."""

    out = outdir.make(Path(out))
    json_path, md_path = out / "diagnose.json", out / "diagnose.md"
    # One writer for every file: a full disk is one line naming the file and the disk.
    outdir.write_text(json_path, json.dumps(report, indent=2, allow_nan=False,
                                            default=_jsonable), replace=True)
    outdir.write_text(md_path, markdown_report(report, summary), replace=True)
    return json_path, md_path


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def strict_json(value: Any) -> Any:
    """inf/NaN floats as the strings 'inf'/'nan' (diagnose.json is strict JSON; an
    overflowing run records them as input maxima too)."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strict_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _part_and_loss(first: dict[str, Any]) -> str:
    """Which part and which loss (`` of part 'discriminator', in the backward of d_loss
    (loss_id 0)``) where a run has several to tell apart (a GAN); nothing for a
    one-model, one-loss run."""
    part, loss, loss_id = first.get("part"), first.get("loss"), first.get("loss_id")
    words = []
    if part not in (None, "model"):
        words.append(f"of part '{part}'")
    if loss_id is not None and (loss_id != 0 or loss not in (None, "loss")):
        words.append(f"in the backward of {loss} (loss_id {loss_id})"
                     if first.get("phase") == "backward"
                     else f"computing {loss} (loss_id {loss_id})")
    return (" " + ", ".join(words)) if words else ""


def _asked_line(name: str, run: dict[str, Any]) -> str:
    """The run of ``--precision`` (a plan, a low-bit format): clean, or where it broke."""
    first = run["first_nonfinite"]
    if run["halted"]:
        return f"{name}: halted after {run['steps']} steps: {run['halted']}"
    if first:
        return (f"{name}: first non-finite in module '{first['module']}' ({first['phase']}) "
                f"at step {first['step']}; {run['skipped_steps']} of {_steps(run)} skipped")
    if run["skipped_steps"]:
        return f"{name}: {run['skipped_steps']} of {_steps(run)} skipped"
    return f"{name}: no non-finite values in {run['steps']} steps"


def _steps(run: dict[str, Any]) -> str:
    """A run's steps as skipped steps count them: ``20 steps``, or ``40 optimizer steps
    (20 steps x 2 parts)`` where each step steps several optimizers (a GAN)."""
    parts = run.get("parts") or 1
    if parts == 1:
        return f"{run['steps']} steps"
    return f"{run['steps'] * parts} optimizer steps ({run['steps']} steps x {parts} parts)"
