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

#: The precision modes, in the order ``env`` and ``--help`` list them (their specs:
#: :data:`amptrain.precision.modes.MODES`; other spellings: ``modes.ALIASES``).
MODE_NAMES = ("32-true", "tf32", "16-mixed", "bf16-mixed", "16-master", "bf16-master",
              "16-true", "bf16-true", "fp8", "fp8-rowwise", "mxfp8", "mxfp4", "nvfp4")
#: What ``--precision`` lists: a mode, or ``auto`` (the best the hardware supports).
PRECISION_NAMES = MODE_NAMES + ("auto",)

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
        raise RuntimeError(f"{what} {names} do not match amptrain.choices {declared}")
