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

from ..config import TrainConfig
from ..common.errors import flag
from ..precision.options import SCALER_SETTINGS

log = logging.getLogger("amptrain")

#: The dynamic loss scaler's options (its settings, and amptrain's floor): they only act
#: in modes that scale the loss.
SCALER_OPTIONS = (*SCALER_SETTINGS, "min_scale")
#: What builds amptrain's own optimizer and its learning rate: a caller's own optimizer
#: (``fit(optimizer=...)``) keeps its own (--momentum is said on its own line).
OPTIMIZER_OPTIONS = ("optimizer", "lr", "weight_decay", "lr_scaling", "base_batch_size")


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
    if "max_bad_steps" in given and loss_scaling:
        notes.append(f"{flag('max_bad_steps')} stops a run without a loss scaler; "
                     f"{flag('precision')} {precision} has one, whose floor "
                     f"{flag('min_scale')} stops it instead")
    scaler = [name for name in SCALER_OPTIONS if name in given]
    if scaler and not loss_scaling:
        names = ", ".join(flag(name) for name in scaler)
        notes.append(f"{names} {'sets' if len(scaler) == 1 else 'set'} the loss scaler, which "
                     f"{flag('precision')} {precision} does not use (only fp16 modes scale "
                     f"the loss)")
    return notes


def warn_inapplicable(config: TrainConfig, given: Iterable[str], *, loss_scaling: bool,
                      precision: str, own_optimizer: bool) -> None:
    """Log :func:`inapplicable`'s sentences, one warning line each."""
    for note in inapplicable(config, given, loss_scaling=loss_scaling, precision=precision,
                             own_optimizer=own_optimizer):
        log.warning("warning: %s", note)
