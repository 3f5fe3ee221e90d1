"""The sections every amptrain checkpoint holds, checked when one is read.

A file can pass the format check (it is ours, of a known version) and still lack a
section or hold one of the wrong type: edited by hand, written by a tool that copied only
part of it, or crafted. Every command that reads a checkpoint gets one line naming the
file and the section instead of a ``KeyError`` deep in a loader.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import UserError

#: section -> the types it may have; ``None`` among them: the section may be None.
REQUIRED: dict[str, tuple[type | None, ...]] = {
    "model": (dict,), "step": (int,), "epoch": (int,), "window_in_epoch": (int,),
    "config": (dict,),
}
#: Sections older checkpoints may lack; when present they must have these types.
OPTIONAL: dict[str, tuple[type | None, ...]] = {
    "optimizer": (dict,), "scheduler": (dict, None), "precision": (dict,), "task": (dict,),
    "run": (dict,), "rng": (dict,), "log_window": (dict, None), "precision_name": (str,),
    "steps_per_epoch": (int, None),
}


def _type_name(kinds: tuple[type | None, ...]) -> str:
    return " or ".join("None" if k is None else k.__name__ for k in kinds)


def check_sections(state: dict[str, Any], path: str | Path) -> None:
    """Raise :class:`UserError` naming ``path`` and the section that is missing or of the
    wrong type; the model's weights must all be tensors."""
    for name, kinds in (*REQUIRED.items(), *OPTIONAL.items()):
        if name not in state:
            if name in REQUIRED:
                raise UserError(f"checkpoint {path}: its '{name}' section is missing (a "
                                f"damaged or hand-edited file); use a checkpoint that "
                                f"amptrain wrote")
            continue
        value = state[name]
        ok = any(value is None if k is None else
                 isinstance(value, k) and not (k is int and isinstance(value, bool))
                 for k in kinds)
        if not ok:
            raise UserError(f"checkpoint {path}: its '{name}' section is a "
                            f"{type(value).__name__}, not a {_type_name(kinds)} (a damaged "
                            f"or hand-edited file)")
    for key, value in state["model"].items():
        if not isinstance(value, torch.Tensor):
            raise UserError(f"checkpoint {path}: model entry '{key}' is a "
                            f"{type(value).__name__}, not a tensor (a damaged or hand-edited "
                            f"file)")


def nonfinite_weights(weights: dict[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors in ``weights`` holding NaN or infinity."""
    return [name for name, value in weights.items()
            if value.is_floating_point() and not bool(torch.isfinite(value).all())]


def check_finite_weights(weights: dict[str, torch.Tensor], path: str | Path,
                         option: str = "--checkpoint") -> None:
    """Refuse weights that hold NaN or infinity: whatever they compute is garbage."""
    bad = nonfinite_weights(weights)
    if bad:
        raise UserError(f"{option} {path} holds non-finite weights ({len(bad)} of "
                        f"{len(weights)} tensors, e.g. '{bad[0]}'): the run diverged before "
                        f"this checkpoint; use an earlier one (OUT/checkpoints/step-N.pt)")
