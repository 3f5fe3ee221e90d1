"""imagegrid.py: float images to uint8, tiled into a grid, written as PNG (Pillow only)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from amptrain.tasks.imagegrid import grid, save_grid, save_png, to_uint8, upscale_for


def test_values_map_linearly_from_the_range_and_are_clipped():
    x = torch.tensor([-1.0, 0.0, 1.0, 3.0]).view(1, 1, 2, 2)
    assert to_uint8(x, -1.0, 1.0)[0, :, :, 0].tolist() == [[0, 128], [255, 255]]
    # Without bounds: the batch's own minimum and maximum.
    assert to_uint8(x)[0, :, :, 0].tolist() == [[0, 64], [128, 255]]
    # Per channel: RGB with a different range each.
    rgb = torch.zeros(1, 3, 1, 1)
    assert to_uint8(rgb, [-1.0, 0.0, -2.0], [1.0, 1.0, 0.0])[0, 0, 0].tolist() == [128, 0, 255]
    assert to_uint8(torch.full((1, 1, 1, 1), float("nan")), 0.0, 1.0).item() == 0
    with pytest.raises(ValueError):
        to_uint8(torch.zeros(1, 2, 4, 4))


def test_grid_places_each_image_in_row_major_order_with_padding():
    images = np.stack([np.full((3, 2, 1), 10 * (i + 1), dtype=np.uint8) for i in range(5)])
    out = grid(images, columns=3, padding=1, background=7)
    assert out.shape == (2 * (3 + 1) + 1, 3 * (2 + 1) + 1, 1)
    assert out[0, 0, 0] == 7 and out[1, 1, 0] == 10           # first image after the padding
    assert out[1, 1 + 2 * 3, 0] == 30                           # third image, first row
    assert out[1 + 4, 1 + 3, 0] == 50                           # fifth: second row, second column
    assert out[1 + 4, 1 + 6, 0] == 7                            # the empty sixth cell
    assert grid(images).shape[1] == 3 * (2 + 2) + 2             # ceil(sqrt(5)) = 3 columns
    with pytest.raises(ValueError):
        grid(images.astype(np.float32))


def test_png_round_trip_grey_and_rgb_with_scaling(tmp_path):
    grey = np.arange(12, dtype=np.uint8).reshape(3, 4, 1) * 20
    path = save_png(grey, tmp_path / "sub" / "g.png", scale=2)
    with Image.open(path) as img:
        assert img.mode == "L" and img.size == (8, 6)
        back = np.asarray(img)
    assert (back[::2, ::2] == grey[:, :, 0]).all() and (back[1::2, 1::2] == grey[:, :, 0]).all()
    rgb = np.random.default_rng(0).integers(0, 256, (5, 4, 3), dtype=np.uint8)
    with Image.open(save_png(rgb, tmp_path / "c.png")) as img:
        assert img.mode == "RGB" and (np.asarray(img) == rgb).all()


def test_save_grid_enlarges_small_images(tmp_path):
    assert upscale_for(8) == 8 and upscale_for(32) == 2 and upscale_for(100) == 1
    images = torch.linspace(-1, 1, 4 * 64).view(4, 1, 8, 8)
    with Image.open(save_grid(images, tmp_path / "grid.png", low=-1.0, high=1.0)) as img:
        assert img.size == ((2 * (8 + 2) + 2) * 8,) * 2
        assert np.asarray(img).max() == 255 and np.asarray(img)[16:24, 16:24].min() == 0
