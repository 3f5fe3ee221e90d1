"""registry.py: the one Registry of named factories (``--model``, ``--data``, tokenizers)."""
from __future__ import annotations

import sys

import pytest

from amptrain.common.errors import UserError
from amptrain.common.registry import Registry


def _registry() -> Registry:
    models: Registry = Registry("--model")

    @models.register("mlp")
    def mlp(argument: str) -> str:
        return f"mlp({argument})"

    @models.register("hf")
    def hf(argument: str) -> str:
        return f"hf({argument})"

    return models


def test_register_returns_the_factory_unchanged_and_files_it_by_name():
    models: Registry = Registry("--model")

    def factory() -> int:
        return 7

    assert models.register("seven")(factory) is factory
    assert models["seven"] is factory and list(models) == ["seven"]
    assert models.option == "--model"


def test_find_splits_the_name_from_its_argument_at_the_first_colon():
    models = _registry()
    factory, argument = models.find("hf:/models/a:b")
    assert factory is models["hf"] and argument == "/models/a:b"
    assert models.find("mlp") == (models["mlp"], "")
    assert models.find("timm:resnet") == (None, "resnet")


def test_lookup_gives_the_factory_and_argument():
    factory, argument = _registry().lookup("hf:gpt2")
    assert factory("x") == "hf(x)" and argument == "gpt2"


def test_an_unknown_name_is_one_user_error_listing_the_names_sorted_with_the_hint():
    with pytest.raises(UserError) as caught:
        _registry().lookup("cnnn:3", hint=" (or module:pkg.mod.factory)")
    assert str(caught.value) == ("unknown --model 'cnnn:3'; choose one of hf, mlp "
                                 "(or module:pkg.mod.factory)")


def test_a_later_registration_replaces_an_earlier_one():
    models = _registry()
    models.register("mlp")(lambda argument: "new")
    assert models.lookup("mlp")[0]("") == "new" and len(models) == 2


def test_built_in_modules_register_on_the_first_read_not_before(tmp_path, monkeypatch):
    (tmp_path / "toyreg_holder.py").write_text(
        "from amptrain.common.registry import Registry\n"
        "TOYS = Registry('--toy', builtins=('toyreg_builtin',))\n")
    (tmp_path / "toyreg_builtin.py").write_text(
        "from toyreg_holder import TOYS\nTOYS.register('seven')(lambda argument: 7)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("toyreg_holder", "toyreg_builtin"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import toyreg_holder

    assert "toyreg_builtin" not in sys.modules  # making the registry imported nothing
    factory, argument = toyreg_holder.TOYS.lookup("seven:x")
    assert factory(argument) == 7 and "toyreg_builtin" in sys.modules
    assert list(toyreg_holder.TOYS) == ["seven"]
