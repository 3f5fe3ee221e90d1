"""One registry of named factories, shared by models (``--model``), data (``--data``) and
the tokenizers models bring: a dict from name to factory, filled by ``@register("name")``,
read by a ``name:argument`` spec."""
from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from .errors import UserError

F = TypeVar("F", bound=Callable)


class Registry(dict[str, F], Generic[F]):
    """Factories by name; ``option`` names the flag in errors (``--model``)."""

    def __init__(self, option: str) -> None:
        super().__init__()
        self.option = option

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
