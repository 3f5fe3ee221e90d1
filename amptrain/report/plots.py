"""The study's plots: compare.png and the HTML report's panel rows.

Plots use matplotlib's Agg canvas directly (no pyplot, no global backend switch), so
rendering a report neither needs a display nor changes the caller's matplotlib state.
"""
from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from .context import _device_line, _title
from .load import Curves, Study, _num

#: compare.png's size in pixels (width, height).
PNG_SIZE = (1500, 900)
_DPI = 100
_DASHES = [(0, (6, 2)), (0, (2, 1.5)), (0, (8, 2, 2, 2)), (0, (4, 4))]


def _mean_curve(runs: Iterable[Curves]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Steps logged by every seed, with the mean, min and max loss across seeds there."""
    runs = [r for r in runs if r.steps]
    if not runs:
        return [], [], [], []
    per_run = [{s: v for s, v in zip(r.steps, r.loss) if v is not None} for r in runs]
    steps = sorted(set.intersection(*(set(p) for p in per_run)))
    values = [[p[s] for p in per_run] for s in steps]
    return (steps, [sum(v) / len(v) for v in values], [min(v) for v in values],
            [max(v) for v in values])


def _no_data(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666",
            fontsize=11, wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def _style(ax: Any, title: str) -> None:
    ax.set_title(title, loc="left", fontsize=12, fontweight="bold")
    ax.grid(True, alpha=0.3)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def plot_loss(ax: Any, study: Study) -> None:
    """Training loss of every precision (mean over seeds, band = min..max)."""
    _style(ax, "Training loss (mean over seeds, band: min–max)")
    drawn = 0
    for p in study.precisions:
        steps, mean, low, high = _mean_curve(study.curves.get(p, {}).values())
        if not steps:
            continue
        colour = study.colour(p)
        # Precisions often agree to the pixel: the baseline is drawn wide and solid, the
        # others narrower and dashed on top, so every curve stays visible.
        ax.plot(steps, mean, color=colour, label=study.name_of(p), zorder=3 + drawn,
                lw=4.0 if drawn == 0 else 2.0, alpha=0.85 if drawn == 0 else 1.0,
                ls="-" if drawn == 0 else _DASHES[(drawn - 1) % len(_DASHES)])
        if len(study.curves[p]) > 1:
            ax.fill_between(steps, low, high, color=colour, alpha=0.12, lw=0)
        drawn += 1
    if not drawn:
        _no_data(ax, "speed-only study (--bench-steps): no training runs")
        return
    ax.set_yscale("log")
    _plain_log_ticks(ax)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (log scale)")
    ax.legend(frameon=False)


def _plain_log_ticks(ax: Any) -> None:
    """Label a log axis 0.5, 1, 2 instead of 5 x 10^-1."""
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(FuncFormatter(
        lambda value, _: f"{value:g}" if f"{value:.1e}"[0] in "1235" else ""))


def plot_loss_scale(ax: Any, study: Study) -> None:
    """Loss-scale history of the precisions that scale the loss (each seed)."""
    _style(ax, "fp16 loss scale")
    skipped = {(r["precision"], r["seed"]): r.get("skipped_steps")
               for r in study.compare.get("runs", [])}
    drawn = False
    for p in study.precisions:
        for i, (seed, curves) in enumerate(sorted(study.curves.get(p, {}).items())):
            points = [(s, v) for s, v in zip(curves.steps, curves.loss_scale) if v is not None]
            if not points:
                continue
            steps, scales = zip(*points)
            count = skipped.get((p, seed))
            note = "" if count is None else f" ({count} skipped)"
            ax.step(steps, scales, where="post", color=study.colour(p), lw=1.8,
                    ls=["-", "--", ":", "-."][i % 4], label=f"{study.name_of(p)} seed {seed}{note}")
            drawn = True
    if not drawn:
        _no_data(ax, "no loss scaling in these runs\n(only fp16 precisions scale the loss)")
        return
    ax.set_yscale("log", base=2)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("scale (log2)")
    ax.legend(frameon=False, fontsize=9)


def _bars(ax: Any, study: Study, values: list[float | None], labels: list[str],
          errors: list[tuple[float, float]] | None = None) -> None:
    names = study.precisions
    heights = [v or 0.0 for v in values]
    colours = [study.colour(p) for p in names]
    yerr = None
    if errors:
        yerr = [[max(0.0, h - lo) for h, (lo, _) in zip(heights, errors)],
                [max(0.0, hi - h) for h, (_, hi) in zip(heights, errors)]]
    bars = ax.bar([study.name_of(p) for p in names], heights, color=colours, yerr=yerr,
                  capsize=4, ecolor="#333", width=0.6)
    tops = [h + (yerr[1][i] if yerr else 0.0) for i, h in enumerate(heights)]
    top = max(tops) if tops and max(tops) > 0 else 1.0
    for bar, label, bar_top in zip(bars, labels, tops):  # labels clear the whiskers
        ax.text(bar.get_x() + bar.get_width() / 2, bar_top + top * 0.03, label,
                ha="center", va="bottom", fontsize=11, fontweight="bold")
    ax.set_ylim(0, top * 1.2)
    ax.tick_params(axis="x", labelsize=10)


def plot_throughput(ax: Any, study: Study) -> None:
    """samples/s from the median step time; whiskers from the step-time quartiles."""
    _style(ax, "Throughput (samples/s, median step)")
    speed = study.details.get("speed", {})
    values = [r["samples_per_s"] for r in study.summary]
    if not any(values):
        _no_data(ax, "not timed")
        return
    errors = []
    for row in study.summary:
        s = speed.get(row["precision"], {})
        n = s.get("batch_samples")
        p25, p75 = s.get("step_time_p25_ms"), s.get("step_time_p75_ms")
        value = row["samples_per_s"] or 0.0
        errors.append((n / p75 * 1e3, n / p25 * 1e3) if n and p25 and p75 else (value, value))
    labels = [_num(r["speedup"], ".2f", "×") for r in study.summary]
    _bars(ax, study, values, labels, errors)
    ax.set_ylabel("samples/s")


#: The memory ladder's parts, bottom to top, as the stacked bars draw them.
_LADDER = (("weights_bytes", "weights", "#4e79a7"), ("grad_bytes", "grads", "#f28e2b"),
           ("master_bytes", "masters / Kahan", "#e15759"),
           ("optimizer_state_bytes", "optimizer state", "#76b7b2"))


def _ladder_bars(ax: Any, study: Study) -> None:
    """Stacked bars of the exact state bytes (the memory ladder), the measured peak as an
    outline around them, labelled with bytes per parameter and the peak's ratio."""
    _style(ax, "Memory: state by kind, peak outlined (MiB)")
    names = study.precisions
    shown = [study.name_of(p) for p in names]
    bottoms = [0.0] * len(names)
    for key, text, colour in _LADDER:
        heights = [(r.get(key) or 0) / 2 ** 20 for r in study.summary]
        ax.bar(shown, heights, bottom=bottoms, color=colour, width=0.6, label=text)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    peaks = [(r["peak_mem_bytes"] or 0) / 2 ** 20 for r in study.summary]
    ax.bar(shown, peaks, width=0.72, fill=False, lw=1.8,
           edgecolor=[study.colour(p) for p in names], label="measured peak")
    top = max(peaks + bottoms) or 1.0
    for x, row in enumerate(study.summary):
        label = "\n".join(t for t in (_num(row.get("bytes_per_param"), ".1f", " B/param"),
                                       _num(row["mem_ratio"], ".2f", "×")) if t != "n/a")
        ax.text(x, max(peaks[x], bottoms[x]) + top * 0.03, label, ha="center", va="bottom",
                fontsize=9, fontweight="bold")
    ax.set_ylim(0, top * 1.25)
    ax.tick_params(axis="x", labelsize=9, labelrotation=15)
    ax.legend(frameon=False, fontsize=8, loc="upper right", ncol=2)
    ax.set_ylabel("MiB")


def plot_memory(ax: Any, study: Study) -> None:
    """Peak training memory per precision, labelled with the ratio to the baseline; with
    the memory ladder (compare.json's ``*_bytes``) as stacked bars inside the peak."""
    values = [r["peak_mem_bytes"] for r in study.summary]
    if any(r.get("bytes_per_param") for r in study.summary):
        _ladder_bars(ax, study)
        return
    _style(ax, "Peak training memory (MiB)")
    if not any(values):
        _no_data(ax, "not measured")
        return
    _bars(ax, study, [v / 2 ** 20 if v else None for v in values],
          [_num(r["mem_ratio"], ".2f", "×") for r in study.summary])
    ax.set_ylabel("MiB")


def plot_accuracy(ax: Any, study: Study) -> None:
    """The task's primary metric per precision (mean ± std over seeds, dots: seeds) against
    the baseline's tolerance band: accuracy in %, perplexity or RMSE as they are."""
    task = study.task
    metric, key = task.metrics.primary, f"val_{task.metrics.primary.key}"
    scale = 100.0 if metric.percent else 1.0
    tolerance = study.tolerance
    _style(ax, f"Val {metric.label} (band: {task.verdict.format_tolerance(tolerance)})")
    rows = [r for r in study.summary if r.get(f"{key}_mean") is not None]
    if not rows:
        _no_data(ax, f"speed-only study: {metric.label} not measured")
        return
    base = next((r for r in study.summary if r["precision"] == study.baseline), None)
    if base and base.get(f"{key}_mean") is not None:
        centre = base[f"{key}_mean"] * scale
        # pp tolerances are absolute on the % axis; relative ones scale with the baseline.
        half = tolerance if task.verdict.unit == "pp" else abs(centre) * tolerance
        ax.axhspan(centre - half, centre + half, color="#2e7d32", alpha=0.12, lw=0)
        ax.axhline(centre, color="#2e7d32", lw=1, alpha=0.6)
    names = study.precisions
    runs = study.compare.get("runs", [])
    for x, p in enumerate(names):
        row = study.summary[x]
        if row.get(f"{key}_mean") is None:
            continue
        colour = study.colour(p)
        ax.errorbar([x], [row[f"{key}_mean"] * scale], yerr=[(row[f"{key}_std"] or 0) * scale],
                    fmt="o", ms=9, color=colour, capsize=6, lw=2)
        seeds = [r[key] * scale for r in runs if r["precision"] == p and r.get(key) is not None]
        ax.scatter([x + 0.15] * len(seeds), seeds, s=18, color=colour, alpha=0.6, zorder=3)
    ax.set_xticks(range(len(names)), [study.name_of(p) for p in names], fontsize=10)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_ylabel(f"{metric.label} (%)" if metric.percent else metric.label)


PANELS: dict[str, Callable[[Any, Study], None]] = {
    "loss": plot_loss, "loss_scale": plot_loss_scale, "accuracy": plot_accuracy,
    "throughput": plot_throughput, "memory": plot_memory,
}


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buffer)
    return buffer.getvalue()


