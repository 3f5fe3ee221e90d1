"""One registry of named factories, shared by models (``--model``), data (``--data``) and
the tokenizers models bring: a dict from name to factory, filled by ``@register("name")``,
read by a ``name:argument`` spec."""
from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from .errors import UserError

F = TypeVar("F", bound=Callable)


class Registry(dict[str, F], Generic[F]):
    """Factories by name; ``option`` names the flag in errors (``--model``).

    ``builtins``: the modules (absolute names) that register the built-in factories when
    imported. They are imported on the registry's first read, not with the package, so a
    package's face stays light (``amptrain --help`` imports no torch): reading the names,
    a factory or a spec imports them first.
    """

    def __init__(self, option: str, builtins: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.option = option
        self._builtins = builtins

    def _load(self) -> None:
        if self._builtins:
            # Cleared first: a built-in module that reads the registry while it registers
            # finds it loading, not a loop.
            modules, self._builtins = self._builtins, ()
            for module in modules:
                importlib.import_module(module)

    def __iter__(self) -> Iterator[str]:
        self._load()
        return super().__iter__()

    def __len__(self) -> int:
        self._load()
        return super().__len__()

    def __contains__(self, name: object) -> bool:
        self._load()
        return super().__contains__(name)

    def __getitem__(self, name: str) -> F:
        self._load()
        return super().__getitem__(name)

    def get(self, name: str, default: Any = None) -> Any:
        """The factory called ``name``, or ``default``."""
        self._load()
        return super().get(name, default)

    def keys(self) -> Any:
        """The names (the built-in ones imported first)."""
        self._load()
        return super().keys()

    def values(self) -> Any:
        """The factories (the built-in ones imported first)."""
        self._load()
        return super().values()

    def items(self) -> Any:
        """(name, factory) pairs (the built-in ones imported first)."""
        self._load()
        return super().items()

    def register(self, name: str) -> Callable[[F], F]:
        """A decorator adding a factory under ``name`` (it returns the factory unchanged)."""
        def decorate(factory: F) -> F:
            self[name] = factory
            return factory
        return decorate

    def find(self, spec: str) -> tuple[F | None, str]:
        """(the factory of ``name:argument``'s name or None, the argument)."""
        name, _, argument = spec.partition(":")
        return self.get(name), argument

    def lookup(self, spec: str, hint: str = "") -> tuple[F, str]:
        """(factory, argument) of ``spec``, or a UserError listing the names (``hint``
        appended to it)."""
        factory, argument = self.find(spec)
        if factory is None:
            raise UserError(f"unknown {self.option} {spec!r}; choose one of "
                            f"{', '.join(sorted(self))}{hint}")
        return factory, argument
