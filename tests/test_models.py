"""Every built-in model builds for its data, runs forward and backward, trains under
bf16-mixed through the Trainer, and refuses data it cannot take."""
from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from torch import nn

from amptrain.data import TensorData
from amptrain.errors import UserError
from amptrain.models import MODELS, ModelInputs, build_model
from amptrain.trainer import Trainer

IMAGES = ModelInputs(num_classes=5, input_shape=(3, 16, 16), kind="image")
SEQUENCES = ModelInputs(num_classes=3, input_shape=(12,), kind="sequence", vocab_size=50)
FEATURES = ModelInputs(num_classes=4, input_shape=(10,), kind="features")

# Small widths keep the ResNets fast on two CPU cores; the architecture is the same.
CASES = [("mlp", IMAGES), ("mlp:32", FEATURES), ("cnn:8", IMAGES), ("resnet18:8", IMAGES),
         ("resnet50:4", IMAGES), ("lstm:embed=16,hidden=16", SEQUENCES),
         ("transformer:d_model=32,layers=1,heads=2,ff=64", SEQUENCES)]


def batch_for(inputs: ModelInputs, n: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, inputs.num_classes, (n,), generator=g)
    if inputs.kind == "sequence":
        x = torch.randint(1, inputs.vocab_size, (n, *inputs.input_shape), generator=g)
        x[:, -3:] = 0  # padding at the end, as the loaders write it
        return x, y
    return torch.randn(n, *inputs.input_shape, generator=g), y


def test_registry_has_every_documented_model():
    assert {"mlp", "cnn", "resnet18", "resnet50", "lstm", "transformer", "module", "timm",
            "hf"} <= set(MODELS)


@pytest.mark.parametrize("spec,inputs", CASES, ids=[c[0] for c in CASES])
def test_forward_backward(spec, inputs):
    torch.manual_seed(0)
    model = build_model(spec, inputs)
    x, y = batch_for(inputs)
    logits = model(x)
    assert logits.shape == (len(y), inputs.num_classes)
    nn.functional.cross_entropy(logits, y).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert isinstance(model.head, nn.Linear) and model.head.out_features == inputs.num_classes


