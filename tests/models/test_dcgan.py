"""models/dcgan.py: the generator/discriminator pair, sized from every image data kind."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from amptrain.data import DataOptions, build_data
from amptrain.common.errors import UserError
from amptrain.models import ModelInputs, build_model
from amptrain.models.dcgan import DCGAN, doublings
from amptrain.workflows.runner import model_inputs
from amptrain.tasks import GanTask
from tests.data.test_folders import write_folder
from tests.data.test_images import cifar_batch, write_cifar, write_idx


def _idx(root, side: int = 28):
    root.mkdir()
    rng = np.random.default_rng(0)
    write_idx(root / "train-images-idx3-ubyte", rng.integers(0, 256, (20, side, side)))
    write_idx(root / "train-labels-idx1-ubyte", rng.integers(0, 10, 20))
    return f"idx:{root}"


def _data_specs(tmp_path):
    write_cifar(tmp_path / "cifar")
    write_folder(tmp_path / "rgb")
    write_folder(tmp_path / "grey", mode="L")
    return {"digits": ("digits", (1, 8, 8)), "idx": (_idx(tmp_path / "mnist"), (1, 28, 28)),
            "cifar10": (f"cifar10:{tmp_path / 'cifar'}", (3, 32, 32)),
            "imagefolder": (f"imagefolder:{tmp_path / 'rgb'},size=64", (3, 64, 64)),
            "imagefolder-grey": (f"imagefolder:{tmp_path / 'grey'},size=16", (1, 16, 16))}


@pytest.mark.slow  # ~7 s: five datasets written and read
def test_every_image_data_kind_gets_a_pair_of_its_shape_and_value_range(tmp_path):
    assert cifar_batch(1, 0)  # the helpers write real files of each format
    for name, (spec, shape) in _data_specs(tmp_path).items():
        data = build_data(spec, DataOptions())
        inputs = model_inputs(data)
        assert inputs.input_shape == shape, name
        torch.manual_seed(0)
        model = build_model("dcgan", inputs)
        assert isinstance(model, DCGAN)
        task = GanTask()
        task.learn_from(data.train)
        task.models(model)  # maps the generator's output to the data's range
        low, high = (torch.tensor(v) for v in task.value_range)
        real = task._real.batch(torch.arange(len(task._real)), torch.device("cpu"))[0]
        assert torch.allclose(low, real.amin(dim=(0, 2, 3))), name
        assert torch.allclose(high, real.amax(dim=(0, 2, 3))) and (high > low).any(), name
        model.eval()
        with torch.no_grad():
            fake = model.sample(5, torch.Generator().manual_seed(1))
            logits = model(fake)
        assert fake.shape == (5, *shape) and logits.shape == (5,), name
        per_channel = fake.transpose(0, 1).flatten(1)
        assert (per_channel.min(dim=1).values >= low - 1e-5).all(), name
        assert (per_channel.max(dim=1).values <= high + 1e-5).all(), name


@pytest.mark.parametrize("shape", [(1, 4, 4), (1, 7, 5), (3, 9, 9), (1, 28, 32), (3, 128, 128)])
def test_odd_and_non_square_sizes_generate_exactly_that_size(shape):
    model = build_model("dcgan:width=8,latent=16", ModelInputs(2, shape))
    z = model.latents(3, torch.Generator().manual_seed(0))
    assert z.shape == (3, 16)
    images = model.generator(z)
    assert images.shape == (3, *shape)
    assert model(images).shape == (3,)


def test_first_map_is_four_to_seven_pixels():
    assert [doublings(s) for s in (4, 7, 8, 15, 16, 28, 32, 63, 64)] == [1, 1, 1, 1, 2, 2, 3, 3, 4]


def test_options_init_and_both_parts_train():
    torch.manual_seed(0)
    model = build_model("dcgan:16,latent=8", ModelInputs(10, (1, 8, 8)))
    assert model.latent == 8 and model.discriminator.features[0].out_channels == 16
    convs = [m.weight.detach() for m in model.modules()
             if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d))]
    assert abs(float(torch.cat([w.flatten() for w in convs]).std()) - 0.02) < 0.004
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert norms and all(abs(float(m.weight.detach().mean()) - 1) < 0.02 for m in norms)
    fake = model.sample(4)
    loss = model(fake).mean()
    loss.backward()
    for part in (model.generator, model.discriminator):
        grads = [p.grad for p in part.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        assert any(float(g.abs().sum()) > 0 for g in grads)


def test_sampling_is_seeded_and_the_range_is_a_buffer():
    model = build_model("dcgan", ModelInputs(10, (3, 8, 8))).eval()
    with torch.no_grad():
        a = model.sample(3, torch.Generator().manual_seed(5))
        b = model.sample(3, torch.Generator().manual_seed(5))
        c = model.sample(3, torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    model.set_output_range([0.0, -2.0, 10.0], [1.0, 2.0, 11.0])
    with torch.no_grad():
        d = model.sample(50, torch.Generator().manual_seed(5))
    for c_, (lo, hi) in enumerate([(0, 1), (-2, 2), (10, 11)]):
        assert lo <= float(d[:, c_].min()) and float(d[:, c_].max()) <= hi
    state = model.state_dict()
    assert state["generator.out_low"].flatten().tolist() == [0.0, -2.0, 10.0]
    again = build_model("dcgan", ModelInputs(10, (3, 8, 8)))
    again.load_state_dict(state)
    assert again.output_range() == model.output_range()


@pytest.mark.parametrize("inputs, spec", [
    (ModelInputs(3, (12,), "sequence", vocab_size=50), "dcgan"),
    (ModelInputs(3, (10,), "features"), "dcgan"),
    (ModelInputs(3, (2, 8, 8)), "dcgan"),     # two channels: neither grey nor RGB
    (ModelInputs(3, (1, 3, 8)), "dcgan"),     # under 4 pixels
    (ModelInputs(3, (1, 8, 8)), "dcgan:width=0"),
    (ModelInputs(3, (1, 8, 8)), "dcgan:depth=3"),
])
def test_refuses_what_it_cannot_generate_naming_the_flag(inputs, spec):
    with pytest.raises(UserError, match="--model dcgan"):
        build_model(spec, inputs)
