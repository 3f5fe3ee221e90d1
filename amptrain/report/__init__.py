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

from ..common import outdir
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


def write_reports(out: str | Path, *, replace: bool = True) -> dict[str, Path]:
    """Render report.md, report.html and compare.png into the study directory ``out``.
    ``replace``: a study's own earlier reports are replaced (re-rendering a finished
    study); a link or anything but a regular file there is refused. Written through the
    one writer (:mod:`amptrain.common.outdir`): a full disk is one line naming the file."""
    study = load_study(out)
    paths = {"png": study.out / "compare.png", "md": study.out / "report.md",
             "html": study.out / "report.html"}
    outdir.write_bytes(paths["png"], compare_figure(study), replace=replace)
    outdir.write_text(paths["md"], render_markdown(study), replace=replace)
    outdir.write_text(paths["html"], render_html(study), replace=replace)
    return paths
