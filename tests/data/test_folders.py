"""amptrain/data/folders.py: ``imagefolder:DIR``, one subfolder of images per class."""
from __future__ import annotations

import pytest
import torch

from amptrain.data import DataOptions, build_data
from amptrain.common.errors import UserError
from tests.data.conftest import assert_data_error


def write_png(path, size, color, mode="RGB") -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path)


def write_folder(root, classes=("cat", "dog"), per_class=5, mode="RGB") -> None:
    colors = {"RGB": [(250, 10, 10), (10, 10, 250), (10, 250, 10)], "L": [30, 220, 120]}[mode]
    for c, name in enumerate(classes):
        for i in range(per_class):
            write_png(root / name / f"{i}.png", (12 + i, 9 + 2 * i), colors[c], mode)


def _all(data):
    """Every sample of a streamed split as the model sees it (standardised on the device)."""
    x = torch.stack([data[i][0] for i in range(len(data))])
    y = torch.tensor([data[i][1] for i in range(len(data))])
    assert x.dtype == torch.uint8  # uint8 until the device
    return data.on_device((x, y), training=False, key=(0,))


def test_imagefolder_decodes_resizes_and_normalises(tmp_path):
    write_folder(tmp_path / "pets")
    (tmp_path / "pets" / "cat" / "notes.txt").write_text("not an image: ignored")
    data = build_data(f"imagefolder:{tmp_path / 'pets'},size=8", DataOptions(val_fraction=0.2))
    assert data.class_names == ["cat", "dog"] and data.input_shape == (3, 8, 8)
    assert len(data.train) == 8 and len(data.val) == 2
    x, y = _all(data.train)
    # Red cats, blue dogs: after per-channel standardisation channel 0 separates them.
    assert (x[y == 0][:, 0].mean() > 0) and (x[y == 1][:, 0].mean() < 0)
    assert x.transpose(0, 1).reshape(3, -1).mean(dim=1).abs().max() < 1e-4


def test_imagefolder_train_val_subdirs_and_grayscale(tmp_path):
    write_folder(tmp_path / "train", ("a", "b", "c"), mode="L")
    write_folder(tmp_path / "val", ("a", "c"), per_class=2, mode="L")
    data = build_data(f"imagefolder:{tmp_path}")
    assert data.input_shape == (1, 32, 32) and data.num_classes == 3
    assert len(data.train) == 15 and len(data.val) == 4
    assert sorted(set(_all(data.val)[1].tolist())) == [0, 2]  # folder names, not positions
    rgb = build_data(f"imagefolder:{tmp_path},channels=3,size=4")
    assert rgb.input_shape == (3, 4, 4)


def _read_error(spec, pattern):
    """Images are decoded when read (the statistics' sample at once, the rest streamed)."""
    with pytest.raises(UserError, match=pattern):
        data = build_data(spec)
        _all(data.train), _all(data.val)


def test_imagefolder_malformed(tmp_path):
    root = tmp_path / "imgs"
    write_folder(root)
    (root / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n definitely not a png")
    _read_error(f"imagefolder:{root}", r"cannot decode image .*broken.png")
    (root / "dog" / "broken.png").unlink()
    good = (root / "dog" / "0.png").read_bytes()
    (root / "dog" / "0.png").write_bytes(good[: len(good) // 2])  # truncated PNG
    _read_error(f"imagefolder:{root}", r"cannot decode image .*0.png")
    (root / "dog" / "0.png").write_bytes(good)
    (root / "empty").mkdir()
    assert_data_error(f"imagefolder:{root}", "class folder .*empty has no images")
    (root / "empty").rmdir()
    assert_data_error(f"imagefolder:{root},size=0", "size must be >= 1")
    assert_data_error(f"imagefolder:{root},channels=2", "channels must be auto, 1 or 3")
    assert_data_error(f"imagefolder:{root},colour=1", "unknown option")
    write_folder(tmp_path / "one", ("only",))
    assert_data_error(f"imagefolder:{tmp_path / 'one'}", "at least two class folders")
    (tmp_path / "flat").mkdir()
    write_png(tmp_path / "flat" / "x.png", (4, 4), (0, 0, 0))
    assert_data_error(f"imagefolder:{tmp_path / 'flat'}", "no class subfolders")
    assert_data_error(f"imagefolder:{tmp_path / 'missing'}", "no such directory")