def compare_figure(study: Study) -> bytes:
    """All plots as one PNG of :data:`PNG_SIZE` pixels."""
    fig = Figure(figsize=(PNG_SIZE[0] / _DPI, PNG_SIZE[1] / _DPI), dpi=_DPI,
                 layout="constrained")
    grid = fig.add_gridspec(2, 3)
    plot_loss(fig.add_subplot(grid[0, :2]), study)
    plot_loss_scale(fig.add_subplot(grid[0, 2]), study)
    plot_throughput(fig.add_subplot(grid[1, 0]), study)
    plot_memory(fig.add_subplot(grid[1, 1]), study)
    plot_accuracy(fig.add_subplot(grid[1, 2]), study)
    fig.suptitle(f"{_title(study)}  ·  {_device_line(study)}", fontsize=14, fontweight="bold",
                 x=0.01, ha="left")
    return _png(fig)


def panel_row(study: Study, names: list[str], widths: list[int] | None = None,
              height: float = 4.2) -> bytes:
    """Some panels side by side (for the HTML sections)."""
    widths = widths or [1] * len(names)
    fig = Figure(figsize=(4.0 * sum(widths), height), dpi=_DPI, layout="constrained")
    grid = fig.add_gridspec(1, sum(widths))
    start = 0
    for name, width in zip(names, widths):
        PANELS[name](fig.add_subplot(grid[0, start:start + width]), study)
        start += width
    return _png(fig)
