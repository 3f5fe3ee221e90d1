"""The summary as text: the terminal table, the Markdown table, and the one-sentence
recommendation that heads both reports."""
from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from ..precision.hardware.advice import base_mode
from ..precision.modes import label
from .load import _num, delta_of, human_bytes, metric_cell, task_of

_VERDICT_MARK = {"ok": "✅ ok", "worse": "❌ worse", "better": "⬆️ better",
                 "failed": "⛔ failed"}


def _delta(row: dict[str, Any], baseline: str) -> str:
    if row["precision"] == baseline:
        return "baseline"
    task = task_of(row)
    delta = delta_of(row, task)
    return "n/a" if delta is None else task.verdict.format_delta(delta)


def is_emulated(precision: str, emulated: Collection[str]) -> bool:
    """True when row ``precision`` (a mode or a ladder rung, ``bf16-true+kahan``) runs in a
    mode of ``emulated`` (modes or row labels this device only emulates)."""
    return precision in emulated or base_mode(precision) in emulated


def fastest(summary: list[dict[str, Any]]) -> str | None:
    """The precision with the highest speedup (None when nothing was timed)."""
    timed = [r for r in summary if r.get("speedup") is not None]
    return max(timed, key=lambda r: r["speedup"])["precision"] if timed else None


def recommendation(summary: list[dict[str, Any]], baseline: str, tolerance_pp: float,
                   emulated: Collection[str] = ()) -> str:
    """One sentence: the fastest precision whose accuracy matches the baseline (and why
    ``emulated`` precisions ran slow, when there are any)."""
    sentence = _recommendation(summary, baseline, tolerance_pp, emulated)
    rung = memory_rung(summary, baseline, emulated)
    sentence = f"{sentence} {rung}" if rung else sentence
    estimate = speed_estimate(summary)
    sentence = f"{sentence} {estimate}" if estimate else sentence
    slow = [r["precision"] for r in summary if is_emulated(r["precision"], emulated)]
    if not slow:
        return sentence
    names = ", ".join(slow)
    return (f"{sentence} {names} {'is' if len(slow) == 1 else 'are'} only emulated on this "
            f"device (no hardware for that format): {'its' if len(slow) == 1 else 'their'} "
            f"speed here says nothing about hardware that has it.")


def speed_estimate(summary: list[dict[str, Any]]) -> str | None:
    """The low-bit rows' estimated matmul speedups on named GPUs (compare.json's
    ``est_matmul_speedup_*``: published dense peak rates, never measured), in one sentence;
    None when no row runs a low-bit layer."""
    parts = []
    for row in summary:
        gpus = [f"{value:.2f}x on {gpu.upper()}" for gpu in ("h100", "b200")
                if (value := row.get(f"est_matmul_speedup_{gpu}")) is not None]
        if row.get("lowbit_flops_share"):
            parts.append(f"{row['precision']} {' and '.join(gpus) or 'no GPU listed'} "
                         f"({100 * row['lowbit_flops_share']:.0f} % of the Linear FLOPs)")
    if not parts:
        return None
    return ("Estimated Linear-matmul speedup over bf16 at published peak rates (an "
            f"estimate, not measured; the rest of the step not counted): {'; '.join(parts)}.")


def memory_rung(summary: list[dict[str, Any]], baseline: str,
                emulated: Collection[str] = ()) -> str | None:
    """For memory-bound runs: the rung with the fewest state bytes per parameter whose
    verdict is ok (or any, in a speed-only study), when it needs less than the baseline;
    a rung in a mode this device only emulates is said to cost time here."""
    base = next((r for r in summary if r["precision"] == baseline), None)
    trained = any(r["verdict"] is not None for r in summary)
    fits = [r for r in summary if r.get("bytes_per_param")
            and (r["verdict"] in ("ok", "better") or not trained)]
    if base is None or not base.get("bytes_per_param") or not fits:
        return None
    best = min(fits, key=lambda r: r["bytes_per_param"])
    if best["bytes_per_param"] >= base["bytes_per_param"]:
        return None
    cost = (f" ({base_mode(best['precision'])} is emulated on this device: here it saves "
            f"memory and costs time; it is fast only where that format has hardware)"
            if is_emulated(best["precision"], emulated) else "")
    return (f"If memory-bound: {best['precision']} keeps {best['bytes_per_param']:.1f} bytes "
            f"of weights, gradients and optimizer state per parameter against "
            f"{base['bytes_per_param']:.1f} for {baseline}"
            f"{f' with matching {task_of(summary).metrics.primary.label}' if trained else ''}"
            f"{cost}.")


