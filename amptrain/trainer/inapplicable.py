"""Options that do nothing in the chosen setting: one warning line naming each.

The rule for every option (docs/hostile-input.md): an option that cannot
change anything in the chosen setting is accepted with one warning line naming it (the
run is what it would be without it); an option whose absence would make the run train
something other than what was asked (``--loss huber`` on a classifier, ``--seq-len``
without text) is refused with exit 2 where it is validated. Nothing is silently ignored.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TypeVar

from ..config import TrainConfig
from ..common.errors import flag
from ..common.options import without_given
from ..precision.lowbit_settings import settings_for
from ..precision.modes import ModeSpec
from ..precision.options import SCALER_SETTINGS, PrecisionConfig

log = logging.getLogger("amptrain")

#: The dynamic loss scaler's options (its settings, and amptrain's floor): they only act
#: in modes that scale the loss.
SCALER_OPTIONS = (*SCALER_SETTINGS, "min_scale")
#: What builds amptrain's own optimizer and its learning rate: a caller's own optimizer
#: (``fit(optimizer=...)``) keeps its own (--momentum is said on its own line).
OPTIMIZER_OPTIONS = ("optimizer", "lr", "weight_decay", "lr_scaling", "base_batch_size")


def unread_by(loss_scaling: bool) -> tuple[str, ...]:
    """The options a mode never reads: without a loss scaler, the scaler's
    (:data:`SCALER_OPTIONS`); with one, ``max_bad_steps`` (the stop of a run without one)."""
    return ("max_bad_steps",) if loss_scaling else SCALER_OPTIONS


Config = TypeVar("Config", bound=TrainConfig)


def for_mode(config: Config, spec: ModeSpec) -> Config:
    """``config`` for one run in mode ``spec`` inside a workflow that trains several
    precisions with one set of options (compare's rows, a plan's runs, diagnose's runs):
    the low-bit settings the mode does not read (:func:`~..precision.lowbit_settings.settings_for`)
    and the options it never reads (:func:`unread_by`) at their defaults, the latter no
    longer counted as given. So the run's saved config claims only what it ran with, and
    the run does not warn that an option does nothing in it: the workflow warns once
    about an option that none of its runs reads."""
    unread = unread_by(spec.loss_scaling)
    defaults = PrecisionConfig()
    run = config.with_options(**settings_for(spec, config.precision),
                              **{name: getattr(defaults, name) for name in unread})
    return without_given(run, unread)


def unread_note(names: list[str], where: str, loss_scaling: bool, *,
                rows: bool = False) -> str:
    """The sentence for options ``names`` (all of :func:`unread_by`'s for ``loss_scaling``)
    doing nothing in ``where``: one precision (``--precision X``), or with ``rows`` each of
    a workflow's runs (``the rows of --precisions (X, Y)``)."""
    listed = ", ".join(flag(name) for name in names)
    if loss_scaling:
        return (f"{listed} stops a run without a loss scaler; "
                f"{f'each of {where} has one' if rows else f'{where} has one'}, whose floor "
                f"{flag('min_scale')} stops it instead")
    return (f"{listed} {'sets' if len(names) == 1 else 'set'} the loss scaler, which "
            f"{f'none of {where} uses' if rows else f'{where} does not use'} "
            f"(only fp16 modes scale the loss)")


def inapplicable(config: TrainConfig, given: Iterable[str], *, loss_scaling: bool,
                 precision: str, own_optimizer: bool) -> list[str]:
    """One sentence per given option that does nothing here (empty when all apply)."""
    given = set(given)
    notes = []
    optimizer = config.schedule.optimizer
    if "momentum" in given and (own_optimizer or optimizer != "sgd"):
        whose = "your own optimizer" if own_optimizer else f"{flag('optimizer')} {optimizer}"
        notes.append(f"{flag('momentum')} applies to {flag('optimizer')} sgd only; "
                     f"{whose} ignores it")
    theirs = [name for name in OPTIMIZER_OPTIONS if name in given]
    if own_optimizer and theirs:
        names = ", ".join(flag(name) for name in theirs)
        notes.append(f"{names} {'builds' if len(theirs) == 1 else 'build'} amptrain's "
                     f"optimizer; your own optimizer keeps its own settings")
    if "base_batch_size" in given and config.schedule.lr_scaling == "none" \
            and not own_optimizer:
        notes.append(f"{flag('base_batch_size')} is the batch size {flag('lr')} was tuned "
                     f"for, read by {flag('lr_scaling')} linear or sqrt; without "
                     f"{flag('lr_scaling')} the learning rate is {flag('lr')} as given")
    unread = [name for name in unread_by(loss_scaling) if name in given]
    if unread:
        notes.append(unread_note(unread, f"{flag('precision')} {precision}", loss_scaling))
    return notes


def warn_inapplicable(config: TrainConfig, given: Iterable[str], *, loss_scaling: bool,
                      precision: str, own_optimizer: bool) -> None:
    """Log :func:`inapplicable`'s sentences, one warning line each."""
    for note in inapplicable(config, given, loss_scaling=loss_scaling, precision=precision,
                             own_optimizer=own_optimizer):
        log.warning("warning: %s", note)
