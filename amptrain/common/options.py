"""The option machinery: one declaration per option, from which the command-line flag, the
YAML key and the library keyword are generated, each under the same flat name.

Config classes are dataclasses of *sections* (themselves dataclasses of options), nested by
concern as torchtitan's are. Every option keeps a flat name that is unique across the
sections (``micro_batch_size``, ``lr``, ...): users write flat names, code reads
``config.batching.micro_batch_size``. :func:`build_config` turns flat values into a
validated config; :func:`to_dict` turns it back (config.yaml, checkpoints).
"""
from __future__ import annotations

import copy
import dataclasses
import numbers
import difflib
import math
import os
from dataclasses import field
from typing import Any, Iterable, Iterator


from .errors import UserError, bounded, flag


def option(default: Any = None, help: str = "", *, choices: Iterable[str] | None = None,
           kind: type | None = None, group: str = "training", flat: str | None = None,
           open_choices: bool = False, comma_list: bool = False,
           integer_or_word: bool = False) -> Any:
    """A dataclass field with what the CLI needs (help text, choices, value type).

    ``flat``: the user-facing name when it differs from the field's own (``precision``
    for ``PrecisionConfig.name``). ``open_choices``: ``choices`` are listed in ``--help``
    and other spellings (aliases) are taken too: the section's ``__post_init__`` checks
    them. ``comma_list``: a YAML list is taken as its comma-joined string.
    ``integer_or_word``: an integer is kept as one (``--micro-batch-size 16`` or ``auto``).
    """
    metadata = {"help": help, "choices": tuple(choices) if choices else None, "kind": kind,
                "group": group, "flat": flat, "open_choices": open_choices,
                "comma_list": comma_list, "integer_or_word": integer_or_word}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def section(cls: type) -> Any:
    """A dataclass field holding a section (built from its options' defaults)."""
    return field(default_factory=cls, metadata={"section": True})


#: The attribute a config carries the options its user gave in (see :func:`given_options`).
_GIVEN = "_given_options"


def _carrying(config: Any, given: Iterable[str]) -> Any:
    # An attribute beside the fields, not a field: it is no option (no flag, no YAML key,
    # no part of to_dict or of equality); with_options carries it to each copy.
    object.__setattr__(config, _GIVEN, frozenset(given))
    return config


def cli_flag(name: str) -> str:
    """The command-line spelling of an option: ``micro_batch_size`` -> ``--micro-batch-size``.

    For building command lines; error messages use :func:`~amptrain.common.errors.flag`, which
    names the keyword instead when the caller is the library.
    """
    return "--" + name.replace("_", "-")


# ------------------------------------------------------------------ the flat view
def _is_section(f: dataclasses.Field) -> bool:
    return bool(f.metadata.get("section"))


def flat_name(f: dataclasses.Field) -> str:
    """The user-facing name of an option field."""
    return f.metadata.get("flat") or f.name


def _leaves(cls: type, path: tuple[str, ...] = ()) -> Iterator[tuple[str, tuple[str, ...],
                                                                     dataclasses.Field]]:
    for f in dataclasses.fields(cls):
        if _is_section(f):
            section_cls = f.default_factory
            yield from _leaves(section_cls, (*path, f.name))  # type: ignore[arg-type]
        else:
            yield flat_name(f), (*path, f.name), f


def config_fields(cls: type) -> dict[str, dataclasses.Field]:
    """Every option of a config class by flat name (sections flattened), in field order."""
    return {name: f for name, _, f in _leaves(cls)}


def option_paths(cls: type) -> dict[str, tuple[str, ...]]:
    """flat name -> attribute path (``("batching", "micro_batch_size")``)."""
    return {name: path for name, path, _ in _leaves(cls)}


def build_config(cls: type, values: dict[str, Any], source: str = "option") -> Any:
    """A validated ``cls`` from flat values, rejecting unknown names by name.

    Every value is first converted as its flag would convert it (:func:`coerce`); each
    section validates itself when it is built. The config carries ``values``' names as
    the options its user gave (:func:`given_options`).
    """
    known = config_fields(cls)
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise UserError(_unknown_message(cls, unknown[0], source, known))
    typed = {name: coerce(known[name], value) for name, value in values.items()}
    return _carrying(_build(cls, typed), values)