def _recommendation(summary: list[dict[str, Any]], baseline: str, tolerance_pp: float,
                    emulated: Collection[str] = ()) -> str:
    task = task_of(summary)
    metric = task.metrics.primary.label
    trained = any(r.get(f"val_{task.metrics.primary.key}_mean") is not None for r in summary)
    note = "" if trained else f" (speed only: {metric} not measured)"
    candidates = [r for r in summary if r["precision"] != baseline and r.get("speedup")
                  and (r["verdict"] in ("ok", "better") or not trained)]
    if not candidates:
        return (f"No precision matched {baseline}'s {metric} within "
                f"{task.verdict.format_tolerance(tolerance_pp)} while being timed: keep "
                f"{baseline}.")
    best = max(candidates, key=lambda r: r["speedup"])
    if best["speedup"] <= 1.0:
        if trained:
            return (f"No precision that matched {baseline}'s {metric} ran faster here: "
                    f"keep {baseline}.")
        return f"Nothing ran faster than {baseline} here: keep {baseline}{note}."
    memory = f", {best['mem_ratio']:.2f}× the memory" if best.get("mem_ratio") else ""
    if is_emulated(best["precision"], emulated):  # never advised for speed without saying so
        memory += (f" (though {base_mode(best['precision'])} is only emulated on this device: "
                   f"re-time it; emulation is not expected to beat {baseline})")
    if not trained:
        return (f"{best['precision']} is the fastest: {best['speedup']:.2f}× {baseline}'s "
                f"throughput{memory}{note}.")
    delta = task.verdict.format_delta(delta_of(best, task))
    accuracy = (f"{metric} within {task.verdict.format_tolerance(tolerance_pp)} ({delta})"
                if best["verdict"] == "ok" else f"{metric} {delta} better")
    return (f"{best['precision']} is {best['speedup']:.2f}× faster than {baseline}{memory}, "
            f"{accuracy}.")


def timing_warning(summary: list[dict[str, Any]]) -> str | None:
    """One line for the table and the reports when some speedup is not to be trusted
    (compare.json's ``timing_reliable`` is false; ``timing_note`` says why)."""
    doubtful = [r for r in summary if r.get("timing_reliable") is False]
    if not doubtful:
        return None
    # A reason of the whole study (A/A gap, load) is in every row's note: say it once.
    reasons: dict[str, None] = {}  # ordered, without repeats
    for row in doubtful:
        for reason in (row.get("timing_note") or "").split("; "):
            if reason:
                shared = all(reason in (r.get("timing_note") or "") for r in doubtful)
                reasons.setdefault(reason if shared or len(doubtful) == 1
                                   else f"{row['precision']}: {reason}", None)
    names = ", ".join(r["precision"] for r in doubtful)
    # The flag that times more steps: --bench-steps in a speed-only study (no row trained,
    # so none has a verdict), --timing-steps in a full compare.
    more = "--timing-steps" if any(r.get("verdict") is not None for r in summary) \
        else "--bench-steps"
    return (f"Timing not reliable ({names}): {'; '.join(reasons)}. Do not trust these "
            f"speedups: re-run on a quiet machine, or time more steps (e.g. {more} 100).")


def _speedup(row: dict[str, Any]) -> str:
    """The speedup, with the interquartile range of its per-round ratios when measured."""
    cell = _num(row["speedup"], ".2f", "×")
    low, high = row.get("speedup_low"), row.get("speedup_high")
    if row["speedup"] is None or low is None or high is None:
        return cell
    return f"{cell} ({low:.2f}–{high:.2f}){'?' if row.get('timing_reliable') is False else ''}"


_COLUMNS = ["precision", "verdict", "val acc (mean ± std)", "Δ acc", "samples/s", "speedup",
            "step time", "peak mem", "mem ratio", "final loss", "skipped"]


def columns(summary: list[dict[str, Any]]) -> list[str]:
    """The table's header, its metric columns named for the summary's task (and, for a
    study judged over seeds, its IQM columns last)."""
    task = task_of(summary)
    name = "acc" if task.metrics.primary.key == "acc" else task.metrics.primary.label
    head = list(_COLUMNS) if task.metrics.primary.key == "acc" else \
        [*_COLUMNS[:2], f"val {name} (mean ± std)", f"Δ {name}", *_COLUMNS[4:]]
    if summary and _iqm_fields(summary[0], task)[0] in summary[0]:
        head += [f"{name} IQM [95 % CI]", f"Δ {name} IQM [95 % CI]"]
    return head


