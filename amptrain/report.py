"""Reports of a compare study: ``report.md``, a self-contained ``report.html`` and ``compare.png``.

Everything is rendered from what the study left on disk (``compare.json``, ``study.json``
and each run's ``metrics.jsonl``), so a report can be re-rendered without re-running:
``amptrain.report.write_reports(DIR)``. Plots use matplotlib's Agg canvas directly (no
pyplot, no global backend switch); the HTML embeds them as base64 PNGs.
"""
from __future__ import annotations

import base64
import html
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

#: compare.png's size in pixels (width, height).
PNG_SIZE = (1500, 900)
_DPI = 100

#: Stable colours for the usual precisions; others take the next free one.
_COLOURS = {"32-true": "#4c566a", "tf32": "#8f6fb3", "16-mixed": "#e07b39",
            "bf16-mixed": "#2f7fc1", "16-master": "#c9a227", "bf16-master": "#3aa39a",
            "16-true": "#c44e52", "bf16-true": "#55a868", "fp8": "#a05195"}
_DASHES = [(0, (6, 2)), (0, (2, 1.5)), (0, (8, 2, 2, 2)), (0, (4, 4))]
_SPARE = ["#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd"]
_VERDICT_MARK = {"ok": "✅ ok", "worse": "❌ worse", "better": "⬆️ better",
                 "failed": "⛔ failed"}


@dataclass
class Curves:
    """One run's logged series."""

    steps: list[int] = field(default_factory=list)
    loss: list[float | None] = field(default_factory=list)
    loss_scale: list[float | None] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val_acc: list[float] = field(default_factory=list)


@dataclass
class Study:
    """A finished compare study as read back from its directory."""

    out: Path
    compare: dict[str, Any]
    details: dict[str, Any]
    curves: dict[str, dict[int, Curves]]   # precision -> seed -> series

    @property
    def baseline(self) -> str:
        return self.compare["baseline"]

    @property
    def summary(self) -> list[dict[str, Any]]:
        return self.compare["summary"]

    @property
    def precisions(self) -> list[str]:
        return [row["precision"] for row in self.summary]

    def colour(self, precision: str) -> str:
        if precision in _COLOURS:
            return _COLOURS[precision]
        others = [p for p in self.precisions if p not in _COLOURS]
        return _SPARE[others.index(precision) % len(_SPARE)] if precision in others else "#333"


# ------------------------------------------------------------------ loading
def read_curves(metrics_file: Path) -> Curves:
    """Train and eval series of one run's metrics.jsonl (missing file: empty series)."""
    curves = Curves()
    if not metrics_file.exists():
        return curves
    for line in metrics_file.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if "loss" in record:
            curves.steps.append(record["step"])
            curves.loss.append(record["loss"])
            curves.loss_scale.append(record.get("loss_scale"))
        if record.get("val_acc") is not None:
            curves.val_steps.append(record["step"])
            curves.val_acc.append(record["val_acc"])
    return curves


def load_study(out: str | Path) -> Study:
    """Read compare.json, study.json and every run's metrics from a study directory."""
    out = Path(out)
    compare = json.loads((out / "compare.json").read_text())
    details_file = out / "study.json"
    details = json.loads(details_file.read_text()) if details_file.exists() else {}
    curves: dict[str, dict[int, Curves]] = {}
    for run in compare.get("runs", []):
        run_dir = out / run.get("dir", f"runs/{run['precision']}/seed-{run['seed']}")
        curves.setdefault(run["precision"], {})[run["seed"]] = read_curves(run_dir / "metrics.jsonl")
    return Study(out, compare, details, curves)


# --------------------------------------------------------------- formatting
def human_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB'; None -> 'n/a'."""
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _num(value: float | None, fmt: str, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{fmt}}{suffix}"


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


def recommendation(summary: list[dict[str, Any]], baseline: str, tolerance_pp: float) -> str:
    """One sentence: the fastest precision whose accuracy matches the baseline."""
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


