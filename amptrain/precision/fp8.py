"""``--precision fp8``: torchao's float8 Linear layers, bf16 autocast for everything else.

The model keeps fp32 weights (and fp32 checkpoints). :func:`convert_linears` swaps the
eligible ``nn.Linear`` modules for torchao's ``Float8Linear``, whose matmuls cast the
input, the weight and the output gradient to fp8 with dynamic per-tensor scales (e4m3
forward, e5m2 for gradients) and run on fp8 Tensor Cores; the rest of the model runs
under bf16 autocast (the mode's ``compute_dtype``).

Eligible layers (see :func:`plan_float8`):

* plain ``nn.Linear`` -- not subclasses such as ``MultiheadAttention.out_proj``, whose
  weight the attention function reads directly instead of calling its forward;
* ``in_features`` and ``out_features`` multiples of 16, the fp8 GEMM's alignment;
* outside ``--keep-fp32`` islands;
* by default not the model's first or last Linear: the input projection and the
  classifier are the most precision-sensitive layers, and usually too small to gain.

``Float8Linear`` keeps the module's own weight and bias Parameters: an optimizer built
before the conversion still updates them, and ``state_dict`` keys are unchanged, so
checkpoints are plain fp32 tensors under the usual names and load without torchao.

torchao is imported only here and only when a model is converted; the hardware check
(:func:`~amptrain.precision.hardware.support.fp8_native`) needs no torchao, so ``env``
and the error message work on any machine. Off fp8 hardware the same plan drives the
emulated formats of :mod:`.lowbit`.
"""
from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass, field
from typing import Iterable

from torch import nn

from ..common.errors import UserError, flag
from ..common.quiet import quiet_torchao

log = logging.getLogger("amptrain")

#: Why a layer ``--keep-fp32`` names is skipped (it stays in fp32, not bf16).
KEPT_FP32 = "--keep-fp32"

#: torch._scaled_mm needs both matrix dimensions of the weight divisible by 16.
FP8_DIM_MULTIPLE = 16


@dataclass
class Float8Selection:
    """Which Linear layers become float8 and why the others do not."""

    convert: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)   # name -> reason

    def reasons(self, fp32: bool | None = None) -> str:
        """Why the skipped layers were skipped: ``reason: names; ...`` (``fp32``: only the
        layers ``--keep-fp32`` keeps in fp32, or only the others, kept in bf16)."""
        reasons: dict[str, list[str]] = {}
        for name, reason in self.skipped.items():
            if fp32 is None or (reason == KEPT_FP32) == fp32:
                reasons.setdefault(reason, []).append(name)
        return "; ".join(f"{reason}: {_names(names)}" for reason, names in reasons.items())

    def summary(self, fmt: str = "fp8", emulated: bool = False) -> str:
        """One line for the run's log (``fmt``: the low-bit format's name)."""
        total = len(self.convert) + len(self.skipped)
        # --keep-fp32 keeps its layers in fp32; every other skipped layer runs in bf16.
        kept = [f"kept in {dtype} - {reasons}" for dtype, reasons in
                (("bf16", self.reasons(fp32=False)), ("fp32", self.reasons(fp32=True)))
                if reasons]
        how = " (emulated)" if emulated else ""
        line = f"{fmt}: {len(self.convert)} of {total} Linear layers run in {fmt}{how}"
        if kept:
            line += f" ({'; '.join(kept)})"
        if not self.convert:
            line += "; nothing is eligible, so this trains like bf16-mixed"
        return line


def _names(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _inside(name: str, roots: Iterable[str]) -> bool:
    return any(name == root or name.startswith(root + ".") for root in roots)


def plan_float8(model: nn.Module, *, islands: Iterable[str] = (),
                skip_first_last: bool = True, skip: Iterable[str] = (),
                dim_multiple: int = FP8_DIM_MULTIPLE) -> Float8Selection:
    """Decide which ``nn.Linear`` modules of ``model`` to convert (no torchao needed).

    ``islands``: names of keep-fp32 modules (their subtrees stay out); ``skip``: extra
    glob patterns of module names to keep out. "First" and "last" are in module order.
    ``dim_multiple``: what both Linear dimensions must be multiples of (MX formats: 32).
    """
    islands, patterns = list(islands), list(skip)
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    edges = {linears[0][0], linears[-1][0]} if skip_first_last and linears else set()
    plan = Float8Selection()
    for name, module in linears:
        if type(module).__name__ == "Float8Linear":
            plan.skipped[name] = "already float8"
        elif type(module) is not nn.Linear:
            plan.skipped[name] = f"{type(module).__name__} (weight used outside forward)"
        elif _inside(name, islands):
            plan.skipped[name] = KEPT_FP32
        elif any(fnmatch.fnmatchcase(name, p) for p in patterns):
            plan.skipped[name] = "skipped by pattern"
        elif name in edges:
            plan.skipped[name] = "first/last Linear"
        elif module.in_features % dim_multiple or module.out_features % dim_multiple:
            plan.skipped[name] = f"dims not multiples of {dim_multiple}"
        else:
            plan.convert.append(name)
    return plan


def convert_linears(model: nn.Module, plan: Float8Selection, recipe: str = "tensorwise"
                    ) -> Float8Selection:
    """Swap the planned Linear layers for torchao ``Float8Linear`` in place, scaled by
    torchao's ``recipe`` (``tensorwise``, its default, or ``rowwise``).

    Parameter objects and their names are kept (checked here: a torchao that renamed or
    replaced them would break optimizers built on the model and fp32 checkpoints).
    """
    if not plan.convert:
        return plan
    try:
        with quiet_torchao():
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as exc:
        raise UserError(f"{flag('precision')} fp8 needs torchao with float8 training "
                        f"(torchao.float8): {exc}; pip install -U torchao") from None
    before = {name: p for name, p in model.named_parameters()}
    wanted = set(plan.convert)
    convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
                               module_filter_fn=lambda module, fqn: fqn in wanted)
    after = {name: p for name, p in model.named_parameters()}
    if after.keys() != before.keys() or any(after[n] is not before[n] for n in before):
        raise RuntimeError("torchao's float8 conversion replaced or renamed parameters; "
                           "amptrain needs them kept (optimizer state, fp32 checkpoints)")
    return plan
