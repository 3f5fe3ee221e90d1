"""The tolerance of a verdict (is a precision as good as the baseline?), in the task's
unit: the value given on the command line, else the task's own default, else the shared
default. compare decides it; the reports read it back for studies that did not record it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import flag

#: The defaults of --tolerance-pp (accuracy points) and --tolerance-rel (relative change).
SHARED_TOLERANCES = {"tolerance_pp": 0.5, "tolerance_rel": 0.02}


@dataclass(frozen=True)
class Tolerance:
    """The verdict's tolerance in the task's unit, the option that holds it and why it is
    this value (given on the command line, the task's default, or the shared default)."""

    value: float
    option: str
    source: str      # "given", "task" or "shared"
    why: str


def tolerance_for(task: Any, given: float | None) -> Tolerance:
    """The tolerance of ``task``'s verdict: ``given`` (the value of the option the task
    names, ``task.verdict.tolerance_option``, or None) when given, else the task's
    ``default_<option>`` (a GAN's Fréchet distance varies far more between seeds than
    perplexity), else
    :data:`SHARED_TOLERANCES` (a value equal to it, such as ``--tolerance-pp``'s default,
    is reported as the shared default)."""
    name = task.verdict.tolerance_option
    if given is not None and given != SHARED_TOLERANCES[name]:
        return Tolerance(float(given), name, "given", f"{flag(name)} {given:g} as given")
    own = task.verdict.default_tolerance
    if own is not None and given is None:
        return Tolerance(float(own), name, "task",
                         f"the {task.name} task's default {flag(name)} {own:g}: its metric "
                         f"varies this much between seeds of the same recipe (measured; see "
                         f"{type(task).__name__}.default_{name})")
    shared = SHARED_TOLERANCES[name]
    return Tolerance(shared, name, "shared", f"the shared default {flag(name)} {shared:g}")
