"""``--precision plan:FILE``: a precision plan, one format per Linear layer.

A precision plan is a YAML mapping from module names to formats -- a low-bit recipe of
:data:`~.lowbit.RECIPES` (``fp8``, ``mxfp4``, ``nvfp4``, ...) or ``bf16`` -- so that one
model trains with fp8 here, mxfp4 there and bf16 elsewhere::

    layers:                      # (or the mapping at the top level)
      blocks.0.mlp.fc1: mxfp4
      blocks.0.mlp.fc2: mxfp4
      blocks.1.attn.qkv: fp8-rowwise
      head: bf16

Everything the plan does not name runs as ``bf16-mixed`` does (fp32 weights, bf16
autocast); each named Linear's matmuls run in its format, natively where the hardware
has it (the fp8 recipes on sm89+ with torchao), else emulated (:mod:`.lowbit`). Other keys
(``amptrain plan`` writes ``evidence``, ``format``, ``baseline``) are kept for the reader
and ignored here. The file is read with ``yaml.safe_load`` (nothing in it executes).

A plan is a mode of its own: :func:`plan_spec` gives its :class:`~.modes.ModeSpec`,
named ``plan:FILE``, and :func:`setup_plan` installs the formats when the precision sets a
model up, checking every name against the model (an unknown module, a module that cannot
run in its format: one line naming ``--precision``). The checkpoint keeps the plan's
content (:meth:`PrecisionPlan.state`), and a resume checks it against the plan given.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..common.choices import PLAN_PREFIX, PRECISION_ALIASES
from ..common.errors import UserError, bounded, flag
from .fp8 import Float8Selection, convert_linears
from .islands import ForwardPatches
from .lowbit import RECIPES, format_recipe, install_lowbit_linears
from .lowbit_training import StochasticSeeds
from .modes import MODES, ModeSpec
from .hardware.support import lowbit_native

log = logging.getLogger("amptrain")

#: What a layer left out of every low-bit format runs in (the plan's autocast).
KEPT = "bf16"
#: The mode a plan behaves as outside its low-bit layers.
BASE_MODE = "bf16-mixed"
#: The formats a plan may name: the low-bit recipes and the kept bf16.
PLAN_FORMATS = (*RECIPES, KEPT)
_KEPT_SPELLINGS = {"bf16", "bf16-mixed", "bfloat16", "mixed_bfloat16"}


def plan_format(name: Any) -> str | None:
    """``name`` as a plan format (aliases mapped: ``float8`` -> ``fp8``, ``bf16-mixed`` ->
    ``bf16``), or None when it is none."""
    text = str(name).strip()
    if text in _KEPT_SPELLINGS:
        return KEPT
    text = PRECISION_ALIASES.get(text, text)
    return text if text in RECIPES else None


@dataclass(frozen=True)
class PrecisionPlan:
    """Module name -> format, read from ``source`` (the path the user gave)."""

    source: str
    layers: tuple[tuple[str, str], ...]
    #: The rest of the file (evidence, ...): kept for writers, ignored by the precision.
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def label(self) -> str:
        """``plan:FILE``: the mode's name in logs, rows and checkpoints."""
        return f"{PLAN_PREFIX}{self.source}"

    @property
    def formats(self) -> dict[str, str]:
        """Module -> format."""
        return dict(self.layers)

    def lowbit_formats(self) -> list[str]:
        """The low-bit formats the plan uses, in first-use order."""
        return list(dict.fromkeys(f for _, f in self.layers if f != KEPT))

    def state(self) -> dict[str, str]:
        """What a checkpoint records: the plan's content (not its path)."""
        return dict(self.layers)


def _where(source: str) -> str:
    return f"{flag('precision')} {PLAN_PREFIX}{bounded(source)}"


