"""amptrain/models/range_demos.py: ``demo-overflow`` and ``demo-underflow``, models whose
values leave fp16's range on purpose (for ``diagnose``)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from amptrain.common.errors import UserError
from amptrain.models import MODELS, build_model
from amptrain.models.range_demos import RangeDemo, Scale
from tests.models.conftest import FEATURES, IMAGES, SEQUENCES, batch_for

FP16_MAX = torch.finfo(torch.float16).max
FP16_TINY = torch.finfo(torch.float16).tiny  # smallest normal


def test_registered_with_their_default_factors():
    assert {"demo-overflow", "demo-underflow"} <= set(MODELS)
    overflow = build_model("demo-overflow", IMAGES)
    underflow = build_model("demo-underflow", FEATURES)
    assert isinstance(overflow, RangeDemo) and overflow.scale.factor == 1e5
    assert underflow.scale.factor == 1e-3  # as docs/diagnose.md says
    assert build_model("demo-overflow:1e6", FEATURES).scale.factor == 1e6
    assert overflow.body[1].in_features == 3 * 16 * 16 and overflow.head.out_features == 5
    assert repr(Scale(1e5)) == "Scale(factor=100000)"


def test_overflow_demo_leaves_fp16_range_only_after_the_scale():
    torch.manual_seed(0)
    model = build_model("demo-overflow", FEATURES)
    x, _ = batch_for(FEATURES)
    with torch.no_grad():
        hidden = model.body(x)
        scaled = model.scale(hidden)
    assert hidden.abs().max() <= 1  # tanh
    assert scaled.abs().max() > FP16_MAX  # what an fp16 forward turns into inf
    assert torch.equal(scaled, hidden * 1e5)
    with torch.no_grad():
        assert torch.isinf(model.half()(x.half())).any()


def test_underflow_demo_shrinks_the_gradients_behind_it():
    torch.manual_seed(0)
    model = build_model("demo-underflow", FEATURES)
    plain = build_model("demo-underflow:1", FEATURES)
    plain.load_state_dict(model.state_dict())
    x, y = batch_for(FEATURES)
    for m in (model, plain):
        nn.functional.cross_entropy(m(x), y).backward()
    first, first_plain = model.body[1].weight.grad, plain.body[1].weight.grad
    # The gradient through the scale is 1e-3 of the unscaled one (and smaller still
    # because the head sees tiny activations): far below what fp16 keeps exactly.
    assert first.abs().max() < 1e-3 * first_plain.abs().max()
    assert (first.abs() < FP16_TINY).float().mean() > 0.5


@pytest.mark.parametrize("spec,inputs,match", [
    ("demo-overflow:big", FEATURES, "the argument is the scale factor, e.g. demo-overflow:100000"),
    ("demo-underflow", SEQUENCES, "takes images or features, not token sequences"),
], ids=["bad-factor", "token-data"])
def test_bad_argument_and_token_data_are_user_errors(spec, inputs, match):
    with pytest.raises(UserError, match=match) as caught:
        build_model(spec, inputs)
    assert "--model" in str(caught.value)