def _cells(row: dict[str, Any], baseline: str) -> list[str]:
    return [row["precision"], row["verdict"] or "n/a", _acc(row), _delta(row, baseline),
            _num(row["samples_per_s"], ",.0f"), _num(row["speedup"], ".2f", "×"),
            _num(row["step_time_ms"], ".2f", " ms"), human_bytes(row["peak_mem_bytes"]),
            _num(row["mem_ratio"], ".2f", "×"), _num(row["final_loss_mean"], ".4f"),
            "n/a" if row["skipped_steps"] is None else str(row["skipped_steps"])]


def format_table(summary: list[dict[str, Any]], baseline: str) -> str:
    """The summary as an aligned plain-text table (for the terminal)."""
    rows = [_COLUMNS] + [_cells(r, baseline) for r in summary]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(summary: list[dict[str, Any]], baseline: str) -> str:
    """The summary as a Markdown table: best speedup in bold, verdicts marked."""
    best = fastest(summary)
    lines = ["| " + " | ".join(_COLUMNS) + " |",
             "|" + "|".join(["---"] + [":---:"] + ["---:"] * (len(_COLUMNS) - 2)) + "|"]
    for row in summary:
        cells = _cells(row, baseline)
        cells[0] = f"`{row['precision']}`" + (" (baseline)" if row["precision"] == baseline else "")
        cells[1] = _VERDICT_MARK.get(row["verdict"], cells[1])
        if row["precision"] == best and best != baseline:
            cells[5] = f"**{cells[5]}**"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------- plots
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
        ax.plot(steps, mean, color=colour, label=p, zorder=3 + drawn,
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
                    ls=["-", "--", ":", "-."][i % 4], label=f"{p} seed {seed}{note}")
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
    bars = ax.bar(names, heights, color=colours, yerr=yerr, capsize=4, ecolor="#333", width=0.6)
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


def plot_memory(ax: Any, study: Study) -> None:
    """Peak training memory per precision, labelled with the ratio to the baseline."""
    _style(ax, "Peak training memory (MiB)")
    values = [r["peak_mem_bytes"] for r in study.summary]
    if not any(values):
        _no_data(ax, "not measured")
        return
    _bars(ax, study, [v / 2 ** 20 if v else None for v in values],
          [_num(r["mem_ratio"], ".2f", "×") for r in study.summary])
    ax.set_ylabel("MiB")


def plot_accuracy(ax: Any, study: Study) -> None:
    """Validation accuracy per precision (mean ± std over seeds, dots: seeds) against the
    baseline's tolerance band."""
    tolerance = study.details.get("options", {}).get("tolerance_pp", 0.5)
    _style(ax, f"Val accuracy (band: ±{tolerance:g} pp)")
    rows = [r for r in study.summary if r["val_acc_mean"] is not None]
    if not rows:
        _no_data(ax, "speed-only study: accuracy not measured")
        return
    base = next((r for r in study.summary if r["precision"] == study.baseline), None)
    if base and base["val_acc_mean"] is not None:
        centre = base["val_acc_mean"] * 100
        ax.axhspan(centre - tolerance, centre + tolerance, color="#2e7d32", alpha=0.12, lw=0)
        ax.axhline(centre, color="#2e7d32", lw=1, alpha=0.6)
    names = study.precisions
    runs = study.compare.get("runs", [])
    for x, p in enumerate(names):
        row = study.summary[x]
        if row["val_acc_mean"] is None:
            continue
        colour = study.colour(p)
        ax.errorbar([x], [row["val_acc_mean"] * 100], yerr=[(row["val_acc_std"] or 0) * 100],
                    fmt="o", ms=9, color=colour, capsize=6, lw=2)
        seeds = [r["val_acc"] * 100 for r in runs if r["precision"] == p and r.get("val_acc") is not None]
        ax.scatter([x + 0.15] * len(seeds), seeds, s=18, color=colour, alpha=0.6, zorder=3)
    ax.set_xticks(range(len(names)), names, fontsize=10)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_ylabel("accuracy (%)")


PANELS: dict[str, Callable[[Any, Study], None]] = {
    "loss": plot_loss, "loss_scale": plot_loss_scale, "accuracy": plot_accuracy,
    "throughput": plot_throughput, "memory": plot_memory,
}


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buffer)
    return buffer.getvalue()


