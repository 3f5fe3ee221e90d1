"""What a :class:`~amptrain.precision.core.Precision` reports about its state, read-only:
its loss scales, each optimizer's skipped steps and weight policy, and the buffers of the
``kahan``/``stochastic`` weight-update rules (the memory ladder counts them). The base
class of ``Precision``, which does the work (as :mod:`amptrain.trainer.views` is the
Trainer's)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .loss_scales import LossScales
    from .options import PrecisionConfig, ScalerSettings
    from .pairs import Pairs
    from .policies import WeightPolicy
    from .weight_update import WeightUpdate


def _setting(name: str, doc: str) -> property:
    """A read-only view of the :class:`~amptrain.precision.options.PrecisionConfig`
    setting ``name``."""
    return property(lambda self: getattr(self.config, name), doc=doc)


class PrecisionViews:
    """Read-only views of a precision's settings, loss scales and model/optimizer pairs."""

    config: PrecisionConfig
    _scales: LossScales
    _pairs: Pairs

    # ------------------------------------------- the settings (PrecisionConfig's, by name)
    @property
    def scaler_settings(self) -> ScalerSettings:
        """The loss scaler's four settings (``torch.amp.GradScaler``'s)."""
        return self.config.scaler_settings

    min_scale = _setting("min_scale", "The loss-scale floor: reaching it stops training.")
    keep_fp32 = _setting("keep_fp32", "Module-name globs run in fp32 inside autocast.")
    max_bad_steps = _setting("max_bad_steps",
                             "Consecutive non-finite steps tolerated without a scaler.")
    weight_update_rule = _setting("weight_update", "plain, kahan or stochastic (X-true modes).")
    lowbit_bf16_last = _setting("lowbit_bf16_last",
                                "Low-bit modes: the last N eligible Linears kept in bf16.")
    mx_scale = _setting("mx_scale", "The MX modes' e8m0 scale rule: floor or rceil.")
    nvfp4_without = _setting("nvfp4_without",
                             "nvfp4 without one part of its recipe (an ablation), or none.")

    # ------------------------------------------- loss scales, skips, weight rules

    def skipped_steps_of(self, optimizer: torch.optim.Optimizer) -> int:
        """Skipped (confirmed) steps of one optimizer (``skipped_steps``: of all)."""
        return self._pairs.of(optimizer).skips.skipped

    @property
    def loss_scale(self) -> float | None:
        """The current (first) loss scale (reads the device), or None without a scaler."""
        scale = self._scales.scale_tensor
        return None if scale is None else float(scale.item())

    @property
    def loss_scale_tensor(self) -> torch.Tensor | None:
        """The current (first) loss scale on the device (no sync), or None without a scaler."""
        return self._scales.scale_tensor

    def loss_scales(self) -> dict[int, float]:
        """Every loss scale by loss id (``{0: scale}`` when shared; ``{}`` without scaling)."""
        return self._scales.scales()

    def policy_of(self, optimizer: torch.optim.Optimizer | None = None) -> WeightPolicy:
        """How ``optimizer``'s steps reach its model's weights (:mod:`.policies`)."""
        return self._pairs.of(optimizer).policy

    @property
    def weight_update(self) -> WeightUpdate | None:
        """The first pair's ``kahan``/``stochastic`` rule (None without one)."""
        return self._pairs[0].policy.rule if len(self._pairs) else None

    def has_weight_rule(self) -> bool:
        """True when a ``kahan``/``stochastic`` rule acts on some pair's updates."""
        return any(pair.policy.rule is not None for pair in self._pairs)

    def weight_rule_buffers(self) -> list[torch.Tensor]:
        """What the pairs' weight policies keep between steps (kahan's compensations)."""
        return [b for pair in self._pairs for b in pair.policy.buffers()]

    def weight_rule_nbytes(self) -> int:  # what compare's memory ladder counts
        return sum(b.numel() * b.element_size() for b in self.weight_rule_buffers())
