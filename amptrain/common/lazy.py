"""Names a package exports but imports only on first use (PEP 562).

``amptrain --help`` imports ``amptrain.cli`` and the command modules, which may reach a
torch-free module inside a package (``amptrain.common.outdir``, say): the package's face
must not import torch on the way. A package lists its public names and the module that
defines each, and ``__getattr__ = lazy_exports(__name__, table)`` imports them when used.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, table: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports ``table[name]`` (a module
    relative to the package) on first access of ``name`` and caches the value."""
    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(table[name], package), name)
        setattr(importlib.import_module(package), name, value)
        return value
    return __getattr__
