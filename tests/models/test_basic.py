"""amptrain/models/basic.py: ``mlp`` and ``cnn``."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from amptrain.common.errors import UserError
from amptrain.models import MLP, ModelInputs, SmallCNN, build_model
from tests.models.conftest import (
    FEATURES,
    IMAGES,
    SEQUENCES,
)

@pytest.mark.parametrize("spec,inputs,match", [
    ("cnn", SEQUENCES, "needs images.*try --model lstm or transformer"),
    ("mlp", SEQUENCES, "lstm or transformer"),
    ("cnn:0", IMAGES, "width must be >= 1"),
    ("mlp:hidden=-3", FEATURES, "hidden must not be negative"),
])
def test_mismatches_and_bad_options_are_user_errors(spec, inputs, match):
    with pytest.raises(UserError, match=match) as caught:
        build_model(spec, inputs)
    assert "--model" in str(caught.value)


# ------------------------------------------------------------------ new
def test_widths_follow_the_spec_and_the_data():
    mlp = build_model("mlp:hidden=7", IMAGES)
    assert isinstance(mlp, MLP)
    first, second = (m for m in mlp.body if isinstance(m, nn.Linear))
    assert first.in_features == 3 * 16 * 16 and first.out_features == 7
    assert second.in_features == second.out_features == 7 and mlp.head.in_features == 7
    assert build_model("mlp", FEATURES).head.in_features == 256  # the default width
    cnn = build_model("cnn:width=4", ModelInputs(2, (1, 9, 9)))
    assert isinstance(cnn, SmallCNN)
    convs = [m for m in cnn.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.in_channels, c.out_channels) for c in convs] == [(1, 4), (4, 8), (8, 16)]
    assert cnn.head.in_features == 16
    assert build_model("cnn:4", ModelInputs(2, (1, 9, 9))).head.in_features == 16  # positional
    # Global pooling: any image size gives one logit row per sample (odd sizes too).
    assert cnn(torch.randn(3, 1, 9, 9)).shape == (3, 2)
    assert cnn(torch.randn(3, 1, 5, 7)).shape == (3, 2)


def _pixels_seen_by_each_block(cnn: SmallCNN, shape: tuple[int, ...]) -> list[int]:
    """The spatial side at the input of every conv of ``cnn`` for one image of ``shape``."""
    sides: list[int] = []
    hooks = [m.register_forward_pre_hook(lambda m, args: sides.append(args[0].shape[-1]))
             for m in cnn.modules() if isinstance(m, nn.Conv2d)]
    cnn(torch.randn(1, *shape))
    for hook in hooks:
        hook.remove()
    return sides


@pytest.mark.parametrize("shape, sides", [
    ((1, 8, 8), [8, 8, 4]),             # digits: unchanged, three blocks and one pool
    ((1, 28, 28), [28, 14, 7, 4]),      # MNIST-sized: LeNet-like down-sampling
    ((3, 32, 32), [32, 16, 8, 4]),      # CIFAR-sized
    ((3, 64, 64), [64, 32, 16, 8, 4]),  # one stage more per doubling
])
def test_cnn_grows_with_the_input_and_its_last_blocks_see_a_few_pixels(shape, sides):
    cnn = build_model("cnn", ModelInputs(10, shape))
    assert _pixels_seen_by_each_block(cnn, shape) == sides
    # The head's input stays 4 x width whatever the image size (global pooling)...
    assert cnn.head.in_features == 128
    # ...and so does what the last block's pooling flattens: at most 4x4 pixels of it.
    assert cnn.features[:-2](torch.randn(1, *shape)).shape[1:] == (128, 4, 4)
    assert cnn(torch.randn(2, 1 if shape[0] == 1 else 3, 5, 7)).shape == (2, 10)  # any size fits


def test_cnn_at_28x28_costs_less_than_the_one_pool_net_did():
    # The old net ran its second block (the most expensive) at full resolution.
    def conv_macs(cnn: SmallCNN, shape: tuple[int, ...]) -> int:
        macs: list[int] = []
        hooks = [m.register_forward_hook(lambda m, a, out: macs.append(
            out.numel() * m.in_channels * m.kernel_size[0] * m.kernel_size[1]))
            for m in cnn.modules() if isinstance(m, nn.Conv2d)]
        cnn(torch.randn(1, *shape))
        for hook in hooks:
            hook.remove()
        return sum(macs)

    scaled = build_model("cnn", ModelInputs(10, (1, 28, 28)))
    one_pool = SmallCNN(1, 10, 32)
    assert conv_macs(scaled, (1, 28, 28)) < conv_macs(one_pool, (1, 28, 28)) / 2
