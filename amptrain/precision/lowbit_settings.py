"""Which low-bit settings (:data:`~.options.LOWBIT_SETTINGS`) a mode reads, and the warning
about one given where nothing reads it.

``--lowbit-bf16-last`` is read by every low-bit precision; ``--mx-scale`` by every mode with
an MX format in it (a precision plan with MX layers too); ``--nvfp4-without`` by the NVFP4
training recipe only (a plan's nvfp4 layers run the whole recipe, as
:func:`~.precision_plan.setup_plan` builds them). One run warns about a setting its
precision does not read (:func:`check_lowbit_options`). A workflow that trains several
precisions (compare's rows) gives each run only the settings its precision reads
(:func:`settings_for`, the others at their defaults, so a run's saved config claims only
what it ran with) and warns once about a setting that none of them reads
(:func:`unread_settings`, :func:`warn_unread_settings`); a row's name shows the settings
its run reads away from their defaults (:func:`settings_shown`: ``mxfp4 rceil``).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..common.errors import flag, warn
from .lowbit import ABLATED, RECIPES
from .modes import ModeSpec
from .options import LOWBIT_SETTINGS, PrecisionConfig, lowbit_defaults

#: What each setting does, for the warning that it does nothing where it was given.
_PURPOSE = {
    "lowbit_bf16_last": "it keeps Linear layers of a low-bit precision in bf16",
    "mx_scale": "it chooses the block scales of mxfp8 and mxfp4",
    "nvfp4_without": "it leaves a part of the nvfp4 training recipe out",
}

#: How each setting reads in a row's name at a value away from its default
#: (``nvfp4 without rht``, ``mxfp4 rceil``, ``fp8 bf16-last 2``).
_SHOWN = {"mx_scale": "{}", "nvfp4_without": "without {}", "lowbit_bf16_last": "bf16-last {}"}


def plan_settings_read(formats: Iterable[str]) -> frozenset[str]:
    """The low-bit settings a precision plan with layers in ``formats`` reads: ``mx_scale``
    where one of them is an MX format (a plan keeps no last layers in bf16 and runs nvfp4's
    whole recipe)."""
    mx = any(RECIPES[f].input.scaling == "mx" for f in formats if f in RECIPES)
    return frozenset({"mx_scale"} if mx else ())


def settings_read(spec: ModeSpec) -> frozenset[str]:
    """The low-bit settings mode ``spec`` reads (empty for a mode without low-bit layers)."""
    if spec.layer_formats:
        return plan_settings_read(fmt for _, fmt in spec.layer_formats)
    if not spec.lowbit:
        return frozenset()
    read = {"lowbit_bf16_last", *plan_settings_read([spec.lowbit])}
    if spec.lowbit == ABLATED:
        read.add("nvfp4_without")
    return frozenset(read)


def given_settings(config: PrecisionConfig) -> dict[str, Any]:
    """``config``'s low-bit settings that differ from their defaults, by flat name."""
    defaults = lowbit_defaults()
    return {name: getattr(config, name) for name in LOWBIT_SETTINGS
            if getattr(config, name) != defaults[name]}


def unread_of(config: PrecisionConfig, read: Iterable[str]) -> dict[str, Any]:
    """``config``'s low-bit settings away from their defaults that are not in ``read``."""
    read = frozenset(read)
    return {name: value for name, value in given_settings(config).items() if name not in read}


def unread_settings(config: PrecisionConfig, specs: Iterable[ModeSpec]) -> dict[str, Any]:
    """``config``'s low-bit settings away from their defaults that none of ``specs`` reads."""
    return unread_of(config, frozenset().union(*(settings_read(spec) for spec in specs)))


def settings_for(spec: ModeSpec, config: PrecisionConfig) -> dict[str, Any]:
    """The low-bit settings a run of ``spec`` takes from ``config``: as given where ``spec``
    reads them, at their defaults elsewhere (for ``with_options``)."""
    read = settings_read(spec)
    return {name: getattr(config, name) if name in read else default
            for name, default in lowbit_defaults().items()}


def settings_shown(spec: ModeSpec, config: PrecisionConfig) -> list[str]:
    """The words naming ``config``'s low-bit settings that ``spec`` reads and that differ
    from their defaults (``["without rht"]``; none for a mode that reads none): what sets a
    run of ``spec`` apart from another of the same mode in a study's row names."""
    read, given = settings_read(spec), given_settings(config)
    return [shown.format(given[name]) for name, shown in _SHOWN.items()   # the format first
            if name in read and name in given]


def unread_warning(name: str, value: Any, where: str) -> str:
    """The sentence for setting ``name`` at ``value`` doing nothing in ``where``."""
    return f"{flag(name)} {value} does nothing in {where}: {_PURPOSE[name]}"


def warn_unread_settings(unread: dict[str, Any], where: str) -> None:
    """One warning per setting of ``unread`` (name -> value, :func:`unread_of`), naming its
    flag and saying it does nothing in ``where``."""
    for name, value in unread.items():
        warn(unread_warning(name, value, where))


def check_lowbit_options(spec: ModeSpec, config: PrecisionConfig) -> None:
    """Warn (naming the flag) about each of ``config``'s low-bit settings that does nothing
    in ``spec``."""
    warn_unread_settings(unread_settings(config, [spec]), f"{flag('precision')} {spec.name}")