@pytest.mark.parametrize("spec,inputs", CASES, ids=[c[0] for c in CASES])
def test_trains_under_bf16_mixed(spec, inputs):
    torch.manual_seed(0)
    model = build_model(spec, inputs)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = batch_for(inputs, n=32, seed=1)
    trainer = Trainer(precision="bf16-mixed", device="cpu", batch_size=8, max_steps=3,
                      log_every=1, no_progress=True, keep_fp32=["head"])
    result = trainer.fit(model, TensorData(x[:24], y[:24]), TensorData(x[24:], y[24:]))
    assert result.steps == 3 and result.skipped_steps == 0
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in result.history if "loss" in r)
    assert result.val_loss is not None and torch.isfinite(torch.tensor(result.val_loss))
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("spec,inputs,match", [
    ("cnn", SEQUENCES, "needs images.*try --model lstm or transformer"),
    ("resnet18", FEATURES, "needs images.*try --model mlp"),
    ("resnet50", SEQUENCES, "needs images"),
    ("lstm", IMAGES, "needs token sequences.*try --model cnn or resnet18"),
    ("transformer", FEATURES, "needs token sequences"),
    ("mlp", SEQUENCES, "lstm or transformer"),
    ("transformer:heads=3", SEQUENCES, "d_model 128 is not divisible by heads 3"),
    ("transformer:depth=2", SEQUENCES, "unknown option 'depth=2'"),
    ("lstm:hidden=big", SEQUENCES, "hidden must be an integer"),
    ("lstm:dropout=1.5", SEQUENCES, r"dropout must be in \[0, 1\)"),
    ("resnet18:stem=huge", IMAGES, "stem must be auto, cifar or imagenet"),
    ("cnn:0", IMAGES, "width must be >= 1"),
    ("mlp:hidden=-3", FEATURES, "hidden must not be negative"),
    ("resnet101", IMAGES, "unknown --model 'resnet101'"),
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


def test_transformer_defaults_are_bert_tiny_and_options_apply():
    model = build_model("transformer", SEQUENCES)
    layers = model.encoder.layers
    assert len(layers) == 2 and layers[0].self_attn.num_heads == 2
    assert layers[0].self_attn.embed_dim == 128 and layers[0].linear1.out_features == 512
    assert layers[0].norm_first and model.position.shape == (1, 12, 128)
    custom = build_model("transformer:d_model=64,layers=3,heads=4,ff=128", SEQUENCES)
    assert len(custom.encoder.layers) == 3 and custom.encoder.layers[0].self_attn.num_heads == 4


@pytest.mark.parametrize("spec", ["lstm:embed=16,hidden=16", "transformer:d_model=32,layers=1"])
def test_sequence_models_ignore_padding(spec):
    torch.manual_seed(0)
    model = build_model(spec, ModelInputs(3, (10,), "sequence", vocab_size=20)).eval()
    short = torch.tensor([[4, 5, 6, 0, 0, 0]])
    long = torch.tensor([[4, 5, 6, 0, 0, 0, 0, 0, 0, 0]])
    with torch.no_grad():
        assert torch.allclose(model(short), model(long), atol=1e-5)
        empty = model(torch.zeros(2, 10, dtype=torch.long))  # a text with no tokens
    assert torch.isfinite(empty).all()


# ------------------------------------------------------------------ outside models
FACTORIES = '''
    import torch
    from torch import nn

    def build(num_classes, input_shape):
        return nn.Sequential(nn.Flatten(), nn.Linear(int(torch.tensor(input_shape).prod()),
                                                     num_classes))

    def build_seq(num_classes, input_shape, **extra):
        SEEN.update(extra)
        return nn.Sequential(nn.Embedding(extra["vocab_size"], 4), nn.Flatten(),
                             nn.Linear(4 * input_shape[0], num_classes))

    def wrong_signature(classes):
        return nn.Linear(1, classes)

    def not_a_module(num_classes, input_shape):
        return "a string"

    SEEN = {}
'''


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    package = tmp_path / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(textwrap.dedent(FACTORIES))
    (package / "broken.py").write_text("def oops(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "userpkg"
    for name in [m for m in sys.modules if m.startswith("userpkg")]:
        del sys.modules[name]


def test_module_factory(user_package):
    model = build_model("module:userpkg.models.build", FEATURES)
    assert model(torch.randn(2, 10)).shape == (2, 4)
    model = build_model("module:userpkg.models:build_seq", SEQUENCES)  # colon form too
    assert model(torch.randint(0, 50, (2, 12))).shape == (2, 3)
    seen = sys.modules["userpkg.models"].SEEN
    assert seen == {"kind": "sequence", "vocab_size": 50}


@pytest.mark.parametrize("spec,match", [
    ("module:userpkg.nothere.build", "cannot import userpkg.nothere"),
    ("module:nopkg_xyz.build", "cannot import nopkg_xyz"),
    ("module:userpkg.models.missing", "has no callable 'missing'"),
    ("module:userpkg.models.wrong_signature", "must accept the keywords num_classes and input_shape"),
    ("module:userpkg.models.not_a_module", "returned a str, not a torch.nn.Module"),
    ("module:userpkg.broken.oops", "syntax error in userpkg.broken"),
    ("module:build", "give the factory as module:PACKAGE.MODULE.FUNCTION"),
])
def test_module_factory_errors(user_package, spec, match):
    with pytest.raises(UserError, match=match):
        build_model(spec, FEATURES)


def test_optional_packages_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # makes `import timm` fail
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(UserError, match="needs the timm package: pip install timm"):
        build_model("timm:resnet18", IMAGES)
    with pytest.raises(UserError, match="needs the transformers package: pip install transformers"):
        build_model("hf:prajjwal1/bert-tiny", SEQUENCES)


def test_timm_model_when_installed():
    timm = pytest.importorskip("timm")
    model = build_model("timm:resnet18", IMAGES)
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 5)
    with pytest.raises(UserError, match="timm has no model"):
        build_model("timm:no-such-net", IMAGES)
    assert timm.is_model("resnet18")