def _title(study: Study) -> str:
    cfg = study.details.get("config", {})
    model, data = cfg.get("model", "?"), cfg.get("data", "?")
    return f"amptrain compare — {model} on {data}"


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


# ------------------------------------------------------------- environment
def _device_line(study: Study) -> str:
    env = study.details.get("env", {})
    device = study.details.get("device", "?")
    if str(device).startswith("cuda") and env.get("gpus"):
        return f"{env['gpus'][0].get('name', 'GPU')} ({device})"
    cores = f", {env['cpu_cores']} cores" if env.get("cpu_cores") else ""
    return f"{env.get('cpu', 'CPU')}{cores} ({device})"


def _env_value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)) and key.endswith("bytes"):
        return human_bytes(value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_env_value(k, v)}" for k, v in value.items()) or "—"
    if isinstance(value, (list, tuple)):
        return "; ".join(_env_value(key, v) for v in value) or "none"
    return "—" if value is None else str(value)


def env_rows(study: Study) -> list[tuple[str, str]]:
    """(name, value) rows of the hardware and software the study ran on."""
    rows = [("device used", str(study.details.get("device", "?")))]
    rows += [(k, _env_value(k, v)) for k, v in study.details.get("env", {}).items()]
    return rows


def _method_lines(study: Study) -> list[str]:
    d = study.details
    o = d.get("options", {})
    timed = o.get("bench_steps") or o.get("timing_steps")
    order = "interleaved (round-robin, rotating order)" if o.get("interleave", True) else \
        "one precision after another"
    lines = [
        f"Speed: {o.get('timing_warmup')} warm-up + {timed} timed optimizer steps per precision, "
        f"{order}, device synchronised around every step; median step time, "
        f"samples/s = global batch / median step time; whiskers: step-time quartiles.",
        f"Memory: {d.get('memory_method', 'n/a')}",
        f"Accuracy: final validation accuracy of each run; mean and sample standard deviation "
        f"over seeds {', '.join(map(str, d.get('seeds', [])))}; verdict ok when "
        f"|Δ acc| ≤ {o.get('tolerance_pp', 0.5):g} pp.",
        "Every run of a seed starts from identical initial weights and sees the same data "
        "order (checked per run: see compare.json runs[].same_initial_weights, "
        "data_order_sha256, first_step_loss_fp32).",
    ]
    if d.get("duration_s") is not None:
        lines.append(f"Whole study: {d['duration_s']:.0f} s, started {d.get('started', '?')}.")
    return lines


def _config_line(study: Study) -> str:
    cfg = study.details.get("config", {})
    keys = ("model", "data", "epochs", "max_steps", "batch_size", "optimizer", "lr", "scheduler",
            "device")
    return ", ".join(f"{k} {cfg[k]}" for k in keys if cfg.get(k) is not None)