def _build(cls: type, flat: dict[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if _is_section(f):
            kwargs[f.name] = _build(f.default_factory, flat)  # type: ignore[arg-type]
        elif flat_name(f) in flat:
            kwargs[f.name] = flat[flat_name(f)]
    return cls(**kwargs)


def to_dict(config: Any) -> dict[str, Any]:
    """The flat options of a config (for config.yaml, checkpoints and Trainer keywords)."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if _is_section(f):
            values.update(to_dict(value))
        else:
            values[flat_name(f)] = list(value) if isinstance(value, list) else value
    return values


def with_options(config: Any, **changes: Any) -> Any:
    """A copy of ``config`` with some options (flat names) changed, validated anew.

    Typed, without a round trip through the flat dict: each value is converted as its
    flag would convert it (:func:`coerce`), the sections it lands in are rebuilt by
    :func:`dataclasses.replace` (so they and the config validate again), the other
    sections are kept as they are. The options the user gave are kept as they were:
    a change made by amptrain (a default ``--out``) is not the user's choice
    (:func:`with_given_options` is).
    """
    if not changes:
        return config
    cls = type(config)
    known = config_fields(cls)
    unknown = sorted(set(changes) - set(known))
    if unknown:
        raise UserError(_unknown_message(cls, unknown[0], "option", known))
    paths = option_paths(cls)
    return _carrying(_replace(config, {paths[name]: coerce(known[name], value)
                                       for name, value in changes.items()}),
                     given_options(config))


def _replace(obj: Any, changes: dict[tuple[str, ...], Any]) -> Any:
    direct: dict[str, Any] = {path[0]: value for path, value in changes.items()
                              if len(path) == 1}
    nested: dict[str, dict[tuple[str, ...], Any]] = {}
    for path, value in changes.items():
        if len(path) > 1:
            nested.setdefault(path[0], {})[path[1:]] = value
    for name, inner in nested.items():
        direct[name] = _replace(getattr(obj, name), inner)
    return dataclasses.replace(obj, **direct)


def given_options(config: Any) -> frozenset[str]:
    """The flat names of the options ``config``'s user gave: the keys it was built from
    (:func:`build_config`: flags typed and ``--config`` keys, met in
    ``commands/common.merged_values``) and a library call's keywords
    (:func:`with_given_options`); never guessed from the values. Empty for a config built
    from its sections by hand."""
    return getattr(config, _GIVEN, frozenset())


def with_given_options(config: Any, **options: Any) -> Any:
    """:func:`with_options` for options a user gave (a library call's keywords): changed,
    and added to the options the config carries as given."""
    return _carrying(with_options(config, **options), given_options(config) | set(options))


def without_given(config: Any, names: Iterable[str]) -> Any:
    """A copy of ``config`` that no longer counts ``names`` among the options its user
    gave (a workflow that runs them at their defaults where they do not apply, as
    compare's rows: see ``compare/rows.py``)."""
    return _carrying(copy.copy(config), given_options(config) - set(names))


#: The older name of :func:`with_options`.
replace_options = with_options


# ------------------------------------------------------------------ types
def shown(value: Any) -> str:
    """A value as an error repeats it: its repr, bounded (see :func:`errors.bounded`)."""
    return bounded(repr(value))


_A_KIND = {int: "an integer", float: "a number"}


def coerce(field_: dataclasses.Field, value: Any) -> Any:
    """``value`` as option ``field_`` takes it, converted as its flag would convert it.

    YAML 1.1 reads ``1e-3`` as a string and a library caller may pass ``"0.1"``: a
    number written as text is taken; a value of the wrong kind is a :class:`UserError`
    naming the option.
    """
    name = flat_name(field_)
    default = field_.default if field_.default is not dataclasses.MISSING else None
    if value is None:
        if default is None:
            return None
        raise UserError(f"{flag(name)} needs a value (default: {default})")
    if field_.default is dataclasses.MISSING:  # list options (--keep-fp32 PATTERN ...)
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
            raise UserError(f"{flag(name)} takes a pattern or a list of patterns "
                            f"(got {shown(value)})")
        return [_without_nul(name, item) for item in items]
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise UserError(f"{flag(name)} is true or false (got {shown(value)})")
    kind = field_.metadata.get("kind") or type(default)
    if kind is str:
        return _coerce_text(field_, name, value)
    if kind in (int, float):
        return _coerce_number(name, kind, value)
    return value


def _coerce_text(field_: dataclasses.Field, name: str, value: Any) -> Any:
    value = library_number(value)
    if field_.metadata.get("integer_or_word") and not isinstance(value, bool):
        # micro_batch_size: an integer, or the word auto
        if isinstance(value, int):
            return value
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
    if field_.metadata.get("comma_list") and isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise UserError(f"{flag(name)} must be a string (got {type(value).__name__} "
                        f"{shown(value)})")
    return _without_nul(name, value)


def _without_nul(name: str, value: str) -> str:
    """``value``, refused when it holds a NUL byte: no path or name holds one, and the
    operating system refuses it deep inside whatever opens it (a ValueError traceback)."""
    if "\0" in value:
        raise UserError(f"{flag(name)} holds a NUL byte (got {shown(value)}): no file "
                        f"name or option value can hold one")
    return value


def library_number(value: Any) -> Any:
    """A library caller's number as Python's own: numpy's (and any other registered
    ``numbers``) integers and reals become ``int`` / ``float``, so ``np.int64(3)`` is
    taken wherever ``3`` is; anything else is returned unchanged."""
    if isinstance(value, bool) or isinstance(value, (int, float, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


def _coerce_number(name: str, kind: type, value: Any) -> Any:
    value = library_number(value)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise UserError(f"{flag(name)} must be {_A_KIND[kind]} (got {shown(value)})")
    try:
        number = kind(value.strip()) if isinstance(value, str) else value
    except ValueError:
        raise UserError(f"{flag(name)} must be {_A_KIND[kind]} (got {shown(value)})") from None
    if kind is int and isinstance(number, float):
        if not number.is_integer():
            raise UserError(f"{flag(name)} must be {_A_KIND[kind]} (got {shown(value)})")
        number = int(number)
    return float(number) if kind is float else number


def _unknown_message(cls: type, name: str, source: str, known: dict[str, Any]) -> str:
    name = bounded(name, 60)  # a YAML key may be any text
    close = difflib.get_close_matches(name, list(known), n=1)
    if flag(name).startswith("--"):
        hint = f"; did you mean {flag(close[0])}?" if close else ""
        command = "train " if cls.__name__ == "RunConfig" else ""
        return f"unknown {source} {flag(name)}{hint} (see `amptrain {command}--help`)"
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"unknown keyword {name!r} for Trainer ({cls.__name__}){hint}"


# ------------------------------------------------------------------ checks
def require_positive(section: Any, *names: str, optional: bool = False) -> None:
    """Each named option is an integer >= 1 (or None when ``optional``)."""
    for name in names:
        value = getattr(section, name)
        if value is None and optional:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UserError(f"{flag(name)} must be an integer >= 1 (got {shown(value)})")


def require_non_negative(section: Any, *names: str) -> None:
    """Each named option is a finite number >= 0 (NaN compares false with everything, so
    ``value < 0`` alone let ``--weight-decay nan`` through: a run that diverged)."""
    for name in names:
        value = getattr(section, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) \
                or not math.isfinite(value) or value < 0:
            raise UserError(f"{flag(name)} must be >= 0 (got {shown(value)})")


def require_choices(section: Any) -> None:
    """Options with closed ``choices`` hold one of them."""
    for f in dataclasses.fields(section):
        choices = f.metadata.get("choices")
        value = getattr(section, f.name)
        if choices and not f.metadata.get("open_choices") and value is not None \
                and value not in choices:
            raise UserError(f"{flag(flat_name(f))} must be one of {', '.join(choices)} "
                            f"(got {shown(value)})")


def is_default(cls: type, name: str, value: Any) -> bool:
    """True when option ``name`` of ``cls`` holds its default ``value``."""
    f = config_fields(cls).get(name)
    if f is None:
        return False
    default = f.default if f.default is not dataclasses.MISSING \
        else f.default_factory()  # type: ignore[operator]
    return bool(value == default and type(value) is type(default))
