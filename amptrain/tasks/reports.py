"""A task's part that writes the evaluation's report (``eval/``): report.json's content,
the readable report and any further files (:class:`Reports`)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import EvalResult


class Reports:
    """The default reports: the loss, the samples and every metric as it formats itself."""

    def report(self, result: EvalResult) -> dict[str, Any]:
        """eval/report.json's content: by default the loss, the samples and the metrics."""
        return {"loss": result.loss, "samples": result.samples, **result.metrics}

    def report_text(self, result: EvalResult) -> tuple[str, str]:
        """(file name, text) of the readable report in eval/: by default
        ``<task>_report.txt`` with each metric as :meth:`Metric.format` shows it."""
        task = result.task
        name = task.name if task is not None else "task"
        lines = [f"{name} report ({result.samples} samples)", "",
                 f"  loss  {result.loss:.4f}"]
        lines += [f"  {metric.label}  {metric.format(result.metrics.get(metric.key))}"
                  for metric in (task.metrics if task is not None else ())]
        return f"{name}_report.txt", "\n".join(lines + [""])

    def write_files(self, result: EvalResult, directory: Path) -> None:  # noqa: B027
        """Further files of the evaluation's report in ``directory`` (the GAN's
        samples.png), written after report.json. Nothing by default."""


__all__ = ["Reports"]