# ------------------------------------------------------------------ markdown
def render_markdown(study: Study) -> str:
    """report.md: headline, table, plot, runs, method and hardware."""
    tolerance = study.details.get("options", {}).get("tolerance_pp", 0.5)
    parts = [f"# {_title(study)}", "",
             f"**{recommendation(study.summary, study.baseline, tolerance)}**", "",
             f"Speedup, memory ratio and Δ accuracy are relative to `{study.baseline}` measured "
             f"in the same invocation. {_config_line(study)}.", "",
             markdown_table(study.summary, study.baseline), "",
             "![loss curves, loss scale, throughput, memory and accuracy](compare.png)", ""]
    runs = study.compare.get("runs", [])
    if runs:
        parts += ["## Runs", "", "| precision | seed | val acc | val loss | final loss | skipped "
                  "| steps | wall time | same init | directory |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|:---:|---|"]
        for r in runs:
            same = {True: "yes", False: "**no**"}.get(r.get("same_initial_weights"), "n/a")
            acc = "halted" if r.get("halted") else _num(
                None if r.get("val_acc") is None else r["val_acc"] * 100, ".2f", " %")
            parts.append(f"| `{r['precision']}` | {r['seed']} | {acc} | "
                         f"{_num(r.get('val_loss'), '.4f')} | {_num(r.get('final_loss'), '.4f')} | "
                         f"{r.get('skipped_steps', 'n/a')} | {r.get('steps', 'n/a')} | "
                         f"{_num(r.get('wall_s'), '.1f', ' s')} | {same} | `{r['dir']}` |")
        parts.append("")
    parts += ["## How it was measured", ""] + [f"- {line}" for line in _method_lines(study)]
    if study.details.get("command"):
        parts += ["", "```bash", study.details["command"], "```"]
    parts += ["", "## Hardware and software", "", "| | |", "|---|---|"]
    parts += [f"| {k} | {v} |" for k, v in env_rows(study)]
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------------- html
_CSS = """
:root { --fg:#1f2430; --muted:#667085; --line:#e4e7ec; --bg:#f6f7f9; --ok:#1e7b34;
        --okbg:#e3f4e7; --bad:#b42318; --badbg:#fde8e7; --good:#175cd3; --goodbg:#e5efff; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--fg);
       font:15px/1.5 -apple-system, "Segoe UI", Roboto, "DejaVu Sans", Arial, sans-serif; }
main { max-width:1240px; margin:0 auto; padding:28px 24px 48px; }
h1 { font-size:26px; margin:0 0 4px; }
h2 { font-size:18px; margin:32px 0 12px; }
.sub { color:var(--muted); margin:0 0 20px; }
.headline { background:#fff; border:1px solid var(--line); border-left:6px solid var(--good);
            border-radius:10px; padding:14px 18px; font-size:17px; font-weight:600; }
.card { background:#fff; border:1px solid var(--line); border-radius:10px; padding:16px;
        overflow-x:auto; }
table { border-collapse:collapse; width:100%; font-variant-numeric:tabular-nums; }
th, td { padding:8px 9px; border-bottom:1px solid var(--line); text-align:right;
         white-space:nowrap; }
th { font-size:11px; text-transform:uppercase; letter-spacing:.03em; color:var(--muted);
     font-weight:600; }
th:first-child, td:first-child { text-align:left; }
tr.baseline td { background:#fafbfc; }
td.name { font-weight:700; }
.swatch { display:inline-block; width:10px; height:10px; border-radius:2px; margin-right:8px; }
.tag { display:inline-block; font-size:11px; font-weight:700; padding:1px 7px; border-radius:99px;
       margin-left:6px; background:#eef0f3; color:var(--muted); vertical-align:1px; }
.tag.fast { background:#fff4d6; color:#8a5a00; }
.verdict { display:inline-block; min-width:64px; text-align:center; font-weight:700;
           padding:2px 10px; border-radius:99px; }
.v-ok { background:var(--okbg); color:var(--ok); }
.v-worse, .v-failed { background:var(--badbg); color:var(--bad); }
.v-better { background:var(--goodbg); color:var(--good); }
.v-na { background:#eef0f3; color:var(--muted); }
td.best { background:#fff4d6; font-weight:800; }
.neg { color:var(--bad); } .pos { color:var(--good); }
img { display:block; width:100%; height:auto; }
ul.method { margin:0; padding-left:20px; } ul.method li { margin:4px 0; }
pre { background:#0f1720; color:#e6edf3; padding:12px 14px; border-radius:8px; overflow-x:auto; }
td.path, th.path { text-align:left; }
table.env td { text-align:left; white-space:normal; } table.env td:first-child { color:var(--muted);
  width:210px; }
footer { color:var(--muted); font-size:13px; margin-top:28px; }
"""


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _html_table(study: Study) -> str:
    best = fastest(study.summary)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in _COLUMNS)
    body = []
    for row in study.summary:
        cells = [html.escape(c) for c in _cells(row, study.baseline)]
        p = row["precision"]
        tags = ""
        if p == study.baseline:
            tags += '<span class="tag">baseline</span>'
        if p == best:
            tags += '<span class="tag fast">fastest</span>'
        cells[0] = (f'<span class="swatch" style="background:{study.colour(p)}"></span>'
                    f"{cells[0]}{tags}")
        v = row["verdict"] or "na"
        cells[1] = f'<span class="verdict v-{html.escape(v)}">{cells[1]}</span>'
        delta = row["delta_acc_pp"]
        if p != study.baseline and delta is not None and delta != 0:
            cells[3] = f'<span class="{"neg" if delta < 0 else "pos"}">{cells[3]}</span>'
        classes = [["name"]] + [[] for _ in cells[1:]]
        if p == best:
            classes[5].append("best")
        tds = "".join(f'<td class="{" ".join(c)}">{cell}</td>' if c else f"<td>{cell}</td>"
                      for cell, c in zip(cells, classes))
        body.append(f'<tr class="{"baseline" if p == study.baseline else ""}">{tds}</tr>')
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _html_runs(study: Study) -> str:
    runs = study.compare.get("runs", [])
    if not runs:
        return ""
    head = "".join(f"<th>{c}</th>" for c in ("precision", "seed", "val acc", "val loss",
                                             "final loss", "skipped", "steps", "wall time",
                                             "same init")) + '<th class="path">directory</th>'
    rows = []
    for r in runs:
        acc = "halted" if r.get("halted") else _num(
            None if r.get("val_acc") is None else r["val_acc"] * 100, ".2f", " %")
        same = {True: "yes", False: "NO"}.get(r.get("same_initial_weights"), "n/a")
        cells = [r["precision"], str(r["seed"]), acc, _num(r.get("val_loss"), ".4f"),
                 _num(r.get("final_loss"), ".4f"), str(r.get("skipped_steps", "n/a")),
                 str(r.get("steps", "n/a")), _num(r.get("wall_s"), ".1f", " s"), same, r["dir"]]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells[:-1])
                    + f'<td class="path">{html.escape(cells[-1])}</td></tr>')
    return (f'<h2>Runs</h2><div class="card"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def render_html(study: Study) -> str:
    """report.html: one self-contained page (styles inline, plots as base64 PNGs)."""
    tolerance = study.details.get("options", {}).get("tolerance_pp", 0.5)
    esc = html.escape
    speed_png = panel_row(study, ["throughput", "memory", "accuracy"])
    curves_png = panel_row(study, ["loss", "loss_scale"], widths=[2, 1])
    env = "".join(f"<tr><td>{esc(k)}</td><td>{esc(v)}</td></tr>" for k, v in env_rows(study))
    method = "".join(f"<li>{esc(line)}</li>" for line in _method_lines(study))
    command = f"<pre>{esc(study.details['command'])}</pre>" if study.details.get("command") else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(_title(study))}</title><style>{_CSS}</style></head>
