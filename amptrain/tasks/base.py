"""What a task is: the core protocol a task needs in order to learn (:class:`Task`: its
loss, its training step, how an evaluation pass is summed up into its metrics, what it
learns from the data) and the optional parts it offers, each a typed, ready-made object
declared as a class attribute (compare's :class:`~.verdict.Verdict`, its
:class:`~.wording.Wording`, :class:`~.reports.Reports`, :class:`~.checks.DataChecks`,
:class:`~.iteration.Iteration`, :class:`~.logkeys.LogKeys`, :class:`~.diagnosis.Diagnosis`
and :class:`~.offers.Offers`). Nothing probes a task with getattr: a task that declares no
part gets the default one.

The Trainer, evaluation, compare and the logs read a :class:`Task`; none of them names a
task's metric. A new task is one module defining a subclass plus a line in
:data:`amptrain.tasks.TASKS`.
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..data.protocol import targets_of  # noqa: F401  (the tasks' import of it)
from .step import supervised_step
from ..common import outdir
from .checks import DataChecks
from .diagnosis import Diagnosis
from .iteration import Iteration
from .logkeys import LogKeys
from .metrics import Metric, Metrics
from .offers import Offers
from .reports import Reports
from .verdict import Verdict
from .wording import Wording

if TYPE_CHECKING:
    from .step import StepContext


@dataclass
class EvalResult:
    """One evaluation pass: the mean loss, the task's metrics and what its report needs."""

    loss: float
    samples: int
    metrics: dict[str, float] = field(default_factory=dict)   # key -> value, e.g. {"acc": ..}
    details: dict[str, Any] = field(default_factory=dict, repr=False)
    task: Task | None = field(default=None, repr=False)

    def record(self) -> dict[str, float]:
        """The ``val_*`` fields of a metrics.jsonl record."""
        return {"val_loss": self.loss, **{f"val_{k}": v for k, v in self.metrics.items()}}

    def write(self, directory: str | Path) -> None:
        """Write eval/report.json and the task's readable report into ``directory``."""
        assert self.task is not None, "an EvalResult reports through its task"
        directory = Path(directory)

        outdir.make(directory)
        # One writer for every file (a full disk is one line, no half-written report);
        # the command's claim on --out made sure nothing here is the user's.
        outdir.write_text(directory / "report.json",
                          json.dumps(self.task.reports.report(self), indent=2), replace=True)
        reports = self.task.reports
        name, text = reports.report_text(self)
        outdir.write_text(directory / name, text, replace=True)
        reports.write_files(self, directory)

    def __getattr__(self, name: str) -> Any:
        # result.accuracy, result.rmse ...: the task's metrics by their long names too.
        metrics = self.__dict__.get("metrics", {})
        task = self.__dict__.get("task")
        for metric in (task.metrics if task is not None else ()):
            if name in (metric.label, metric.key) and metric.key in metrics:
                return metrics[metric.key]
        raise AttributeError(name)


class EvaluationStopped(Exception):
    """A stop signal arrived during an evaluation pass, which was abandoned (the Trainer
    stops the run with its checkpoint instead of waiting for the pass to end)."""


def _never() -> bool:
    return False


class EvalSums:
    """What one evaluation pass keeps on the device between batches (no host sync)."""

    #: Whether the pass is to be abandoned (a stop signal): set by the evaluation loop,
    #: which asks it between batches; a task whose batch is long to evaluate (ppo's
    #: episodes) asks it too and raises :class:`EvaluationStopped`.
    stopping: Callable[[], bool] = staticmethod(_never)

    def update(self, outputs: torch.Tensor | None, targets: Any) -> None:  # pragma: no cover
        raise NotImplementedError

    def update_batch(self, model: Any, batch: Any) -> None:  # noqa: B027  (optional hook)
        """Every evaluated batch as the model saw it, with the model (in eval mode, no
        gradients, under the precision's autocast), before :meth:`update`: for measures
        of the model beyond its outputs (the GAN's generated images). Nothing by default."""


