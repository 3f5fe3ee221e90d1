"""The task registry and the one place that decides which task something is.

A new task is one module with a :class:`~amptrain.tasks.base.Task` subclass (the core
protocol, plus the optional parts it differs in) plus its line
in :data:`TASKS` (and its name in :data:`amptrain.common.choices.TASK_NAMES`, for the CLI).

Which task something is: a run's data and model (:func:`decide_task`,
:func:`resolve_task`, :func:`infer_task`), a checkpoint (:func:`saved_task_name`), a
compare summary (:func:`task_of_summary`). Nothing outside tasks/ falls back to a task of
its own.
"""
from __future__ import annotations

from typing import Any

import torch

from ..common.choices import TASK_NAMES, check_table
from ..common.errors import UserError, flag
from ..data.protocol import columns_of
from .base import Task, delta_field, targets_of
from .classification import ClassificationTask
from .gan import GanTask
from .lm import LanguageModelTask
from .ppo import PpoTask
from .regression import RegressionTask

#: task name -> its class
TASKS: dict[str, type[Task]] = {"classification": ClassificationTask,
                                "regression": RegressionTask,
                                "lm": LanguageModelTask,
                                "gan": GanTask,
                                "ppo": PpoTask}
# The names live in amptrain.common.choices (torch-free, for the CLI parser); --task auto: see
# infer_task.
check_table("tasks", TASKS, TASK_NAMES)


#: The task of data that does not say what it is for (class labels) and of checkpoints
#: and compare summaries older than tasks (every run then trained a classifier).
DEFAULT_TASK = ClassificationTask.name


def task_class(name: object) -> type[Task] | None:
    """The registered Task class called ``name`` (for its wording), or None."""
    return TASKS.get(name) if isinstance(name, str) else None


def output_noun(name: object) -> str:
    """What task ``name`` calls a model's output count ("classes"); "outputs" for a name
    no task has."""
    return (task_class(name) or Task).wording.output_noun


def data_task(hint: str | None) -> str:
    """The task data is for: its own ``hint`` (``DataBundle.task``), else the default."""
    return hint or DEFAULT_TASK


def saved_task_name(state: dict[str, Any]) -> str:
    """The name of the task a checkpoint trained (checkpoints older than tasks were
    classifiers: they carry no task)."""
    return str((state.get("task") or {}).get("name") or (state.get("run") or {}).get("task")
               or DEFAULT_TASK)


def task_of_summary(summary: list[dict[str, Any]] | dict[str, Any]) -> Task:
    """The task whose metric a compare summary (or one row) carries, told by its
    ``delta_*`` field (``delta_acc_pp``: classification; ``delta_perplexity_rel``: lm)."""
    row = summary if isinstance(summary, dict) else (summary[0] if summary else {})
    for cls in TASKS.values():
        task = cls()
        if delta_field(task) in row:
            return task
    # A summary without any task's field (an empty one, or one older than tasks, when
    # every study was of classifiers) is read as the default task's.
    return TASKS[DEFAULT_TASK]()


def build_task(name: str, **facts: Any) -> Task:
    """The task called ``name``, told what it needs to know about the data (``facts``:
    ``class_names``, ``loss``, or the ``state()`` a checkpoint kept)."""
    cls = TASKS.get(name)
    if cls is None:
        raise UserError(f"unknown {flag('task')} {name!r}; choose one of {', '.join(TASKS)}")
    return cls(**facts)


def infer_task(data: Any) -> str:
    """``--task auto``: what the data says it is (``text:`` data is an LM's), else
    regression for float targets, ``lm`` for :func:`token_blocks`, and classification for
    anything else."""
    hint = getattr(data, "task", None)
    if hint in TASKS:
        return str(hint)
    targets = targets_of(data)
    if targets is not None and targets.is_floating_point():
        return RegressionTask.name
    if token_blocks(data):
        return LanguageModelTask.name
    return DEFAULT_TASK


def token_blocks(data: Any) -> bool:
    """Whether ``data`` is two integer columns of one ``[N, T]`` shape: token blocks and
    their next tokens, as nanoGPT's ``get_batch`` cuts them (a classifier's targets hold
    one class per sample; issue 49 met torch's "Expected target size" instead)."""
    columns = columns_of(data)
    if columns is None or len(columns) != 2:
        return False
    inputs, targets = columns
    return all(t.ndim == 2 and not t.is_floating_point() and not t.is_complex()
               and t.dtype != torch.bool for t in columns) and inputs.shape == targets.shape


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
    if name == "auto" and chosen == DEFAULT_TASK:
        _check_labels_are_classes(train_data)
    if loss is not None and chosen != RegressionTask.name:
        raise UserError(f"{flag('loss')} {loss} applies to regression; this run's task is "
                        f"{chosen} ({flag('task')} {name})")
    if loss is not None:
        facts["loss"] = loss
    return build_task(chosen, **facts)


def decide_task(requested: str, *, data_hint: str | None, model_task: str | None,
                train_data: Any, loss: str | None, model: str, data: str,
                class_names: list[str] | None, **facts: Any) -> Task:
    """A run's task, decided once: ``requested`` (``--task``), which must fit the data
    (its ``data_hint``), or under ``auto`` the task the model trains (``model_task``),
    else what the data is; ``--loss`` and integer labels that are not classes are checked
    here. ``model`` and ``data`` are the specs the messages name; ``facts`` go to the task
    (the ppo task's hyper-parameters)."""
    kind = data_task(data_hint)
    by_model = model_task if requested == "auto" else None
    name = by_model or requested
    if name != "auto" and not TASKS[name].checks.fits(kind, name):
        chosen = f"--model {model} trains {name}, which" if by_model else f"--task {name}"
        raise UserError(f"{chosen} does not fit --data {data}, which holds "
                        f"{TASKS[kind].wording.data_holds}: {TASKS[name].wording.data_needs} "
                        f"(or use "
                        f"--task {kind})")
    return resolve_task(name, train_data, loss=loss, class_names=class_names, **facts)