def parse_plan(data: Any, source: str) -> PrecisionPlan:
    """A plan from YAML's data (``{"layers": {...}}`` or the mapping itself); a bad entry
    is a one-line :class:`UserError` naming the module and the format."""
    where = _where(source)
    if isinstance(data, dict) and isinstance(data.get("layers"), dict):
        layers, extra = data["layers"], {k: v for k, v in data.items() if k != "layers"}
    elif isinstance(data, dict) and "layers" not in data:
        layers, extra = data, {}
    else:
        raise UserError(f"{where}: the file must hold a mapping of module names to formats "
                        f"(or one under 'layers:'), e.g. 'blocks.0.mlp.fc1: mxfp4'")
    checked: list[tuple[str, str]] = []
    for module, fmt in layers.items():
        if isinstance(module, int) and not isinstance(module, bool):
            module = str(module)   # an nn.Sequential's "0:" reads as an integer in YAML
        if not isinstance(module, str) or not module.strip():
            raise UserError(f"{where}: module names must be strings (got {bounded(module)!r})")
        known = plan_format(fmt)
        if known is None:
            raise UserError(f"{where}: module {bounded(module)!r}: unknown format "
                            f"{bounded(fmt)!r}; choose one of {', '.join(PLAN_FORMATS)}")
        checked.append((module.strip(), known))
    return PrecisionPlan(source, tuple(checked), extra)


def load_plan(source: str) -> PrecisionPlan:
    """Read the plan file ``source`` (safe YAML)."""
    import yaml  # deferred: only plans read YAML here

    path = Path(source).expanduser()
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"{_where(source)}: cannot read the plan file "
                        f"({exc.strerror or exc})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"{_where(source)}: not valid YAML{at}") from None
    return parse_plan(data, source)


def plan_spec(plan: PrecisionPlan) -> ModeSpec:
    """The mode of ``plan``: bf16-mixed's storage and autocast, its layers in their formats."""
    base = MODES[BASE_MODE]
    formats = ", ".join(plan.lowbit_formats()) or "no low-bit format"
    return ModeSpec(name=plan.label, param_dtype=base.param_dtype,
                    compute_dtype=base.compute_dtype, master_weights=False,
                    loss_scaling=False, tf32=False, layer_formats=plan.layers,
                    summary=f"fp32 weights, per-layer formats ({formats}), bf16 elsewhere")


def eligible_for(module: nn.Module, fmt: str) -> str | None:
    """Why ``module`` cannot run in ``fmt`` (None: it can)."""
    if fmt == KEPT:
        return None
    if type(module) is not nn.Linear:
        return (f"a {type(module).__name__}, not a plain nn.Linear (only those run in a "
                f"low-bit format)")
    multiple = RECIPES[fmt].dim_multiple
    if module.in_features % multiple or module.out_features % multiple:
        return (f"its dimensions {module.in_features}x{module.out_features} are not "
                f"multiples of {multiple}, as {fmt} needs")
    return None


def check_plan(plan: PrecisionPlan, model: nn.Module) -> None:
    """Refuse a plan that names a module the model lacks, or one that cannot run in its
    format (one line each, naming ``--precision``)."""
    modules = dict(model.named_modules())
    for name, fmt in plan.layers:
        module = modules.get(name)
        if module is None:
            linears = [n for n, m in modules.items() if isinstance(m, nn.Linear)]
            raise UserError(f"{_where(plan.source)}: no module {bounded(name)!r} in the model "
                            f"(its Linear layers: {bounded(', '.join(linears))})")
        why = eligible_for(module, fmt)
        if why:
            raise UserError(f"{_where(plan.source)}: module {bounded(name)!r} cannot run in "
                            f"{fmt}: it is {why}")


