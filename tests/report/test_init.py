"""amptrain.report: write_reports, the package's re-exports and its import order."""
from __future__ import annotations

import ast
from pathlib import Path

from amptrain import report
from amptrain.report import context, html, load, markdown, plots, tables


def test_write_reports_renders_the_three_files(tiny_study):
    paths = report.write_reports(tiny_study)
    assert paths == {"png": tiny_study / "compare.png", "md": tiny_study / "report.md",
                     "html": tiny_study / "report.html"}
    loaded = load.load_study(tiny_study)
    assert paths["md"].read_text() == markdown.render_markdown(loaded)
    assert paths["html"].read_text() == html.render_html(loaded)
    assert paths["png"].read_bytes() == plots.compare_figure(loaded)


def test_names_used_elsewhere_are_re_exported():
    # compare.py: write_reports, format_table; tests: PNG_SIZE, _COLOURS, fastest.
    for module, names in [
        (load, ["Curves", "Study", "read_curves", "load_study", "human_bytes", "_COLOURS"]),
        (context, ["env_rows"]),
        (tables, ["fastest", "recommendation", "format_table", "markdown_table"]),
        (plots, ["PNG_SIZE", "PANELS", "plot_loss", "plot_loss_scale", "plot_throughput",
                 "plot_memory", "plot_accuracy", "compare_figure", "panel_row"]),
        (markdown, ["render_markdown"]),
        (html, ["render_html"]),
    ]:
        for name in names:
            assert getattr(report, name) is getattr(module, name), name
            assert name in report.__all__
    assert callable(report.write_reports) and "write_reports" in report.__all__


def test_imports_inside_the_package_flow_one_way():
    """load <- context <- tables/plots <- markdown/html <- __init__: no circles."""
    allowed = {"load": set(), "context": {"load"}, "tables": {"load"},
               "plots": {"load", "context"}, "markdown": {"load", "context", "tables"},
               "html": {"load", "context", "tables", "plots"}}
    root = Path(report.__file__).parent
    for name, may_import in allowed.items():
        tree = ast.parse((root / f"{name}.py").read_text())
        imported = {node.module for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.level == 1}
        assert imported <= may_import, (name, imported - may_import)
