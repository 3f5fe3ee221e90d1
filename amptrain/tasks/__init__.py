"""Tasks: what differs between kinds of learning problem (see :mod:`.base`).

A new task is one module with a :class:`~amptrain.tasks.base.Task` subclass plus its line
in :data:`TASKS`.
"""
from __future__ import annotations

from typing import Any

from ..choices import TASK_CHOICES, TASK_NAMES, check_table
from ..errors import UserError, flag
from .base import EvalResult, EvalSums, Metric, Task, targets_of
from .classification import ClassificationTask
from .gan import GanTask
from .lm import LanguageModelTask
from .ppo import PpoTask
from .regression import LOSSES, RegressionTask

#: task name -> its class
TASKS: dict[str, type[Task]] = {"classification": ClassificationTask,
                                "regression": RegressionTask,
                                "lm": LanguageModelTask,
                                "gan": GanTask,
                                "ppo": PpoTask}
# The names live in amptrain.choices (torch-free, for the CLI parser); --task auto: see
# infer_task.
check_table("tasks", TASKS, TASK_NAMES)


def build_task(name: str, **facts: Any) -> Task:
    """The task called ``name``, told what it needs to know about the data (``facts``:
    ``class_names``, ``loss``, or the ``state()`` a checkpoint kept)."""
    cls = TASKS.get(name)
    if cls is None:
        raise UserError(f"unknown {flag('task')} {name!r}; choose one of {', '.join(TASKS)}")
    return cls(**facts)


def infer_task(data: Any) -> str:
    """``--task auto``: what the data says it is (``text:`` data is an LM's), else
    regression for float targets and classification for anything else."""
    hint = getattr(data, "task", None)
    if hint in TASKS:
        return str(hint)
    targets = targets_of(data)
    if targets is not None and targets.is_floating_point():
        return "regression"
    return "classification"


#: From this many samples up, integer targets that are all different are not classes.
DISTINCT_LABELS_MIN = 20


def _check_labels_are_classes(train_data: Any) -> None:
    """``auto`` reads integer targets as classes; but when every one differs (ids, counts,
    prices in cents) there is nothing to classify, and a many-class classifier of one
    sample per class would train without a word."""
    targets = targets_of(train_data)
    if targets is None or targets.is_floating_point() or targets.ndim != 1 \
            or len(targets) < DISTINCT_LABELS_MIN:
        return
    if len(targets.unique()) == len(targets):
        raise UserError(f"every one of the {len(targets)} training labels is distinct (one "
                        f"sample per class): these look like measurements or ids, not "
                        f"classes; did you mean {flag('task')} regression (with float "
                        f"targets)? To train a classifier anyway, set {flag('task')} "
                        f"classification")


def resolve_task(name: str, train_data: Any, *, loss: str | None = None,
                 **facts: Any) -> Task:
    """The task a run trains: ``name`` (``auto`` asks the data), with ``--loss`` checked."""
    chosen = infer_task(train_data) if name == "auto" else name
    if name == "auto" and chosen == "classification":
        _check_labels_are_classes(train_data)
    if loss is not None and chosen != "regression":
        raise UserError(f"{flag('loss')} {loss} applies to regression; this run's task is "
                        f"{chosen} ({flag('task')} {name})")
    if loss is not None:
        facts["loss"] = loss
    return build_task(chosen, **facts)


__all__ = ["LOSSES", "TASKS", "TASK_CHOICES", "ClassificationTask", "EvalResult", "EvalSums",
           "GanTask",
           "LanguageModelTask", "Metric", "PpoTask", "RegressionTask", "Task", "build_task",
           "infer_task",
           "resolve_task", "targets_of"]
