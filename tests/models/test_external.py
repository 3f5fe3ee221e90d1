"""amptrain/models/external.py: the user's own factory (``module:``), ``timm:NAME`` and
``hf:PATH`` (optional packages)."""
from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from amptrain.common.errors import UserError
from amptrain.models import build_model
from tests.models.conftest import FEATURES, IMAGES, SEQUENCES

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

    class Net(nn.Module):
        """pytorch/examples' way: the constructor takes nothing."""

        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 3)

        def forward(self, x):
            return self.fc(x)

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


def test_a_class_whose_constructor_takes_nothing_is_a_factory(user_package):
    model = build_model("module:userpkg.models:Net", FEATURES)  # issue 49
    assert type(model).__name__ == "Net"


@pytest.mark.parametrize("spec,match", [
    ("module:userpkg.nothere.build", "cannot import userpkg.nothere"),
    ("module:nopkg_xyz.build", "cannot import nopkg_xyz"),
    ("module:userpkg.models.missing", "has no callable 'missing'"),
    ("module:userpkg.models.wrong_signature", "the factory is called with those of the keywords"),
    ("module:userpkg/models.py:build",
     "give the module's import name, not its file: --model module:userpkg.models:build"),
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


# ------------------------------------------------------------------ new
EXTRA_FACTORIES = '''
    from torch import nn

    def only_kind(num_classes, input_shape, kind):
        SEEN["kind"] = kind
        return nn.Linear(input_shape[0], num_classes)

    def fails(num_classes, input_shape):
        raise ValueError("bad width\\nsecond line")
'''


def test_module_factory_gets_only_the_keywords_it_takes_and_its_failures_are_reported(
        user_package, tmp_path):
    (tmp_path / "userpkg" / "extra.py").write_text(
        "SEEN = {}\n" + textwrap.dedent(EXTRA_FACTORIES))
    model = build_model("module:userpkg.extra.only_kind", FEATURES)
    assert model.in_features == 10 and model.out_features == 4
    assert sys.modules["userpkg.extra"].SEEN == {"kind": "features"}  # no vocab_size offered
    with pytest.raises(UserError, match=r"the factory raised ValueError: bad width$"):
        build_model("module:userpkg.extra.fails", FEATURES)