def setup_plan(model: nn.Module, patches: ForwardPatches, plan: PrecisionPlan,
               device: torch.device, islands: list[str], *, mx_scale: str = "floor",
               seed: int = 0) -> tuple[Float8Selection, StochasticSeeds | None]:
    """Put each of ``plan``'s layers in its format (natively where the hardware has it,
    else emulated); returns the low-bit layers as a :class:`Float8Selection` (the others with
    their reason) and the stochastic-rounding seeds of its nvfp4 layers, if any."""
    check_plan(plan, model)
    result = Float8Selection()
    groups: dict[str, list[str]] = {}
    for name, fmt in plan.layers:
        if fmt == KEPT:
            result.skipped[name] = f"{PLAN_PREFIX} bf16"
        elif any(name == i or name.startswith(i + ".") for i in islands):
            result.skipped[name] = "--keep-fp32"
        else:
            groups.setdefault(fmt, []).append(name)
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name not in plan.formats:
            result.skipped[name] = "not in the plan"
    stochastic = [n for fmt, names in groups.items() if RECIPES[fmt].stochastic for n in names]
    seeds = StochasticSeeds(seed, stochastic) if stochastic else None
    for fmt, names in groups.items():
        spec = MODES[fmt]
        recipe = format_recipe(fmt, mx_scale)
        part = Float8Selection(convert=list(names))
        if lowbit_native(spec, device) and recipe.native == "fp8":
            convert_linears(model, part, recipe=recipe.torchao_recipe or "tensorwise")
        else:  # emulated (and fp8-blockwise's Hopper kernels: emulated inside a plan)
            install_lowbit_linears(patches, model, part, recipe, seeds)
        result.convert.extend(names)
    line = plan_line(plan, result)
    if log.hasHandlers():
        log.info("%s", line)
    return result, seeds


def plan_line(plan: PrecisionPlan, installed: Float8Selection) -> str:
    """The run log's one line: how many Linear layers run in which format."""
    counts: dict[str, int] = {}
    for name in installed.convert:
        counts[plan.formats[name]] = counts.get(plan.formats[name], 0) + 1
    shown = ", ".join(f"{n} in {fmt}" for fmt, n in counts.items()) or "none low-bit"
    total = len(installed.convert) + len(installed.skipped)
    return f"{plan.label}: {len(installed.convert)} of {total} Linear layers low-bit ({shown})"


def native_formats(plan: PrecisionPlan, device: torch.device) -> dict[str, bool]:
    """Each of ``plan``'s low-bit formats: native on ``device`` (else emulated)."""
    return {fmt: lowbit_native(MODES[fmt], device) and RECIPES[fmt].native == "fp8"
            for fmt in plan.lowbit_formats()}


def plan_emulation_note(plan: PrecisionPlan, device: torch.device) -> str | None:
    """The warning for a plan with formats that ``device`` only emulates (None: none)."""
    emulated = [fmt for fmt, native in native_formats(plan, device).items() if not native]
    if not emulated:
        return None
    return (f"{plan.label}: {', '.join(emulated)} {'is' if len(emulated) == 1 else 'are'} "
            f"emulated on this {device.type} (each GEMM's operands quantised with the "
            f"format's exact rules, multiplied in fp32): use it to study accuracy, not speed")


def check_resumed_plan(plan: PrecisionPlan | None, saved: Any) -> None:
    """A resume with a plan other than the checkpoint's: refused (one line). ``saved``: the
    checkpoint's recorded plan (None where it trained without one)."""
    if plan is None or saved is None:
        return
    if not isinstance(saved, dict) or {str(k): str(v) for k, v in saved.items()} != plan.state():
        differ = sorted(set(plan.state().items()) ^ set(
            (str(k), str(v)) for k, v in (saved or {}).items()))
        first = differ[0] if differ else ("?", "?")
        raise UserError(f"{_where(plan.source)}: the checkpoint trained with another plan "
                        f"(first difference: {bounded(first[0])} {first[1]}); resume with the "
                        f"plan it recorded")


# ----------------------------------------------------------- matmul FLOPs shares
def linear_flops(model: nn.Module) -> dict[str, int]:
    """Each plain ``nn.Linear``'s multiply-adds per token (``in x out``): the weight of its
    matmuls in the model's FLOPs (every Linear sees the same tokens in the models here)."""
    return {name: m.in_features * m.out_features for name, m in model.named_modules()
            if type(m) is nn.Linear}


def lowbit_flops_share(model: nn.Module, lowbit_layers: list[str]) -> float | None:
    """The share of the model's plain-Linear matmul FLOPs (per token) that runs in a
    low-bit format; None for a model without Linear layers."""
    flops = linear_flops(model)
    total = sum(flops.values())
    return sum(flops.get(n, 0) for n in lowbit_layers) / total if total else None