<body><main>
<h1>{esc(_title(study))}</h1>
<p class="sub">{esc(_device_line(study))} · {esc(_config_line(study))} ·
relative to <b>{esc(study.baseline)}</b> measured in the same invocation</p>
<div class="headline">{esc(recommendation(study.summary, study.baseline, tolerance))}</div>
<h2>Summary</h2>
<div class="card">{_html_table(study)}</div>
<h2>Speed, memory and accuracy</h2>
<div class="card">{_img(speed_png, "throughput, peak memory and accuracy per precision")}</div>
<h2>Training curves</h2>
<div class="card">{_img(curves_png, "training loss and fp16 loss scale over steps")}</div>
{_html_runs(study)}
<h2>How it was measured</h2>
<div class="card"><ul class="method">{method}</ul>{command}</div>
<h2>Hardware and software</h2>
<div class="card"><table class="env">{env}</table></div>
<footer>Generated by amptrain compare · {esc(study.details.get("started", ""))}</footer>
</main></body></html>
"""


def write_reports(out: str | Path) -> dict[str, Path]:
    """Render report.md, report.html and compare.png into the study directory ``out``."""
    study = load_study(out)
    paths = {"png": study.out / "compare.png", "md": study.out / "report.md",
             "html": study.out / "report.html"}
    paths["png"].write_bytes(compare_figure(study))
    paths["md"].write_text(render_markdown(study))
    paths["html"].write_text(render_html(study))
    return paths
