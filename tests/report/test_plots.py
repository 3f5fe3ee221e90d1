"""amptrain.report.plots: compare.png and the HTML report's panel rows."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from amptrain.report.plots import (
    PANELS,
    PNG_SIZE,
    _mean_curve,
    compare_figure,
    panel_row,
)
from amptrain.report.load import _COLOURS, Curves, load_study

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _rgb(png: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(png)) as image:
        return np.asarray(image.convert("RGB"), dtype=np.float64)


def test_compare_png_is_a_valid_image_of_the_expected_size(study, pixels_near):
    path = study["out"] / "compare.png"
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.size == PNG_SIZE
        pixels = np.asarray(image.convert("RGB"), dtype=np.float64)
    assert pixels.std() > 20  # not a blank canvas
    assert pixels_near(pixels, _COLOURS["16-mixed"]) > 500  # its bar and curve


@pytest.mark.parametrize("fixture", ["tiny_study", "speed_only_study"])
def test_compare_figure_returns_png_bytes_of_png_size(request, fixture, pixels_near):
    study = load_study(request.getfixturevalue(fixture))
    png = compare_figure(study)
    assert isinstance(png, bytes) and png[:8] == PNG_SIGNATURE
    with Image.open(io.BytesIO(png)) as image:
        assert image.size == PNG_SIZE
    pixels = _rgb(png)
    assert pixels.std() > 20
    for p in study.precisions:  # every precision drew its bars (and curves) in its colour
        assert pixels_near(pixels, study.colour(p)) > 200, p


def test_panel_row_sizes_follow_the_panel_widths(tiny_study):
    study = load_study(tiny_study)
    assert set(PANELS) == {"loss", "loss_scale", "accuracy", "throughput", "memory"}
    for names, widths in ((["throughput", "memory", "accuracy"], None),
                          (["loss", "loss_scale"], [2, 1])):
        png = panel_row(study, names, widths=widths)
        with Image.open(io.BytesIO(png)) as image:
            assert image.size == (1200, 420)  # 4 in per width unit x 4.2 in, at 100 dpi


def test_mean_curve_uses_the_steps_every_seed_logged():
    runs = [Curves(steps=[1, 2, 3], loss=[4.0, 2.0, 1.0]),
            Curves(steps=[2, 3, 4], loss=[4.0, None, 0.5]),  # None: not a logged value
            Curves()]                                        # a run that logged nothing
    assert _mean_curve(runs) == ([2], [3.0], [2.0], [4.0])
    assert _mean_curve([Curves()]) == ([], [], [], [])
