"""The precision layer: every difference between precision modes lives here.

:class:`Precision` wraps autocast, the gradient guard (loss scaler or non-finite skip),
master weights and fp32 islands behind one step protocol::

    prec = Precision("16-mixed")
    model, optimizer = prec.setup(model, optimizer)
    with prec.autocast():
        loss = criterion(model(x), y)
    prec.backward(loss)                              # scaled for fp16
    prec.clip_grad_norm_(model.parameters(), 1.0)   # unscales first
    stepped = prec.step(optimizer)                   # False when skipped (inf/NaN)

Several models and optimizers (a GAN): ``setup`` each pair, ``backward(loss_i, loss_id=i)``,
``step(opt_i)`` (each skips alone), ``update()`` once per iteration. ``step_async`` leaves
the skip flag on the device to be read a step later (no steady-state wait for the GPU).
The mode is decided once (:mod:`.resolve`); what devices support is :mod:`.hardware`.

The face is lazy (:mod:`amptrain.common.lazy`): the command line's parser reads
:mod:`.options` (the settings' one declaration, torch-free) without importing torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..common.choices import PRECISION_ALIASES, PRECISION_NAMES, WEIGHT_UPDATES, canonical_name
from ..common.lazy import lazy_exports
from .options import PrecisionConfig, ScalerSettings

if TYPE_CHECKING:
    from .core import Precision
    from .modes import MODES, ModeSpec, as_given, label
    from .outcome import NonFiniteHalt, StepOutcome
    from .resolve import ResolvedPrecision, resolve_precision
    from .weight_update import WeightUpdate

_WHERE = {
    ".core": ("Precision",),
    ".modes": ("MODES", "ModeSpec", "as_given", "label"),
    ".outcome": ("NonFiniteHalt", "StepOutcome"),
    ".resolve": ("ResolvedPrecision", "resolve_precision"),
    ".weight_update": ("WeightUpdate",),
}
__getattr__ = lazy_exports(__name__, {name: module for module, names in _WHERE.items()
                                      for name in names})

__all__ = ["Precision", "PrecisionConfig", "ScalerSettings", "ResolvedPrecision",
           "resolve_precision", "StepOutcome", "NonFiniteHalt", "MODES", "ModeSpec",
           "PRECISION_NAMES", "PRECISION_ALIASES", "canonical_name", "as_given", "label",
           "WEIGHT_UPDATES", "WeightUpdate"]
