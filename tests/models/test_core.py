"""amptrain/models/core.py: the model registry, option parsing and data-kind checks."""
from __future__ import annotations

import pytest
from torch import nn

from amptrain.common.errors import UserError
from amptrain.models import (
    MODELS,
    TEXT_ENCODERS,
    ModelInputs,
    build_model,
    is_conv_net,
    register,
    text_encoder_for,
)
from amptrain.models.core import (
    image_channels,
    parse_options,
    require_positive,
    sequence_vocab,
)
from tests.models.conftest import FEATURES, IMAGES, SEQUENCES


def test_registry_has_every_documented_model():
    assert {"mlp", "cnn", "resnet18", "resnet50", "lstm", "transformer", "module", "timm",
            "hf"} <= set(MODELS)


# The model-specific cases of this check live with their models (test_basic.py ...).
@pytest.mark.parametrize("spec,inputs,match", [
    ("resnet101", IMAGES, "unknown --model 'resnet101'"),
])
def test_mismatches_and_bad_options_are_user_errors(spec, inputs, match):
    with pytest.raises(UserError, match=match) as caught:
        build_model(spec, inputs)
    assert "--model" in str(caught.value)


# ------------------------------------------------------------------ new
def test_a_registered_factory_gets_its_argument_and_the_inputs(monkeypatch):
    seen = {}

    def factory(argument: str, inputs: ModelInputs) -> nn.Module:
        seen["argument"], seen["inputs"] = argument, inputs
        return nn.Linear(1, inputs.num_classes)

    monkeypatch.setitem(MODELS, "my-model", None)  # undone after the test
    assert register("my-model")(factory) is factory
    model = build_model("my-model:a=1:b", FEATURES)
    assert seen == {"argument": "a=1:b", "inputs": FEATURES}  # split at the first colon
    assert isinstance(model, nn.Linear) and model.out_features == 4


def test_parse_options_positional_types_and_bounds():
    defaults = {"width": 32, "dropout": 0.1, "stem": "auto"}
    assert parse_options("", defaults, "m") == defaults
    assert parse_options("64,stem=cifar", defaults, "m", positional="width") == \
        {"width": 64, "dropout": 0.1, "stem": "cifar"}
    assert parse_options("dropout=0", defaults, "m")["dropout"] == 0.0
    with pytest.raises(UserError, match="unknown option '64'"):
        parse_options("64", defaults, "m")  # no positional option
    with pytest.raises(UserError, match=r"dropout must be a number \(got 'x'\)"):
        parse_options("dropout=x", defaults, "m")
    with pytest.raises(UserError, match="width must not be negative"):
        parse_options("-1", defaults, "m", positional="width")
    require_positive({"width": 1}, "m", "width")
    with pytest.raises(UserError, match=r"--model m: width must be >= 1 \(got 0\)"):
        require_positive({"width": 0}, "m", "width")


def test_data_kind_checks_name_the_models_that_fit():
    assert image_channels(ModelInputs(2, (1, 4, 4)), "cnn") == 1
    assert sequence_vocab(SEQUENCES, "lstm") == 50
    with pytest.raises(UserError, match="try --model mlp"):
        image_channels(ModelInputs(2, (3, 4), "image"), "cnn")  # images need C x H x W
    with pytest.raises(UserError, match="try --model mlp"):
        sequence_vocab(ModelInputs(2, (12,), "sequence"), "lstm")  # no vocabulary size
    with pytest.raises(UserError, match="try --model cnn or resnet18"):
        sequence_vocab(IMAGES, "lstm")
    text = ModelInputs(256, (16,), "lm", 256)  # language-model blocks
    for check in (image_channels, sequence_vocab):
        with pytest.raises(UserError, match="try --model gpt"):
            check(text, "x")


def test_is_conv_net_and_text_encoder_lookup(monkeypatch):
    assert is_conv_net(nn.Sequential(nn.Flatten(), nn.Sequential(nn.Conv2d(1, 1, 1))))
    assert not is_conv_net(nn.Sequential(nn.Conv1d(1, 1, 1), nn.Linear(1, 1)))
    assert text_encoder_for("lstm") is None and text_encoder_for("transformer:layers=1") is None
    monkeypatch.setitem(TEXT_ENCODERS, "mine",
                        lambda argument, option="model": ("encoder", argument))
    assert text_encoder_for("mine:path/to:x") == ("encoder", "path/to:x")
