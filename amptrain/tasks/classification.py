"""Classification: cross-entropy, accuracy, sklearn's classification report, and compare's
verdict in percentage points of accuracy (``--tolerance-pp``)."""
from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from ..common.errors import UserError, flag
from .base import (DataChecks, EvalResult, EvalSums, Metric, Metrics, Reports, Task, Wording,
                   targets_of)

log = logging.getLogger("amptrain")

#: A classifier within this share of the way from chance to 100 % is "at chance" at the end.
CHANCE_MARGIN = 0.05


class _Predictions(EvalSums):
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.predictions: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []

    def update(self, outputs: torch.Tensor | None, targets: Any) -> None:
        if outputs is not None and isinstance(targets, torch.Tensor):
            self.predictions.append(outputs.argmax(dim=-1).flatten())
            self.targets.append(targets.flatten())


class _LabelChecks(DataChecks):
    """Class labels in range, a logit per class, and a word on unseen validation classes."""

    def __init__(self, class_names: list[str] | None = None) -> None:
        self.class_names = class_names
        self._train_classes: set[int] | None = None

    def check_data(self, data: Any, keyword: str) -> None:
        labels = targets_of(data)
        if labels is not None:
            if labels.ndim > 1 and getattr(data, "task", None) == "lm":
                raise UserError(f"{keyword} holds next-token sequences (language-model data); "
                                f"train it with {flag('task')} lm")
            check_labels(labels, keyword, self.class_names)
            self._check_unseen(labels, keyword)

    def _check_unseen(self, labels: torch.Tensor, keyword: str) -> None:
        """Say once when validation classes never occur in training: they are counted as
        errors in val_acc, and nothing else would tell why the accuracy is low."""
        if labels.is_floating_point() or labels.ndim != 1:
            return
        if keyword == "train_data":
            self._train_classes = set(labels.unique().tolist())
            return
        seen = self._train_classes
        if keyword != "val_data" or seen is None:
            return
        unseen = sorted(set(labels.unique().tolist()) - seen)
        if unseen:
            count = int(sum(int((labels == c).sum()) for c in unseen))
            names = [self.class_names[c] if self.class_names and 0 <= c < len(self.class_names)
                     else str(c) for c in unseen]
            log.warning("warning: %d validation sample(s) are of %d class(es) that never occur "
                        "in the training data (e.g. %r): the model cannot learn them, so they "
                        "count as errors in val_acc", count, len(unseen), names[0])

    def check_outputs(self, outputs: torch.Tensor | None, targets: Any, *,
                      model_name: str | None, all_targets: torch.Tensor | None) -> None:
        if outputs is None or not isinstance(targets, torch.Tensor):
            return
        which = f" ({flag('model')} {model_name})" if model_name else ""
        if targets.is_floating_point():
            if targets.shape != outputs.shape:  # equal shapes are class probabilities
                check_labels(targets, "the training labels", None)
            return
        if outputs.ndim < 2:
            raise UserError(f"the model{which} returns shape {tuple(outputs.shape)} for a batch; "
                            f"a classifier must return one row of class logits per sample")
        if targets.ndim >= 2 and outputs.shape[:-1] == targets.shape:
            # logits per position, classes last: next-token prediction, not a classifier's
            # [batch, classes, ...] (torch's message: "Expected target size ...")
            lm = "--task lm" if flag("task").startswith("--") else 'task="lm"'
            raise UserError(f"the model{which} returns {tuple(outputs.shape)} for targets of "
                            f"{tuple(targets.shape)}: logits per position, classes last; "
                            f"for next-token prediction set {lm}")
        width = outputs.shape[-1]
        num_classes = len(self.class_names) if self.class_names else None
        if num_classes and width < num_classes:
            raise UserError(f"the model{which} returns {width} outputs per sample, but the data "
                            f"has {num_classes} classes: its last layer needs {num_classes} "
                            f"outputs")
        if all_targets is not None and not all_targets.is_floating_point():
            targets = all_targets
        if not targets.numel():
            return
        low, high = int(targets.min()), int(targets.max())  # two reads, once per run
        if low < 0 or high >= width:
            bad = low if low < 0 else high
            raise UserError(f"label {bad} is outside the model's {width} outputs{which}: the "
                            f"model must return one logit per class (classes 0..{width - 1})")

