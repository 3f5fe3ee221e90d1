"""Reports of a compare study: ``report.md``, a self-contained ``report.html`` and ``compare.png``.

Everything is rendered from what the study left on disk (``compare.json``, ``study.json``
and each run's ``metrics.jsonl``), so a report can be re-rendered without re-running:
``amptrain.report.write_reports(DIR)``. Plots use matplotlib's Agg canvas directly (no
pyplot, no global backend switch); the HTML embeds them as base64 PNGs.

Modules, each importing only those above it: :mod:`.load` (a finished study read back, number
formatting), :mod:`.context` (title, device, method and environment lines), :mod:`.tables`
and :mod:`.plots`, then the renderers :mod:`.markdown` and :mod:`.html`.
"""
from __future__ import annotations

from pathlib import Path

from .context import env_rows
from .html import render_html
from .markdown import render_markdown
from .plots import (
    PANELS,
    PNG_SIZE,
    compare_figure,
    panel_row,
    plot_accuracy,
    plot_loss,
    plot_loss_scale,
    plot_memory,
    plot_throughput,
)
from .load import _COLOURS, Curves, Study, human_bytes, load_study, read_curves
from .tables import fastest, format_table, markdown_table, recommendation, timing_warning

# _COLOURS is private but re-exported: tests read ``amptrain.report._COLOURS`` to find each
# precision's pixels in the rendered plots.
__all__ = ["PANELS", "PNG_SIZE", "_COLOURS", "Curves", "Study", "compare_figure", "env_rows",
           "fastest", "format_table", "human_bytes", "load_study", "markdown_table",
           "panel_row", "plot_accuracy", "plot_loss", "plot_loss_scale", "plot_memory",
           "plot_throughput", "read_curves", "recommendation", "render_html",
           "render_markdown", "timing_warning", "write_reports"]


def write_reports(out: str | Path) -> dict[str, Path]:
    """Render report.md, report.html and compare.png into the study directory ``out``."""
    study = load_study(out)
    paths = {"png": study.out / "compare.png", "md": study.out / "report.md",
             "html": study.out / "report.html"}
    paths["png"].write_bytes(compare_figure(study))
    paths["md"].write_text(render_markdown(study))
    paths["html"].write_text(render_html(study))
    return paths
