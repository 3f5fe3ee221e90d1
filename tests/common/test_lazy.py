"""lazy.py: names a package exports but imports only on first use (PEP 562)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from amptrain.common.lazy import lazy_exports


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A real package on disk whose face exports ``VALUE`` from ``heavy`` lazily."""
    root = tmp_path / "lazypkg_owners"
    root.mkdir()
    (root / "__init__.py").write_text(textwrap.dedent("""
        from amptrain.common.lazy import lazy_exports
        __getattr__ = lazy_exports(__name__, {"VALUE": ".heavy", "MISSING": ".heavy"})
    """))
    (root / "heavy.py").write_text("VALUE = [1, 2, 3]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "lazypkg_owners"
    for name in [m for m in sys.modules if m.startswith("lazypkg_owners")]:
        del sys.modules[name]


def test_a_name_is_imported_on_first_use_and_then_cached(package):
    import importlib

    face = importlib.import_module(package)
    assert f"{package}.heavy" not in sys.modules  # importing the face imported nothing
    value = face.VALUE
    assert value == [1, 2, 3] and f"{package}.heavy" in sys.modules
    assert face.__dict__["VALUE"] is value  # cached: __getattr__ is not asked again
    assert face.VALUE is sys.modules[f"{package}.heavy"].VALUE


def test_an_unknown_name_is_an_attribute_error_naming_package_and_name(package):
    import importlib

    face = importlib.import_module(package)
    with pytest.raises(AttributeError, match=rf"module '{package}' has no attribute 'nothing'"):
        _ = face.nothing  # the access itself must raise
    assert not hasattr(face, "other")


def test_a_listed_name_its_module_lacks_is_an_attribute_error(package):
    import importlib

    face = importlib.import_module(package)
    with pytest.raises(AttributeError, match="MISSING"):
        _ = face.MISSING  # the access itself must raise


def test_the_getattr_serves_only_its_own_table():
    get = lazy_exports("amptrain", {"Trainer": ".trainer"})
    with pytest.raises(AttributeError, match="has no attribute 'Precision'"):
        get("Precision")


def test_the_cli_face_does_not_import_torch():
    # What lazy exports are for: `amptrain --help` reaches torch-free modules inside
    # packages whose faces export torch-heavy names.
    code = ("import sys, amptrain, amptrain.common.outdir, amptrain.compare; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"
