"""amptrain/models/basic.py: ``mlp`` and ``cnn``."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from amptrain.errors import UserError
from amptrain.models import MLP, ModelInputs, SmallCNN, build_model
from tests.models.conftest import (
    FEATURES,
    IMAGES,
    SEQUENCES,
    check_forward_backward,
    check_trains_under_bf16_mixed,
)

CASES = [("mlp", IMAGES), ("mlp:32", FEATURES), ("cnn:8", IMAGES)]


@pytest.mark.parametrize("spec,inputs", CASES, ids=[c[0] for c in CASES])
def test_forward_backward(spec, inputs):
    check_forward_backward(spec, inputs)


@pytest.mark.parametrize("spec,inputs", CASES, ids=[c[0] for c in CASES])
def test_trains_under_bf16_mixed(spec, inputs):
    check_trains_under_bf16_mixed(spec, inputs)


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