class _ChanceNote(Wording):
    """Classification's words, and its note on a classifier at chance."""

    def learning_note(self, result: EvalResult) -> str | None:
        """At chance: the accuracy of always answering the most frequent validation class
        (or 1/classes, if higher), plus a margin of 5 % of the rest."""
        targets = result.details.get("targets")
        accuracy = result.metrics.get("acc")
        if accuracy is None or targets is None or not len(targets) \
                or not np.issubdtype(np.asarray(targets).dtype, np.integer):
            return None  # soft labels (class probabilities) have no majority class
        classes = max(len(result.details.get("class_names") or ()), 1)
        majority = float(np.bincount(np.asarray(targets, dtype=np.int64)).max() / len(targets))
        chance = max(majority, 1.0 / classes)
        if accuracy > chance + CHANCE_MARGIN * (1.0 - chance):
            return None
        return (f"the model has not learnt: val accuracy {accuracy:.1%} is at chance (always "
                f"answering the most frequent class scores {majority:.1%}, {classes} classes); "
                f"train longer ({flag('max_steps')} or {flag('epochs')}), raise {flag('lr')}, "
                f"or check the labels")

class _ClassificationReports(Reports):
    """sklearn's classification report (and the confusion matrix in report.json)."""

    def report(self, result: EvalResult) -> dict[str, Any]:
        """sklearn's classification_report as a dict, plus the confusion matrix."""
        from sklearn.metrics import classification_report, confusion_matrix

        d = result.details
        labels = list(range(len(d["class_names"])))
        report = classification_report(d["targets"], d["predictions"], labels=labels,
                                       target_names=d["class_names"], output_dict=True,
                                       zero_division=0)
        return {"accuracy": result.metrics["acc"], "loss": result.loss, "samples": result.samples,
                "class_names": d["class_names"], "classification_report": report,
                "confusion_matrix": confusion_matrix(d["targets"], d["predictions"],
                                                     labels=labels).tolist()}

    def report_text(self, result: EvalResult) -> tuple[str, str]:
        from sklearn.metrics import classification_report

        d = result.details
        header = (f"accuracy {result.metrics['acc']:.4f}  loss {result.loss:.4f}  "
                  f"samples {result.samples}\n\n")
        text = classification_report(d["targets"], d["predictions"],
                                     labels=list(range(len(d["class_names"]))),
                                     target_names=d["class_names"], digits=4, zero_division=0)
        return "classification_report.txt", header + text

class ClassificationTask(Task):
    """Integer class labels, logits out; accuracy is the primary metric."""

    name = "classification"
    metrics = Metrics(Metric("acc", "accuracy", higher_is_better=True, percent=True))
    # compare's verdict: the default, percentage points of accuracy (the A/B rule's unit).
    wording = _ChanceNote(data_holds="class labels",
                          data_needs="classification needs class labels",
                          output_noun="classes", first_line="")  # the default task: unsaid
    reports = _ClassificationReports()
    checks = _LabelChecks()

    def __init__(self, class_names: list[str] | None = None, **_: Any) -> None:
        self.class_names = list(class_names) if class_names else None
        self.checks = _LabelChecks(self.class_names)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets)

    # -------------------------------------------------------------- evaluation
    def start_eval(self, device: torch.device) -> EvalSums:
        return _Predictions(device)

    def finish_eval(self, sums: EvalSums, gather: Any, loss: float, samples: int) -> EvalResult:
        assert isinstance(sums, _Predictions)
        nothing = torch.empty(0, dtype=torch.long, device=sums.device)
        # Every rank joins the gathers, also one whose share of the data was empty.
        pred = gather(torch.cat(sums.predictions) if sums.predictions else nothing)
        target = gather(torch.cat(sums.targets) if sums.targets else nothing)
        y_pred, y_true = pred.cpu().numpy(), target.cpu().numpy()
        num_classes = len(self.class_names) if self.class_names else \
            int(max(y_true.max(initial=0), y_pred.max(initial=0)) + 1)
        names = class_names_for(num_classes, self.class_names)
        accuracy = float((y_pred == y_true).mean()) if len(y_true) else 0.0
        return EvalResult(loss=loss, samples=len(y_true), metrics={"acc": accuracy},
                          details={"predictions": y_pred, "targets": y_true,
                                   "class_names": names}, task=self)

def check_labels(labels: torch.Tensor, keyword: str, class_names: list[str] | None) -> None:
    """Integer class indices in ``0..C-1`` (C = ``len(class_names)`` when given)."""
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise UserError(f"{keyword}: labels are {str(labels.dtype).replace('torch.', '')}, but "
                        f"a classifier's cross-entropy needs integer class indices; for "
                        f"measurements use {flag('task')} regression (or convert class "
                        f"labels with .long())")
    if labels.numel() == 0:
        return
    low, high = int(labels.min()), int(labels.max())
    if low < 0:
        raise UserError(f"{keyword}: label {low} is negative; classes are numbered from 0")
    if class_names and high >= len(class_names):
        raise UserError(f"{keyword}: label {high} is outside the {len(class_names)} classes "
                        f"named by class_names (0..{len(class_names) - 1})")


def class_names_for(num_classes: int, names: list[str] | None) -> list[str]:
    """The given class names, or "0".."C-1"."""
    return list(names) if names else [str(i) for i in range(num_classes)]


__all__ = ["ClassificationTask", "check_labels", "class_names_for"]
