"""Tasks: what differs between kinds of learning problem (see :mod:`.base`).

A new task is one module with a :class:`~amptrain.tasks.base.Task` subclass plus its line
in :data:`TASKS`.
"""
from __future__ import annotations

from typing import Any

from ..errors import UserError, flag
from .base import EvalResult, EvalSums, Metric, Task
from .classification import ClassificationTask

#: task name -> its class
TASKS: dict[str, type[Task]] = {"classification": ClassificationTask}


def build_task(name: str, **facts: Any) -> Task:
    """The task called ``name``, told what it needs to know about the data (``facts``)."""
    cls = TASKS.get(name)
    if cls is None:
        raise UserError(f"unknown {flag('task')} {name!r}; choose one of {', '.join(TASKS)}")
    return cls(**facts)


__all__ = ["TASKS", "ClassificationTask", "EvalResult", "EvalSums", "Metric", "Task",
           "build_task"]