def _iqm_fields(row: dict[str, Any], task: Any) -> tuple[str, str]:
    """The row's IQM field and its difference field (compare/seeds.py names them)."""
    key = task.metrics.primary.key
    return f"val_{key}_iqm", f"delta_{key}_iqm_{task.verdict.unit}"


def _interval(value: float | None, low: float | None, high: float | None, show: Any) -> str:
    if value is None:
        return "n/a"
    bounds = "" if low is None or high is None else f" [{show(low)}, {show(high)}]"
    return f"{show(value)}{bounds}"


def _iqm_cells(row: dict[str, Any], baseline: str) -> list[str]:
    """The IQM with its interval and its difference to the baseline with its interval, for
    a row judged over seeds (none otherwise)."""
    task = task_of(row)
    value, delta = _iqm_fields(row, task)
    if value not in row:
        return []
    own = _interval(row[value], row.get(f"{value}_low"), row.get(f"{value}_high"),
                    task.metrics.primary.format)
    if row["precision"] == baseline:
        return [own, "baseline"]
    return [own, _interval(row.get(delta), row.get(f"{delta}_low"), row.get(f"{delta}_high"),
                           task.verdict.format_delta)]


def _verdict(row: dict[str, Any], shown: str) -> str:
    """The verdict cell; a verdict over fewer seeds than compare/seeds.py asks is weak."""
    return f"{shown} (weak)" if row.get("weak_verdict") and row["verdict"] else shown


def seed_warning(summary: list[dict[str, Any]]) -> str | None:
    """One line when the verdicts over seeds are weak (compare.json's ``seed_note``)."""
    return next((r["seed_note"] for r in summary if r.get("weak_verdict") and r.get("seed_note")),
                None)


def row_name(precision: str, given: Mapping[str, str] | None = None,
             names: Mapping[str, str] | None = None) -> str:
    """Row ``precision``'s displayed name: its name in ``names`` (with the low-bit settings
    it ran with, ``mxfp4 rceil``; else the precision), with the user's spelling beside it
    where ``given`` has an alias, ``16-mixed (mixed_float16)``."""
    return label(precision, given, (names or {}).get(precision))


def _cells(row: dict[str, Any], baseline: str, emulated: Collection[str] = (),
           given: Mapping[str, str] | None = None,
           names: Mapping[str, str] | None = None) -> list[str]:
    name = row_name(row["precision"], given, names)
    name = f"{name} (emulated)" if is_emulated(row["precision"], emulated) else name
    return [name, _verdict(row, row["verdict"] or "n/a"), metric_cell(row), _delta(row, baseline),
            _num(row["samples_per_s"], ",.0f"), _speedup(row),
            _num(row["step_time_ms"], ".2f", " ms"), human_bytes(row["peak_mem_bytes"]),
            _num(row["mem_ratio"], ".2f", "×"), _num(row["final_loss_mean"], ".4f"),
            "n/a" if row["skipped_steps"] is None else str(row["skipped_steps"]),
            *_iqm_cells(row, baseline)]


def format_table(summary: list[dict[str, Any]], baseline: str,
                 emulated: Collection[str] = (), given: Mapping[str, str] | None = None,
                 names: Mapping[str, str] | None = None) -> str:
    """The summary as an aligned plain-text table (for the terminal); precisions the device
    only emulates are marked; rows are named as :func:`row_name` says."""
    header = columns(summary)
    rows = [header] + [_cells(r, baseline, emulated, given, names) for r in summary]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(summary: list[dict[str, Any]], baseline: str,
                   emulated: Collection[str] = (), given: Mapping[str, str] | None = None,
                   names: Mapping[str, str] | None = None) -> str:
    """The summary as a Markdown table: best speedup in bold, verdicts and emulated
    precisions marked; rows are named as :func:`row_name` says."""
    best = fastest(summary)
    header = columns(summary)
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(["---"] + [":---:"] + ["---:"] * (len(header) - 2)) + "|"]
    for row in summary:
        cells = _cells(row, baseline)
        name = row_name(row["precision"], given, names)
        cells[0] = f"`{name}`" + (" (baseline)" if row["precision"] == baseline
                                   else " (emulated)" if is_emulated(row["precision"], emulated)
                                   else "")
        cells[1] = _verdict(row, _VERDICT_MARK.get(row["verdict"], cells[1]))
        if row["precision"] == best and best != baseline:
            cells[5] = f"**{cells[5]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
