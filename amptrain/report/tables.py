"""The summary as text: the terminal table, the Markdown table, and the one-sentence
recommendation that heads both reports."""
from __future__ import annotations

from collections.abc import Collection
from typing import Any

from .study import _num, human_bytes

_VERDICT_MARK = {"ok": "✅ ok", "worse": "❌ worse", "better": "⬆️ better",
                 "failed": "⛔ failed"}


def _acc(row: dict[str, Any]) -> str:
    if row["val_acc_mean"] is None:
        return "n/a"
    return f"{row['val_acc_mean'] * 100:.2f} ± {(row['val_acc_std'] or 0) * 100:.2f} %"


def _delta(row: dict[str, Any], baseline: str) -> str:
    if row["precision"] == baseline:
        return "baseline"
    return _num(row["delta_acc_pp"], "+.2f", " pp")


def fastest(summary: list[dict[str, Any]]) -> str | None:
    """The precision with the highest speedup (None when nothing was timed)."""
    timed = [r for r in summary if r.get("speedup") is not None]
    return max(timed, key=lambda r: r["speedup"])["precision"] if timed else None


def recommendation(summary: list[dict[str, Any]], baseline: str, tolerance_pp: float,
                   emulated: Collection[str] = ()) -> str:
    """One sentence: the fastest precision whose accuracy matches the baseline (and why
    ``emulated`` precisions ran slow, when there are any)."""
    sentence = _recommendation(summary, baseline, tolerance_pp)
    slow = [r["precision"] for r in summary if r["precision"] in emulated]
    if not slow:
        return sentence
    names = ", ".join(slow)
    return (f"{sentence} {names} {'is' if len(slow) == 1 else 'are'} only emulated on this "
            f"device (no hardware for that format): {'its' if len(slow) == 1 else 'their'} "
            f"speed here says nothing about hardware that has it.")


def _recommendation(summary: list[dict[str, Any]], baseline: str, tolerance_pp: float) -> str:
    trained = any(r["val_acc_mean"] is not None for r in summary)
    note = "" if trained else " (speed only: accuracy not measured)"
    candidates = [r for r in summary if r["precision"] != baseline and r.get("speedup")
                  and (r["verdict"] in ("ok", "better") or not trained)]
    if not candidates:
        return (f"No precision matched {baseline}'s accuracy within ±{tolerance_pp:g} pp "
                f"while being timed: keep {baseline}.")
    best = max(candidates, key=lambda r: r["speedup"])
    if best["speedup"] <= 1.0:
        if trained:
            return (f"No precision that matched {baseline}'s accuracy ran faster here: "
                    f"keep {baseline}.")
        return f"Nothing ran faster than {baseline} here: keep {baseline}{note}."
    memory = f", {best['mem_ratio']:.2f}× the memory" if best.get("mem_ratio") else ""
    if not trained:
        return (f"{best['precision']} is the fastest: {best['speedup']:.2f}× {baseline}'s "
                f"throughput{memory}{note}.")
    accuracy = (f"accuracy within ±{tolerance_pp:g} pp ({best['delta_acc_pp']:+.2f} pp)"
                if best["verdict"] == "ok" else f"accuracy {best['delta_acc_pp']:+.2f} pp better")
    return (f"{best['precision']} is {best['speedup']:.2f}× faster than {baseline}{memory}, "
            f"{accuracy}.")


_COLUMNS = ["precision", "verdict", "val acc (mean ± std)", "Δ acc", "samples/s", "speedup",
            "step time", "peak mem", "mem ratio", "final loss", "skipped"]


def _cells(row: dict[str, Any], baseline: str, emulated: Collection[str] = ()) -> list[str]:
    name = f"{row['precision']} (emulated)" if row["precision"] in emulated else row["precision"]
    return [name, row["verdict"] or "n/a", _acc(row), _delta(row, baseline),
            _num(row["samples_per_s"], ",.0f"), _num(row["speedup"], ".2f", "×"),
            _num(row["step_time_ms"], ".2f", " ms"), human_bytes(row["peak_mem_bytes"]),
            _num(row["mem_ratio"], ".2f", "×"), _num(row["final_loss_mean"], ".4f"),
            "n/a" if row["skipped_steps"] is None else str(row["skipped_steps"])]


def format_table(summary: list[dict[str, Any]], baseline: str,
                 emulated: Collection[str] = ()) -> str:
    """The summary as an aligned plain-text table (for the terminal); precisions the device
    only emulates are marked."""
    rows = [_COLUMNS] + [_cells(r, baseline, emulated) for r in summary]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(summary: list[dict[str, Any]], baseline: str,
                   emulated: Collection[str] = ()) -> str:
    """The summary as a Markdown table: best speedup in bold, verdicts and emulated
    precisions marked."""
    best = fastest(summary)
    lines = ["| " + " | ".join(_COLUMNS) + " |",
             "|" + "|".join(["---"] + [":---:"] + ["---:"] * (len(_COLUMNS) - 2)) + "|"]
    for row in summary:
        cells = _cells(row, baseline)
        cells[0] = f"`{row['precision']}`" + (" (baseline)" if row["precision"] == baseline
                                              else " (emulated)" if row["precision"] in emulated
                                              else "")
        cells[1] = _VERDICT_MARK.get(row["verdict"], cells[1])
        if row["precision"] == best and best != baseline:
            cells[5] = f"**{cells[5]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
