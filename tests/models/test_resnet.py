"""amptrain/models/resnet.py: ``resnet18`` and ``resnet50``."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from amptrain.common.errors import UserError
from amptrain.models import ModelInputs, ResNet, build_model
from amptrain.models.resnet import BasicBlock, Bottleneck
from tests.models.conftest import (
    FEATURES,
    IMAGES,
    SEQUENCES,
)

@pytest.mark.parametrize("spec,inputs,match", [
    ("resnet18", FEATURES, "needs images.*try --model mlp"),
    ("resnet50", SEQUENCES, "needs images"),
    ("resnet18:stem=huge", IMAGES, "stem must be auto, cifar or imagenet"),
])
def test_mismatches_and_bad_options_are_user_errors(spec, inputs, match):
    with pytest.raises(UserError, match=match) as caught:
        build_model(spec, inputs)
    assert "--model" in str(caught.value)


def test_resnet_stems_follow_the_input_size():
    small = build_model("resnet18", IMAGES)
    stem = small.stem[0]
    assert stem.kernel_size == (3, 3) and stem.stride == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in small.modules())
    # The CIFAR ResNet-18 everyone quotes: 11,173,962 parameters for 10 classes.
    cifar = build_model("resnet18", ModelInputs(10, (3, 32, 32)))
    assert sum(p.numel() for p in cifar.parameters()) == 11_173_962
    large = build_model("resnet50:8", ModelInputs(10, (3, 128, 128)))
    assert large.stem[0].kernel_size == (7, 7) and isinstance(large.stem[3], nn.MaxPool2d)
    gray = build_model("resnet18:8", ModelInputs(10, (1, 8, 8)))
    assert gray.stem[0].in_channels == 1 and gray(torch.randn(2, 1, 8, 8)).shape == (2, 10)


# ------------------------------------------------------------------ new
def test_stages_blocks_and_zero_initialised_residual_branches():
    r18 = build_model("resnet18:4", IMAGES)
    r50 = build_model("resnet50:4,stem=imagenet", IMAGES)  # forced, though the input is small
    assert isinstance(r18, ResNet) and isinstance(r50.stem[3], nn.MaxPool2d)
    assert [len(s) for s in (r18.layer1, r18.layer2, r18.layer3, r18.layer4)] == [2, 2, 2, 2]
    assert [len(s) for s in (r50.layer1, r50.layer2, r50.layer3, r50.layer4)] == [3, 4, 6, 3]
    assert all(isinstance(b, BasicBlock) for b in r18.layer1)
    assert all(isinstance(b, Bottleneck) for b in r50.layer4)
    assert r18.head.in_features == 8 * 4 and r50.head.in_features == 8 * 4 * 4
    big = build_model("resnet18:4,stem=cifar", ModelInputs(3, (3, 128, 128)))
    assert big.stem[0].kernel_size == (3, 3)  # forced the other way
    # Every residual branch starts as zero, so every block starts as relu(shortcut(x)).
    for block in list(r18.modules()) + list(r50.modules()):
        if isinstance(block, (BasicBlock, Bottleneck)):
            assert torch.count_nonzero(block.last_norm().weight) == 0
    block = r18.layer2[0].eval()  # stride 2 with a projection shortcut
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        assert torch.equal(block(x), torch.relu(block.shortcut(x)))
