"""Nested containers of tensors (batches, model outputs, optimizer and checkpoint state):
the one walker that every module uses instead of its own recursion.

A container is a mapping (``dict``, ``OrderedDict``, ``defaultdict``, other ``Mapping``
types rebuilt as themselves where they can be), a ``list``, or a ``tuple`` (named tuples
and ``torch.Size`` keep their type). Everything else is a leaf. Unlike
``torch.utils._pytree``, a mapping keeps its own type and a leaf that is not a tensor
(a number, a string, an object) passes through untouched, so the same helper serves
batches, outputs and state dicts.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

#: A tensor's place in a nested value: the keys and indices leading to it.
Path = tuple[Any, ...]


def rebuild(like: Any, items: Iterable[Any]) -> Any:
    """A container of ``like``'s type holding ``items`` (``(key, value)`` pairs for a
    mapping, values otherwise)."""
    if isinstance(like, Mapping):
        pairs = list(items)
        if isinstance(like, defaultdict):
            return type(like)(like.default_factory, pairs)
        if type(like) is dict:
            return dict(pairs)
        try:
            make: Any = type(like)
            return make(pairs)
        except TypeError:  # a mapping type that cannot be built from pairs
            return dict(pairs)
    if isinstance(like, tuple) and hasattr(like, "_fields"):  # a named tuple
        return type(like)(*items)
    if type(like) in (list, tuple):
        return type(like)(items)
    return type(like)(list(items))  # torch.Size, list and tuple subclasses


def map_tensors(fn: Callable[[torch.Tensor], Any], value: Any, *,
                leaf: Callable[[Any], Any] | None = None) -> Any:
    """``value`` with ``fn`` applied to every tensor in it; other leaves pass through
    ``leaf`` (unchanged by default)."""
    return map_tensors_with_path(lambda _, tensor: fn(tensor), value,
                                 leaf=(lambda _, other: leaf(other)) if leaf else None)


def map_tensors_with_path(fn: Callable[[Path, torch.Tensor], Any], value: Any, *,
                          leaf: Callable[[Path, Any], Any] | None = None,
                          path: Path = ()) -> Any:
    """As :func:`map_tensors`, ``fn(path, tensor)`` told where each tensor sits."""
    if isinstance(value, torch.Tensor):
        return fn(path, value)
    if isinstance(value, Mapping):
        return rebuild(value, ((k, map_tensors_with_path(fn, v, leaf=leaf, path=(*path, k)))
                               for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return rebuild(value, (map_tensors_with_path(fn, v, leaf=leaf, path=(*path, i))
                               for i, v in enumerate(value)))
    return leaf(path, value) if leaf is not None else value


def tensors(value: Any, *, attributes: bool = False) -> list[torch.Tensor]:
    """Every tensor in ``value``, in order. ``attributes``: also those held in the
    attributes of other objects (a model's output dataclass), never inside a module."""
    found: list[torch.Tensor] = []

    def visit(item: Any) -> None:
        if isinstance(item, torch.Tensor):
            found.append(item)
        elif isinstance(item, Mapping):
            for v in item.values():
                visit(v)
        elif isinstance(item, (list, tuple)):
            for v in item:
                visit(v)
        elif attributes and hasattr(item, "__dict__") and not isinstance(item, torch.nn.Module):
            for v in vars(item).values():
                visit(v)

    visit(value)
    return found


def concat(parts: list[Any]) -> Any:
    """Batches of the same structure joined along their first dimension (a TypeError
    naming the leaf that cannot be joined)."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)
    if isinstance(first, Mapping):
        return rebuild(first, ((k, concat([p[k] for p in parts])) for k in first))
    if isinstance(first, (list, tuple)):
        return rebuild(first, (concat(list(fields)) for fields in zip(*parts)))
    raise TypeError(f"a batch holding a {type(first).__name__} cannot be joined")


def slice_rows(value: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of every tensor in a batch (other leaves unchanged)."""
    return map_tensors(lambda tensor: tensor[start:stop], value)
