"""A finished compare study as read back from its directory, and the number formatting
every report shares.

Everything a report shows comes from what the study left on disk (``compare.json``,
``study.json`` and each run's ``metrics.jsonl``), so a report can be re-rendered without
re-running the study.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..precision.hardware.advice import base_mode
from ..precision.modes import as_given
from ..tasks import TASKS, Task, delta_field, task_of_summary
from ..common.tolerance import tolerance_for

#: Stable colours for the usual precisions; others take the next free one.
#: (Here rather than in plots.py: :meth:`Study.colour` picks from them, and the HTML table's
#: swatches must match the plots' colours.)
_COLOURS = {"32-true": "#4c566a", "tf32": "#8f6fb3", "16-mixed": "#e07b39",
            "bf16-mixed": "#2f7fc1", "16-master": "#c9a227", "bf16-master": "#3aa39a",
            "16-true": "#c44e52", "bf16-true": "#55a868", "fp8": "#a05195"}
_SPARE = ["#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd"]


@dataclass
class Curves:
    """One run's logged series."""

    steps: list[int] = field(default_factory=list)
    loss: list[float | None] = field(default_factory=list)
    loss_scale: list[float | None] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val_primary: list[float] = field(default_factory=list)   # the task's primary metric


@dataclass
class Study:
    """A finished compare study as read back from its directory."""

    out: Path
    compare: dict[str, Any]
    details: dict[str, Any]
    curves: dict[str, dict[int, Curves]]   # precision -> seed -> series

    @property
    def baseline(self) -> str:
        return self.compare["baseline"]

    @property
    def summary(self) -> list[dict[str, Any]]:
        return self.compare["summary"]

    @property
    def emulated(self) -> set[str]:
        """Precisions of this study that its device only emulated (from study.json's env)."""
        marks = (self.details.get("env") or {}).get("emulated") or {}
        return {p for p in self.precisions if marks.get(base_mode(p))}  # rungs by their mode

    @property
    def precisions(self) -> list[str]:
        return [row["precision"] for row in self.summary]

    @property
    def given(self) -> dict[str, str]:
        """Precision -> the alias the study was asked for it by (``float32``), from study.json."""
        options = self.details.get("options") or {}
        names = str(options.get("precisions") or "").split(",") + [str(options.get("baseline"))]
        return as_given(names)

    @property
    def names(self) -> dict[str, str]:
        """Precision -> the name its row is shown by where that is not the precision itself
        (the low-bit settings it ran with: ``mxfp4 rceil``), from study.json."""
        return dict(self.details.get("row_names") or {})

    def name_of(self, precision: str) -> str:
        """Row ``precision``'s displayed name (:attr:`names`; else the precision)."""
        return self.names.get(precision, precision)

    @property
    def task(self) -> Task:
        """The task the study's runs learnt: study.json's, else told by the summary's
        metric fields (:func:`task_of`)."""
        name = (self.details.get("task") or {}).get("name")
        return TASKS[name]() if name in TASKS else task_of(self.summary)

    @property
    def tolerance(self) -> float:
        """The verdict's tolerance in the task's unit (``--tolerance-pp`` or
        ``--tolerance-rel``): the one study.json says judged the verdicts, else the option
        as given, else the task's default (:func:`~amptrain.common.tolerance.tolerance_for`)."""
        recorded = (self.details.get("task") or {}).get("tolerance")
        if isinstance(recorded, (int, float)):
            return float(recorded)
        return self._resolved().value

    @property
    def tolerance_why(self) -> str:
        """Why the verdicts' tolerance is this value (study.json's ``task.tolerance_why``,
        else worked out again from the options)."""
        why = (self.details.get("task") or {}).get("tolerance_why")
        return str(why) if why else self._resolved().why

    def _resolved(self) -> Any:
        options = self.details.get("options") or {}
        return tolerance_for(self.task, options.get(self.task.verdict.tolerance_option))

    def colour(self, precision: str) -> str:
        if precision in _COLOURS:
            return _COLOURS[precision]
        others = [p for p in self.precisions if p not in _COLOURS]
        return _SPARE[others.index(precision) % len(_SPARE)] if precision in others else "#333"


