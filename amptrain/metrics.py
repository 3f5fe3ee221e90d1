"""Evaluation results: accuracy, loss, sklearn's classification report, confusion matrix."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np


@dataclass
class EvalResult:
    """Validation metrics of one evaluation pass."""

    loss: float
    accuracy: float
    samples: int
    predictions: np.ndarray = field(repr=False)
    targets: np.ndarray = field(repr=False)
    class_names: list[str] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        """sklearn's classification_report as a dict, plus the confusion matrix."""
        from sklearn.metrics import classification_report, confusion_matrix

        labels = list(range(len(self.class_names)))
        report = classification_report(self.targets, self.predictions, labels=labels,
                                       target_names=self.class_names, output_dict=True,
                                       zero_division=0)
        return {"accuracy": self.accuracy, "loss": self.loss, "samples": self.samples,
                "class_names": self.class_names, "classification_report": report,
                "confusion_matrix": confusion_matrix(self.targets, self.predictions,
                                                     labels=labels).tolist()}

    def report_text(self) -> str:
        """sklearn's classification_report as text."""
        from sklearn.metrics import classification_report

        return classification_report(self.targets, self.predictions,
                                     labels=list(range(len(self.class_names))),
                                     target_names=self.class_names, digits=4, zero_division=0)

    def write(self, directory: str | Path) -> None:
        """Write ``classification_report.txt`` and ``report.json`` into ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        header = f"accuracy {self.accuracy:.4f}  loss {self.loss:.4f}  samples {self.samples}\n\n"
        (directory / "classification_report.txt").write_text(header + self.report_text())
        (directory / "report.json").write_text(json.dumps(self.report(), indent=2))


def class_names_for(num_classes: int, names: Sequence[str] | None) -> list[str]:
    """The given class names, or "0".."C-1"."""
    return list(names) if names else [str(i) for i in range(num_classes)]