class Task(ABC):
    """One kind of learning problem (see the module docstring).

    The core protocol is what a task needs in order to learn: its ``name`` and
    ``metrics``, :meth:`loss`, :meth:`start_eval` and :meth:`finish_eval` (the three a
    subclass must write), and :meth:`learn_from`/:meth:`state`, :meth:`models`,
    :meth:`build_optimizers`, :meth:`training_step` and :meth:`close`, which have defaults.
    Everything else is an optional part (class attributes below): a task declares only
    the parts it differs in, and reads them as ``task.verdict``, ``task.wording`` ...
    """

    #: The name ``--task`` takes and checkpoints keep (its line in ``tasks.TASKS``).
    name: str
    #: Every metric the task reports, the primary one first (``metrics.primary``).
    metrics: Metrics

    # ------------------------------------------------ optional parts (ready-made defaults)
    #: How compare judges two precisions on the primary metric.
    verdict: Verdict = Verdict()
    #: Its words in messages (data, outputs, resume, a model that learnt nothing).
    wording: Wording = Wording()
    #: eval/'s report files.
    reports: Reports = Reports()
    #: The checks of a run's data and model, and which data it trains on.
    checks: DataChecks = DataChecks()
    #: The run's iteration: the Trainer's epochs, or the task's own loop.
    iteration: Iteration = Iteration()
    #: The keys it logs and shows beside the losses (fields, speeds).
    logs: LogKeys = LogKeys()
    #: What ``diagnose`` may ask of it (its losses' names and model parts).
    diagnosis: Diagnosis = Diagnosis()
    #: What ``generate`` draws and which split ``eval`` fits it on.
    offers: Offers = Offers()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A task's ``metrics`` may be a plain tuple (made a :class:`Metrics`); a member the
        parts now own (``delta_unit = "rel"``, a ``report_text`` method ...) is refused, as
        it would otherwise be silently ignored."""
        super().__init_subclass__(**kwargs)
        moved = sorted(name for name in vars(cls) if name in MOVED)
        if moved:
            raise TypeError(f"{cls.__name__} declares {', '.join(moved)}, which the task's "
                            f"parts now own: declare {', '.join(MOVED[m] for m in moved)} "
                            f"instead (see docs/tasks.md)")
        metrics = vars(cls).get("metrics")
        if isinstance(metrics, tuple) and not isinstance(metrics, Metrics):
            cls.metrics = Metrics(*metrics)

    # ------------------------------------------------------- the core protocol
    @abstractmethod
    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean training loss of a batch."""

    @abstractmethod
    def start_eval(self, device: torch.device) -> EvalSums:
        """A fresh accumulator for one evaluation pass on ``device``."""

    @abstractmethod
    def finish_eval(self, sums: EvalSums, gather: Any, loss: float, samples: int) -> EvalResult:
        """The pass's result; ``gather(tensor)`` concatenates a tensor over all processes."""

    def learn_from(self, train_data: Any) -> None:  # noqa: B027  (optional hook)
        """Learn what the task needs from the training data (once, before the first step):
        regression's target statistics, the LM's tokens per sample. Statistics already
        learnt (restored from a checkpoint) are kept, so ``eval`` may call it on other data
        for that data's own facts (an LM's bytes per token). Nothing by default."""

    def state(self) -> dict[str, Any]:
        """What :meth:`learn_from` learnt, JSON-able, for checkpoints (``eval`` rebuilds the task
        with ``build_task(name, **state)``)."""
        return {}

    def models(self, model: nn.Module) -> dict[str, nn.Module]:
        """The parts of ``model`` that train, each with its own optimizer, LR schedule,
        clipping and skip counter, by name (the name ``Task.training_step`` passes to the
        context). One part, ``"model"``, by default."""
        return {"model": model}

    def build_optimizers(self, parts: dict[str, nn.Module],
                         build: Callable[[nn.Module], torch.optim.Optimizer]
                         ) -> dict[str, torch.optim.Optimizer]:
        """One optimizer per part; ``build(part)`` makes the run's configured one."""
        return {name: build(part) for name, part in parts.items()}

    def training_step(self, ctx: StepContext) -> None:
        """One optimizer step on ``ctx``'s micro-batches (see :mod:`.step`); by default the
        supervised step with this task's loss."""

        supervised_step(ctx, self.loss)

    def close(self) -> None:  # noqa: B027  (optional hook)
        """Release what the task opened for a run (environments); called when it ends."""


#: What the Task used to declare itself and the part that owns it now.
MOVED = {
    **{name: f"verdict = Verdict(...) ({name})" for name in (
        "delta_unit", "tolerance_option", "seed_statistic", "default_tolerance_pp",
        "default_tolerance_rel", "default_tolerance", "delta_field", "format_delta",
        "format_tolerance", "judge", "difference")},
    **{name: f"wording = Wording(...) ({name})" for name in (
        "data_holds", "data_needs", "output_noun", "describe", "resume_mismatch",
        "learning_note")},
    **{name: f"a Reports subclass ({name})" for name in ("report", "report_text", "write_files")},
    **{name: f"a DataChecks subclass ({name})" for name in ("check_data", "check_outputs",
                                                            "fits")},
    **{name: f"an Iteration subclass ({name})" for name in (
        "owns_loop", "iterate", "timed_unit", "run_options", "batches_are_samples")},
    **{name: f"a LogKeys subclass ({name})" for name in ("shown_fields", "speed_units",
                                                         "throughput")},
    **{name: f"a Diagnosis subclass ({name})" for name in ("loss_names", "loss_paths")},
    **{name: f"offers = Offers(...) ({name})" for name in ("generates", "eval_learn_split")},
    **{name: f"metrics.{name}" for name in ("primary", "metric")},
}

#: The core protocol's members (house figures and the docs count them).
CORE = ("name", "metrics", "loss", "start_eval", "finish_eval", "learn_from", "state",
        "models", "build_optimizers", "training_step", "close")
#: The optional parts' attribute names, each with its type.
PARTS = {"verdict": Verdict, "wording": Wording, "reports": Reports, "checks": DataChecks,
         "iteration": Iteration, "logs": LogKeys, "diagnosis": Diagnosis, "offers": Offers}


def delta_field(task: Task) -> str:
    """compare.json's name for ``task``'s difference to the baseline (``delta_acc_pp``)."""
    return task.verdict.delta_field(task.metrics.primary)


def judge(task: Task, value: float | None, baseline: float | None, tolerance: float
          ) -> tuple[float | None, str | None]:
    """(difference to the baseline, verdict ok/worse/better) on ``task``'s primary metric."""
    return task.verdict.judge(value, baseline, tolerance, task.metrics.primary)


__all__ = ["CORE", "PARTS", "DataChecks", "Diagnosis", "EvalResult", "EvalSums",
           "EvaluationStopped", "Iteration", "LogKeys", "Metric", "Metrics", "Offers",
           "Reports", "Task", "Verdict", "Wording", "delta_field", "judge", "targets_of"]
