"""amptrain.report.html: the self-contained report.html."""
from __future__ import annotations

import base64
import re
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from amptrain.report.html import render_html
from amptrain.report.load import _COLOURS, load_study

PRECISIONS = ["32-true", "16-mixed", "bf16-mixed"]  # the study fixture's


def test_html_report_is_self_contained(study):
    page = (study["out"] / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 2
    assert "http://" not in page and "https://" not in page and "<script" not in page
    for name in ("v-ok", "fastest", "baseline", "Hardware and software", "bf16-mixed"):
        assert name in page


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="Debian's chromium is not installed (apt-get install -y chromium)")
def test_html_report_renders_in_headless_chromium(study, tmp_path, pixels_near):
    shot = tmp_path / "report.png"
    completed = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars",
         "--window-size=1280,1400", f"--screenshot={shot}",
         (study["out"] / "report.html").as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    assert shot.exists(), completed.stderr[-2000:]
    with Image.open(shot) as image:
        assert image.size == (1280, 1400)
        pixels = np.asarray(image.convert("RGB"), dtype=np.float64)
    assert pixels.std() > 20  # not blank
    # The embedded plots were decoded and painted: the precisions' colours are on screen.
    for precision in PRECISIONS:
        assert pixels_near(pixels, _COLOURS[precision]) > 300, precision


def test_render_html_embeds_everything_as_data_uris(tiny_study):
    page = render_html(load_study(tiny_study))
    sources = re.findall(r'\bsrc="([^"]*)"', page)
    assert len(sources) == 2
    for src in sources:
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix)
        assert base64.b64decode(src[len(prefix):], validate=True)[:8] == b"\x89PNG\r\n\x1a\n"
    assert not re.search(r"""\b(src|href)=["']?(https?:)?//""", page)
    for tag in ("<script", "<link", "<iframe", "@import", "url("):
        assert tag not in page
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")


def test_render_html_summary_marks_and_escapes(tiny_study):
    study = load_study(tiny_study)
    page = render_html(study)
    row = next(r for r in re.findall(r"<tr[^>]*>.*?</tr>", page) if ">16-mixed<" in r)
    assert f'style="background:{study.colour("16-mixed")}"' in row
    assert '<span class="tag fast">fastest</span>' in row
    assert '<span class="verdict v-ok">ok</span>' in row
    assert '<span class="pos">+0.20 pp</span>' in row
    assert '<td class="best">1.50×</td>' in row
    base = next(r for r in re.findall(r"<tr[^>]*>.*?</tr>", page) if ">32-true<" in r)
    assert base.startswith('<tr class="baseline">') and '<span class="tag">baseline</span>' in base
    # The command is shown, HTML-escaped.
    assert "--out &#x27;a&amp;b&#x27;</pre>" in page and "'a&b'" not in page
    assert "<h2>Runs</h2>" in page and '<td class="path">runs/16-mixed/seed-1</td>' in page


def test_render_html_of_a_speed_only_study_has_no_runs_table(speed_only_study):
    page = render_html(load_study(speed_only_study))
    assert "<h2>Runs</h2>" not in page
    assert "speed only: accuracy not measured" in page
    assert page.count('src="data:image/png;base64,') == 2


def _widest_study(tiny_study):
    """The tiny study with the widest summary cells a real study prints: the user's
    aliases, "(emulated)", ladder-rung names and speedups with their spread."""
    import json

    compare = json.loads((tiny_study / "compare.json").read_text())
    for row in compare["summary"]:
        row.update(speedup_low=0.05, speedup_high=1.07, timing_reliable=False,
                   samples_per_s=123456.0, peak_mem_bytes=123 * 2 ** 30)
    (tiny_study / "compare.json").write_text(json.dumps(compare))
    details = json.loads((tiny_study / "study.json").read_text())
    details["options"]["precisions"] = "float32,mixed_float16"
    details["env"]["emulated"] = {"16-mixed": True}
    (tiny_study / "study.json").write_text(json.dumps(details))
    return load_study(tiny_study)


def test_the_summary_table_wraps_instead_of_running_past_the_right_edge(tiny_study):
    page = render_html(_widest_study(tiny_study))
    assert '<table class="summary">' in page
    # headers and names wrap; the speedup's spread goes under it, not beside it
    assert "table.summary th { white-space:normal;" in page
    assert "table.summary td.name { white-space:normal;" in page
    assert "16-mixed (mixed_float16) (emulated)" in page
    assert '<span class="iqr">(0.05–1.07)?</span>' in page


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="Debian's chromium is not installed (apt-get install -y chromium)")
@pytest.mark.parametrize("width", [1280, 1400])
def test_the_summary_table_fits_the_window_in_headless_chromium(tiny_study, tmp_path, width):
    # The page measures itself: the summary card's content width against its box.
    page = render_html(_widest_study(tiny_study)).replace("</body>", (
        "<script>const c = document.querySelectorAll('.card')[0];"
        "document.title = 'fit ' + c.scrollWidth + ' ' + c.clientWidth;</script></body>"))
    path = tmp_path / "report.html"
    path.write_text(page)
    completed = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         f"--window-size={width},900", "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    found = re.search(r"<title>fit (\d+) (\d+)</title>", completed.stdout)
    assert found, completed.stderr[-2000:]
    scroll, client = map(int, found.groups())
    assert scroll <= client, f"the summary is {scroll - client} px wider than its card"
