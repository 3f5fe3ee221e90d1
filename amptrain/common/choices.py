"""The names users type for precisions, weight-update rules, tasks and losses.

This module imports nothing heavy (no torch, no numpy), so that the command-line parser
and the config dataclasses, which list and check these names, can be built without
importing torch: ``amptrain --help`` and a mistyped flag answer at once. Each name is
declared here once; the modules that implement them (:mod:`amptrain.precision.modes`,
:mod:`amptrain.precision.weight_update`, :mod:`amptrain.tasks`) import their names from
here and refuse, at import, a table that does not match.
"""
from __future__ import annotations

from collections.abc import Iterable

from .errors import UserError, flag

#: The precision modes, in the order ``env`` and ``--help`` list them (their specs:
#: :data:`amptrain.precision.modes.MODES`; other spellings: :data:`PRECISION_ALIASES`).
MODE_NAMES = ("32-true", "tf32", "16-mixed", "bf16-mixed", "16-master", "bf16-master",
              "16-true", "bf16-true", "fp8", "fp8-rowwise",
              "fp8-rowwise-gw-hp", "fp8-blockwise", "mxfp8", "mxfp4", "nvfp4", "nvfp4-plain")
#: What ``--precision`` lists: a mode, or ``auto`` (the best the hardware supports).
PRECISION_NAMES = MODE_NAMES + ("auto",)
#: ``--precision plan:FILE``: a precision plan, one format per layer
#: (:mod:`amptrain.precision.precision_plan`).
PLAN_PREFIX = "plan:"

#: Lightning's short spellings, common synonyms, Keras's mixed-precision policy names and
#: NVIDIA Apex AMP's opt levels (O0 fp32; O1 fp16 autocast with fp32 weights; O2 fp16 model
#: with fp32 master weights, BatchNorm in fp32; O3 pure fp16).
PRECISION_ALIASES = {"32": "32-true", "fp32": "32-true", "16": "16-mixed", "fp16": "16-mixed",
                     "bf16": "bf16-mixed", "16-mixed-master": "16-master",
                     "float32": "32-true", "mixed_float16": "16-mixed",
                     "mixed_bfloat16": "bf16-mixed",
                     "O0": "32-true", "O1": "16-mixed", "O2": "16-master", "O3": "16-true",
                     # torchao's recipe names (Float8LinearRecipeName) and spelled-out formats
                     "float8": "fp8", "fp8-tensorwise": "fp8", "tensorwise": "fp8",
                     "rowwise": "fp8-rowwise", "float8-rowwise": "fp8-rowwise",
                     "rowwise_with_gw_hp": "fp8-rowwise-gw-hp",
                     "float8-rowwise-gw-hp": "fp8-rowwise-gw-hp",
                     # Transformer Engine's recipe names (Float8BlockScaling,
                     # NVFP4BlockScaling) and torchao's blockwise prototype
                     "float8-block-scaling": "fp8-blockwise", "fp8-block-scaling": "fp8-blockwise",
                     "float8-blockwise": "fp8-blockwise",
                     "nvfp4-block-scaling": "nvfp4",
                     "mx-fp8": "mxfp8", "mx-fp4": "mxfp4", "nv-fp4": "nvfp4"}


def canonical_name(name: str) -> str:
    """Map an alias to its mode name (``auto`` stays ``auto``), or raise a UserError listing
    the valid names: the check of ``--precision`` where it is declared (config/train.py).
    ``plan:FILE`` (a precision plan) is returned as it is; its file is read where the
    precision is resolved."""
    if str(name).startswith(PLAN_PREFIX):
        if not str(name)[len(PLAN_PREFIX):].strip():
            raise UserError(f"{flag('precision')} plan:FILE needs the plan file's path, e.g. "
                            f"plan:out/precision-plan.yaml")
        return str(name)
    name = PRECISION_ALIASES.get(str(name), str(name))
    if name not in PRECISION_NAMES:
        raise UserError(f"unknown {flag('precision')} {name!r}; choose one of "
                        f"{', '.join(PRECISION_NAMES)}, plan:FILE (or an alias: "
                        f"{', '.join(PRECISION_ALIASES)})")
    return name


#: How MX block scales are chosen (``--mx-scale``; torchao's ScaleCalculationMode FLOOR and
#: RCEIL; implemented in :mod:`amptrain.precision.lowbit_formats`).
MX_SCALES = ("floor", "rceil")

#: One part of the NVFP4 training recipe to leave out (``--nvfp4-without``, the ablation):
#: the random Hadamard transform, stochastic rounding, or the 16x16 weight blocks.
NVFP4_PARTS = ("none", "rht", "sr", "2d")

#: The rules ``--weight-update`` takes (``plain``: none).
WEIGHT_UPDATES = ("plain", "kahan", "stochastic")

#: The tasks (their classes: :data:`amptrain.tasks.TASKS`).
TASK_NAMES = ("classification", "regression", "lm", "gan", "ppo")
#: What ``--task`` takes: a task, or auto (the data decides).
TASK_CHOICES = ("auto", *TASK_NAMES)
#: Regression losses (``--loss``).
LOSSES = ("mse", "l1", "huber")
#: Image augmentations (``--augment``; implemented in :mod:`amptrain.data.augment`).
AUGMENTATIONS = ("none", "flip", "crop-flip", "rrc-flip")


def check_table(what: str, implemented: Iterable[str], declared: tuple[str, ...]) -> None:
    """Raise at import when an implementation table and the names here disagree (a
    programming error: a name added in one place only)."""
    names = tuple(implemented)
    if names != declared:
        raise RuntimeError(f"{what} {names} do not match amptrain.common.choices {declared}")