def task_of(summary: list[dict[str, Any]] | dict[str, Any]) -> Task:
    """The task whose metric a summary (or one row) carries
    (:func:`amptrain.tasks.task_of_summary`: told by its ``delta_*`` field)."""
    return task_of_summary(summary)


def metric_cell(row: dict[str, Any], task: Task | None = None) -> str:
    """The primary metric of a summary row, mean ± std (``97.50 ± 0.20 %``, ``3.21 ± 0.01``)."""
    task = task or task_of(row)
    key = task.metrics.primary.key
    mean, std = row.get(f"val_{key}_mean"), row.get(f"val_{key}_std")
    if mean is None:
        return "n/a"
    if task.metrics.primary.percent:
        return f"{mean * 100:.2f} ± {(std or 0) * 100:.2f} %"
    return f"{mean:.4g} ± {(std or 0):.2g}"


def run_metric_cell(run: dict[str, Any], task: Task) -> str:
    """One run's primary metric for the runs tables ("halted" for a run that stopped)."""
    if run.get("halted"):
        return "halted"
    value = run.get(f"val_{task.metrics.primary.key}")
    return "n/a" if value is None else task.metrics.primary.format(value)


def delta_of(row: dict[str, Any], task: Task | None = None) -> float | None:
    """A summary row's difference to the baseline on the primary metric."""
    return row.get(delta_field(task or task_of(row)))


# ------------------------------------------------------------------ loading
#: Every task's primary metric as metrics.jsonl names it.
_PRIMARY = tuple(f"val_{cls.metrics[0].key}" for cls in TASKS.values())


def read_curves(metrics_file: Path) -> Curves:
    """Train and eval series of one run's metrics.jsonl (missing file: empty series)."""
    curves = Curves()
    if not metrics_file.exists():
        return curves
    for line in metrics_file.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if "loss" in record:
            curves.steps.append(record["step"])
            curves.loss.append(record["loss"])
            curves.loss_scale.append(record.get("loss_scale"))
        primary = next((k for k in _PRIMARY if record.get(k) is not None), None)
        if primary is not None:
            curves.val_steps.append(record["step"])
            curves.val_primary.append(record[primary])
    return curves


def load_study(out: str | Path) -> Study:
    """Read compare.json, study.json and every run's metrics from a study directory."""
    out = Path(out)
    compare = json.loads((out / "compare.json").read_text())
    details_file = out / "study.json"
    details = json.loads(details_file.read_text()) if details_file.exists() else {}
    curves: dict[str, dict[int, Curves]] = {}
    for run in compare.get("runs", []):
        run_dir = out / run.get("dir", f"runs/{run['precision']}/seed-{run['seed']}")
        curves.setdefault(run["precision"], {})[run["seed"]] = read_curves(
            run_dir / "metrics.jsonl")
    return Study(out, compare, details, curves)


#: Where a run's evaluation leaves its sample grid (a generative task's eval/samples.png).
SAMPLES_PNG = "eval/samples.png"


def sample_grids(study: Study) -> list[tuple[str, dict[str, Any], Path]]:
    """(precision, run, path) of each precision's first run (lowest seed) that left a
    sample grid (:data:`SAMPLES_PNG`), in the summary's order; empty when no run did."""
    grids = []
    runs = study.compare.get("runs", [])
    for p in study.precisions:
        for run in sorted((r for r in runs if r["precision"] == p), key=lambda r: r["seed"]):
            png = study.out / run.get("dir", f"runs/{p}/seed-{run['seed']}") / SAMPLES_PNG
            if png.is_file():
                grids.append((p, run, png))
                break
    return grids


# --------------------------------------------------------------- formatting
def human_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB'; None -> 'n/a'."""
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _num(value: float | None, fmt: str, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{fmt}}{suffix}"
