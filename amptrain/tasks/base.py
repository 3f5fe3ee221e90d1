"""What a task is: the loss, how an evaluation pass is summed up, the metrics it reports,
its primary metric with a direction, and how ``compare`` judges two precisions on it.

The Trainer, evaluation, compare and the logs read a :class:`Task`; none of them names a
task's metric. A new task is one module defining a subclass plus a line in
:data:`amptrain.tasks.TASKS`.
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..data.protocol import targets_of  # noqa: F401  (the tasks' import of it)
from .step import supervised_step
from ..common import outdir

if TYPE_CHECKING:
    from .step import StepContext, TrainLoop


@dataclass(frozen=True)
class Metric:
    """A metric by the name records carry (``val_<key>``) and its direction."""

    key: str                 # "acc" -> val_acc in metrics.jsonl, val/acc in TensorBoard
    label: str               # "accuracy", for people
    higher_is_better: bool
    percent: bool = False    # shown x100 with a % sign (accuracy), else as a plain number

    def format(self, value: float | None) -> str:
        """The value as reports show it (``97.50 %``, ``3.214``)."""
        if value is None:
            return "-"
        return f"{value * 100:.2f} %" if self.percent else f"{value:.4g}"


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
                          json.dumps(self.task.report(self), indent=2), replace=True)
        name, text = self.task.report_text(self)
        outdir.write_text(directory / name, text, replace=True)
        self.task.write_files(self, directory)

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

    A subclass implements three methods: :meth:`loss`, :meth:`start_eval` and
    :meth:`finish_eval`. Everything else is a declared hook with a default, grouped below:
    what the task is called and reports (``name``, ``metrics``), how compare judges it, its
    wording in messages, what ``generate`` and ``diagnose`` may ask of it, the checks of data
    and outputs, the reports, what it learns from the data, and the training step.
    """

    # ------------------------------------------------------- identity and metrics
    #: The name ``--task`` takes and checkpoints keep (its line in ``tasks.TASKS``).
    name: str
    #: Every metric the task reports, the primary one first.
    metrics: tuple[Metric, ...]

    # ------------------------------------------------------- compare's verdict
    #: How compare's difference to the baseline is measured: "pp" (percentage points of
    #: a fraction) or "rel" (relative change); it names compare's ``delta_*`` field.
    delta_unit: str = "pp"
    #: The compare option that holds the verdict's tolerance in that unit.
    tolerance_option: str = "tolerance_pp"
    #: How compare judges the runs over seeds: "mean" (the mean's difference against the
    #: tolerance) or "iqm" (deep RL: the interquartile mean with a stratified-bootstrap
    #: interval, and its difference to the baseline; see amptrain/compare/seeds.py).
    seed_statistic: str = "mean"
    #: The task's own default for that option when its metric varies more between seeds
    #: than the shared default allows (the GAN's Fréchet distance); None: the shared one
    #: (:func:`amptrain.common.tolerance.tolerance_for`).
    default_tolerance_pp: float | None = None
    default_tolerance_rel: float | None = None

    # ------------------------------------------------------- wording
    # Messages about data and checkpoints (the runner's, eval's and resume's errors) use
    # these; no module outside tasks/ words a task itself.
    #: What data of this task holds: "--data X, which holds class labels".
    data_holds: str = "targets"
    #: What the task needs when ``--task`` names it for data that does not fit.
    data_needs: str = ""
    #: What the model's output count is called: "10 classes", "256 vocabulary entries".
    output_noun: str = "outputs"
    #: Fields of its training records the console line shows beside the losses, the
    #: learning rate and the validation metrics (PPO's ``episode_return``).
    shown_fields: tuple[str, ...] = ()
    #: Speed fields its records carry (:meth:`throughput`) and their units on the console
    #: (an LM's ``{"tokens_per_s": "tokens/s"}``).
    speed_units: Mapping[str, str] = MappingProxyType({})
    #: Each loss's name by its ``loss_id`` (``diagnose`` names the loss that overflows).
    loss_names: Mapping[int, str] = MappingProxyType({0: "loss"})

    # ------------------------------------------------------- capabilities
    #: Whether a training batch is ``(inputs, targets)`` the model's loss is computed on
    #: (False: PPO's batches are rollout slots its own step reads; compare's fp32 re-check
    #: of the first batch's loss does not apply).
    batches_are_samples: bool = True
    #: What ``amptrain generate`` draws from a trained model of this task: "text" (a
    #: language model's continuation), "images" (a generator's samples), or None.
    generates: str | None = None
    #: The split ``amptrain eval`` fits the task on (:meth:`learn_from`): "val" (the data it
    #: evaluates) or "train" (a task that measures against the training split, as the
    #: GAN's feature network).
    eval_learn_split: str = "val"

    def default_tolerance(self) -> float | None:
        """The task's own default for :attr:`tolerance_option` (None: the shared one)."""
        return self.default_tolerance_pp if self.tolerance_option == "tolerance_pp" \
            else self.default_tolerance_rel

    # ------------------------------------------------------- learnt from data
    def learn_from(self, train_data: Any) -> None:  # noqa: B027  (optional hook)
        """Learn what the task needs from the training data (once, before the first step):
        regression's target statistics, the LM's tokens per sample. Statistics already
        learnt (restored from a checkpoint) are kept, so ``eval`` may call it on other data
        for that data's own facts (an LM's bytes per token). Nothing by default."""

    def state(self) -> dict[str, Any]:
        """What :meth:`learn_from` learnt, JSON-able, for checkpoints (``eval`` rebuilds the task
        with ``build_task(name, **state)``)."""
        return {}

    def throughput(self, samples_per_s: float | None) -> dict[str, float]:
        """Extra speed fields of a training record (an LM's ``tokens_per_s``)."""
        return {}

    @classmethod
    def fits(cls, kind: str) -> bool:
        """Whether this task trains on data that says it is for task ``kind`` (a run's
        ``--task`` is checked against its ``--data`` with it)."""
        return kind == cls.name

    @classmethod
    def resume_mismatch(cls, key: str, now: Any, then: Any, *, config: dict[str, Any],
                        saved: dict[str, Any], path: str) -> str | None:
        """The message for resuming checkpoint ``path`` whose model fact ``key``
        (``num_classes`` or ``input_shape``) was ``then`` and is ``now``, in this task's
        terms (an LM names --seq-len or --tokenizer); None: the generic message."""
        return None

    def run_options(self, config: Any, data: Any) -> dict[str, Any]:
        """Options (flat names) this task sets for a run of ``config`` on ``data`` (a
        ``DataBundle``): a task that makes its own samples (PPO's rollouts) sets the run's
        length and batch from them. None by default."""
        return {}

    def loss_paths(self) -> dict[str, str]:
        """Module-name globs of the model parts one of the task's losses trains alone, each
        with what that loss is and what its size follows (diagnose names a gradient
        overflow there by its loss). None by default."""
        return {}

    def timed_unit(self) -> int:
        """Optimizer steps compare times as one unit: 1, or for a task that acts between
        updates (PPO's rollouts) a whole update, so its acting is timed too."""
        return 1

    def describe(self) -> str:
        """The task's words in the Trainer's first line ("" for classification, the
        default task; else ``task <name>``)."""
        return f"task {self.name}"

    # ------------------------------------------------------- the training step
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

    #: Whether the task drives the run's iteration itself (:meth:`iterate`, PPO's updates);
    #: False: the Trainer's epochs of the training data, one step per window.
    owns_loop: bool = False

    def iterate(self, loop: TrainLoop) -> None:
        """The run's iteration, for a task that :attr:`owns_loop` (see
        :class:`~.step.TrainLoop`); the Trainer calls it instead of its epochs."""
        raise NotImplementedError(f"task {self.name} does not own its loop")

    def training_step(self, ctx: StepContext) -> None:
        """One optimizer step on ``ctx``'s micro-batches (see :mod:`.step`); by default the
        supervised step with this task's loss."""

        supervised_step(ctx, self.loss)

    def metric(self, key: str) -> Metric:
        """The metric called ``key``."""
        for metric in self.metrics:
            if metric.key == key:
                return metric
        raise KeyError(key)

    @property
    def delta_field(self) -> str:
        """compare.json's name for the difference to the baseline (``delta_acc_pp``)."""
        return f"delta_{self.primary.key}_{self.delta_unit}"

    def format_delta(self, delta: float | None) -> str:
        """A difference as reports show it (``+0.25 pp``, ``+1.3 %``)."""
        if delta is None:
            return "-"
        return f"{delta:+.2f} pp" if self.delta_unit == "pp" else f"{delta * 100:+.2f} %"

    def format_tolerance(self, tolerance: float) -> str:
        """The tolerance as reports show it (``±0.5 pp``, ``±2 %``)."""
        return f"±{tolerance:g} pp" if self.delta_unit == "pp" else f"±{tolerance * 100:g} %"

    @property
    def primary(self) -> Metric:
        """The metric that ``compare`` judges and summaries show first."""
        return self.metrics[0]

    @abstractmethod
    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean training loss of a batch."""

    @abstractmethod
    def start_eval(self, device: torch.device) -> EvalSums:
        """A fresh accumulator for one evaluation pass on ``device``."""

    @abstractmethod
    def finish_eval(self, sums: EvalSums, gather: Any, loss: float, samples: int) -> EvalResult:
        """The pass's result; ``gather(tensor)`` concatenates a tensor over all processes."""

    # ------------------------------------------------------- checks (optional)
    def close(self) -> None:  # noqa: B027  (optional hook)
        """Release what the task opened for a run (environments); called when it ends."""

    def check_data(self, data: Any, keyword: str) -> None:  # noqa: B027  (optional hook)
        """Refuse data this task cannot train on (once, at set-up), naming ``keyword``.
        Every built-in task refuses what it cannot learn from; the default takes any data."""

    def check_outputs(self, outputs: torch.Tensor | None, targets: Any, *,  # noqa: B027
                      model_name: str | None, all_targets: torch.Tensor | None) -> None:
        """Refuse a model whose outputs do not fit the targets (once, before the first
        loss). The default takes any outputs its :meth:`loss` accepts."""

    # ------------------------------------------------------- eval/ reports
    def report(self, result: EvalResult) -> dict[str, Any]:
        """eval/report.json's content: by default the loss, the samples and the metrics."""
        return {"loss": result.loss, "samples": result.samples, **result.metrics}

    def report_text(self, result: EvalResult) -> tuple[str, str]:
        """(file name, text) of the readable report in eval/: by default
        ``<name>_report.txt`` with each metric as :meth:`Metric.format` shows it."""
        lines = [f"{self.name} report ({result.samples} samples)", "",
                 f"  loss  {result.loss:.4f}"]
        lines += [f"  {metric.label}  {metric.format(result.metrics.get(metric.key))}"
                  for metric in self.metrics]
        return f"{self.name}_report.txt", "\n".join(lines + [""])

    def learning_note(self, result: EvalResult) -> str | None:
        """One line for the end of a run whose final validation metrics show the model
        learnt (next to) nothing -- a regression's R² near 0, a classifier at chance --
        in this task's terms; None when it learnt, or when the task cannot tell."""
        return None

    def write_files(self, result: EvalResult, directory: Path) -> None:  # noqa: B027
        """Further files of the evaluation's report in ``directory`` (the GAN's
        samples.png), written after report.json. Nothing by default."""

    def judge(self, value: float | None, baseline: float | None, tolerance: float
              ) -> tuple[float | None, str | None]:
        """(difference to the baseline, verdict ok/worse/better) on the primary metric."""
        if value is None or baseline is None:
            return None, None
        delta = self.difference(value, baseline)
        return delta, self.verdict(delta, tolerance)

    def verdict(self, delta: float | None, tolerance: float) -> str | None:
        """``ok`` within the tolerance, else ``worse`` or ``better`` in the metric's
        direction; None without a difference."""
        if delta is None:
            return None
        if abs(delta) <= tolerance + 1e-9:
            return "ok"
        better = delta > 0 if self.primary.higher_is_better else delta < 0
        return "better" if better else "worse"

    def difference(self, value: float, baseline: float) -> float:
        """How ``compare`` measures the distance to the baseline (tolerance units): the
        relative change for "rel" tasks (0.02 = 2 % higher than the baseline)."""
        if self.delta_unit == "rel":
            return (value - baseline) / abs(baseline) if baseline else float("inf")
        return value - baseline

