"""Augmentation on the device: what each mode does, seeded and reproducible, and exact
resume of a streamed image folder with a DataLoader worker."""
from __future__ import annotations

import pytest
import torch

from amptrain import Trainer
from amptrain.data import DataOptions, ImageOptions, build_data
from amptrain.data.augment import DeviceImages, flip, generator_for, pad_crop, \
    random_resized_crop
from amptrain.common.errors import Preempted
from tests.data.test_folders import write_folder
from tests.data.test_tokens import StopAt

CPU = torch.device("cpu")


def _images(n=6, size=8):
    return torch.arange(n * 3 * size * size, dtype=torch.float32).view(n, 3, size, size)


def test_flip_mirrors_about_half_the_images():
    x = _images(64)
    out = flip(x, generator_for(CPU, (0,)))
    mirrored = [bool(torch.equal(o, i.flip(-1))) for o, i in zip(out, x)]
    kept = [bool(torch.equal(o, i)) for o, i in zip(out, x)]
    assert all(m or k for m, k in zip(mirrored, kept)) and 16 < sum(mirrored) < 48


def test_pad_crop_shifts_each_image_by_whole_pixels_with_zeros_outside():
    x = _images(32) + 1  # no zeros inside, so padding is visible
    out = pad_crop(x, 2, generator_for(CPU, (1,)))
    assert out.shape == x.shape
    for o, i in zip(out, x):
        shifts = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)
                  if torch.equal(o, torch.roll(torch.nn.functional.pad(i, (2,) * 4),
                                               (-2 - dy, -2 - dx), (1, 2))[:, :8, :8])]
        assert len(shifts) == 1
    assert (out == 0).any()  # some image was shifted into the padding


def test_random_resized_crop_keeps_the_shape_and_values_within_range():
    x = _images(16, 16)
    out = random_resized_crop(x, generator_for(CPU, (2,)))
    assert out.shape == x.shape and not torch.equal(out, x)
    assert out.min() >= x.min() - 1e-3 and out.max() <= x.max() + 1e-3


@pytest.mark.parametrize("how", ["flip", "crop-flip", "rrc-flip"])
def test_augmentation_is_seeded_reproducible_and_only_for_training(how):
    finish = DeviceImages([0.5] * 3, [0.25] * 3, how)
    batch = ((torch.rand(8, 3, 16, 16, generator=torch.Generator().manual_seed(0)) * 255)
             .to(torch.uint8), torch.zeros(8))
    a = finish(batch, training=True, key=(0, 1, 2, 0, 0))[0]
    b = finish(batch, training=True, key=(0, 1, 2, 0, 0))[0]
    c = finish(batch, training=True, key=(0, 1, 3, 0, 0))[0]
    plain = finish(batch, training=False, key=(0, 1, 2, 0, 0))[0]
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(plain, (batch[0].float() / 255 - 0.5) / 0.25)


def _fit(data, out, callbacks=()):
    trainer = Trainer(precision="32-true", device="cpu", batch_size=6, micro_batch_size=3,
                      epochs=2, lr=0.01, deterministic=True, out=str(out), num_workers=1,
                      resume="auto" if (out / "checkpoints").exists() else None,
                      no_progress=True, callbacks=callbacks)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Dropout(0.2),
                                torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2))
    trainer.fit(model, data.train, data.val)
    return trainer


@pytest.mark.slow
def test_streamed_images_resume_mid_epoch_bitwise(tmp_path):
    write_folder(tmp_path / "pets", per_class=10)
    data = build_data(f"imagefolder:{tmp_path / 'pets'},size=8",
                      DataOptions(val_fraction=0.2, images=ImageOptions(augment="crop-flip")))
    whole = _fit(data, tmp_path / "whole")
    with pytest.raises(Preempted):
        _fit(data, tmp_path / "cut", callbacks=[StopAt(2)])  # inside the first epoch
    resumed = _fit(data, tmp_path / "cut")
    assert resumed.step == whole.step == 6
    for (name, a), b in zip(whole.model.state_dict().items(),
                            resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
