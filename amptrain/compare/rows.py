"""Each row's run config, made from the study's config, and the warnings about settings
that no row reads.

A compare (or a plan's search) trains several precisions with one set of options. A row
takes the options its precision reads: the low-bit settings (``--mx-scale``, ...) where its
mode has those formats (the precision layer knows which: :mod:`..precision.lowbit_settings`),
the loss scaler's (``--init-scale``, ...) where its mode scales the loss, ``--max-bad-steps``
where it does not (:func:`..trainer.inapplicable.unread_by`). Elsewhere the row runs them at
their defaults and does not count them as given, so its saved config claims only what it
ran with and no row warns that an option does nothing in it; the study warns once about an
option that no row reads (:func:`warn_unread`). A row's displayed name adds the low-bit
settings it runs away from their defaults (:func:`row_names`: ``mxfp4 rceil``); its label,
by which rows are matched (``--baseline``, compare.json), stays the mode's.
"""
from __future__ import annotations

from typing import Any

import torch

from ..common.errors import warn
from ..common.options import given_options
from ..config import RunConfig
from ..precision.hardware.devices import resolve_device
from ..precision.lowbit_settings import settings_shown, unread_settings, warn_unread_settings
from ..precision.modes import ModeSpec
from ..precision.resolve import resolve_precision
from ..trainer.inapplicable import for_mode, unread_by, unread_note
from .options import row_options


def _row_spec(label: str, device: torch.device) -> ModeSpec:
    """The mode of row ``label``."""
    return resolve_precision(row_options(label)["precision"], device).spec


def row_config(label: str, config: RunConfig, **changes: Any) -> RunConfig:
    """Row ``label``'s run config: its precision and options (:func:`.options.row_options`)
    and ``changes`` (``seed``, ``out``...), with only the options its precision reads
    (:func:`..trainer.inapplicable.for_mode`; see the module docstring)."""
    return for_mode(config.with_options(**row_options(label), **changes),
                    _row_spec(label, resolve_device(config.device)))


def row_names(config: RunConfig, labels: list[str]) -> dict[str, str]:
    """Row label -> its displayed name, for the rows whose runs read a low-bit setting that
    ``config`` gives away from its default (``mxfp4`` -> ``mxfp4 rceil``, ``nvfp4`` ->
    ``nvfp4 without rht``): two studies with different settings show different names.
    The other rows are shown by their labels (not in the result)."""
    device = resolve_device(config.device)
    names = {label: " ".join([label, *settings_shown(_row_spec(label, device),
                                                     config.precision)])
             for label in labels}
    return {label: name for label, name in names.items() if name != label}


def warn_unread(config: RunConfig, labels: list[str], where: str) -> None:
    """One warning per option of ``config`` that no row of ``labels`` reads (``where``: how
    the rows were asked for, e.g. ``--precisions``): a low-bit setting away from its
    default, a loss scaler's option given where no row scales the loss, ``--max-bad-steps``
    given where every row does."""
    device = resolve_device(config.device)
    specs = [_row_spec(label, device) for label in labels]
    warn_unread_settings(unread_settings(config.precision, specs),
                         f"any row of {where} ({', '.join(labels)})")
    warn_unread_scaler(config, specs, f"the rows of {where} ({', '.join(labels)})")


def warn_unread_scaler(config: RunConfig, specs: list[ModeSpec], rows: str) -> None:
    """One warning for the loss scaler's options given where none of the modes ``specs``
    scales the loss, one for ``--max-bad-steps`` where all of them do (``rows``: how to
    name the runs, a plural: ``the rows of --precisions (X, Y)``)."""
    given = given_options(config)
    for loss_scaling in (False, True):
        unread = [name for name in unread_by(loss_scaling) if name in given]
        if unread and all(spec.loss_scaling == loss_scaling for spec in specs):
            warn(unread_note(unread, rows, loss_scaling, rows=True))
