"""Tasks: what differs between kinds of learning problem (see :mod:`.base`).

A new task is one module with a :class:`~amptrain.tasks.base.Task` subclass (the core
protocol, plus the optional parts it differs in) plus its line in
:data:`~.registry.TASKS` (and its name in :data:`amptrain.common.choices.TASK_NAMES`, for
the CLI). :mod:`.registry` is also the one place that decides which task something is (a
run's data and model, a checkpoint, a compare summary). A task's options are declared
beside it, torch-free (:mod:`.ppo_options`).

The face is lazy (:mod:`amptrain.common.lazy`): the command line's parser reads the
options modules without importing torch.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..common.choices import LOSSES, TASK_CHOICES
from ..common.lazy import lazy_exports

if TYPE_CHECKING:
    from .base import (CORE, PARTS, DataChecks, Diagnosis, EvalResult, EvalSums, Iteration,
                       LogKeys, Metric, Metrics, Offers, Reports, Task, Verdict, Wording,
                       delta_field, judge, targets_of)
    from .classification import ClassificationTask
    from .gan import GanTask
    from .lm import LanguageModelTask
    from .ppo import PpoTask
    from .regression import RegressionTask
    from .registry import (DEFAULT_TASK, TASKS, build_task, data_task, decide_task,
                           infer_task, output_noun, resolve_task, saved_task_name,
                           task_class, task_of_summary)

_WHERE = {
    ".base": ("CORE", "PARTS", "DataChecks", "Diagnosis", "EvalResult", "EvalSums", "Iteration",
              "LogKeys", "Metric", "Metrics", "Offers", "Reports", "Task", "Verdict", "Wording",
              "delta_field", "judge", "targets_of"),
    ".classification": ("ClassificationTask",),
    ".gan": ("GanTask",),
    ".lm": ("LanguageModelTask",),
    ".ppo": ("PpoTask",),
    ".regression": ("RegressionTask",),
    ".registry": ("DEFAULT_TASK", "TASKS", "build_task", "data_task", "decide_task",
                  "infer_task", "output_noun", "resolve_task", "saved_task_name", "task_class",
                  "task_of_summary"),
}
__getattr__ = lazy_exports(__name__, {name: module for module, names in _WHERE.items()
                                      for name in names})

__all__ = ["CORE", "DEFAULT_TASK", "LOSSES", "PARTS", "TASKS", "TASK_CHOICES", "ClassificationTask",
           "DataChecks", "Diagnosis", "EvalResult", "EvalSums", "GanTask", "Iteration",
           "LanguageModelTask", "LogKeys", "Metric", "Metrics", "Offers", "PpoTask",
           "RegressionTask", "Reports", "Task", "Verdict", "Wording", "build_task", "data_task",
           "decide_task", "delta_field", "infer_task", "judge", "output_noun", "resolve_task",
           "saved_task_name", "targets_of", "task_class", "task_of_summary"]
