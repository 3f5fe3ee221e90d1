"""Experiment trackers: where each metrics record goes besides ``metrics.jsonl``.

``--logger tensorboard,mlflow,csv`` (default ``tensorboard``; ``none`` for no tracker)
picks them. Each tracker is one module here with a :class:`~.base.Sink` subclass and a
``create(out, resumed_at, params)`` factory, registered by its line in :data:`SINKS`:
adding W&B is ``wandb.py`` plus ``"wandb": "wandb"`` below. Modules are imported only
when chosen, so an uninstalled tracker costs nothing (and this module imports no torch:
the config validates names against :data:`SINKS`).
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from ..common.errors import UserError, flag
from ..common.outdir import TRAIN_OUTPUTS

#: tracker name -> module of this package (its ``create`` builds the sink).
SINKS: dict[str, str] = {
    "tensorboard": "tensorboard",
    "mlflow": "mlflow_sink",
    "csv": "csv_sink",
}
NONE = "none"
DEFAULT = "tensorboard"
#: What each tracker writes into the run directory (a trailing "/" marks a directory):
#: ``train`` refuses an ``--out`` where one of them exists already (trainer/outdir.py).
SINK_OUTPUTS: dict[str, tuple[str, ...]] = {
    "tensorboard": ("tb/",),
    "mlflow": ("mlruns/",),
    "csv": ("metrics.csv",),
}
#: The package a tracker needs, and how to install it (checked before a run writes).
SINK_PACKAGES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "pip install tensorboard"),
    "mlflow": ("mlflow", "pip install 'amptrain[mlflow]' (mlflow-skinny is enough)"),
}


def parse_names(value: str | list[str] | tuple[str, ...]) -> list[str]:
    """``"tensorboard,mlflow"`` (or a list) -> checked names; ``none`` -> []."""
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    names = list(dict.fromkeys(n.strip().lower() for n in items if n.strip()))
    if names == [NONE]:
        return []
    unknown = [n for n in names if n not in SINKS]
    if unknown or not names:
        raise UserError(f"{flag('logger')} {','.join(unknown) or repr(value)}: choose from "
                        f"{', '.join(SINKS)} (comma-separated), or {NONE}")
    return names


def check_installed(names: list[str]) -> None:
    """Refuse a chosen tracker whose package is not installed, naming ``--logger``: before
    the run writes anything (not after config.yaml and metrics.jsonl)."""
    import importlib.util

    for name in names:
        package, how = SINK_PACKAGES.get(name, ("", ""))
        try:
            found = importlib.util.find_spec(package) is not None if package else True
        except (ImportError, ValueError):
            found = False
        if not found:
            raise UserError(f"{flag('logger')} {name} needs {package}, which is not "
                            f"installed: {how}, or choose another {flag('logger')}")


def build_sinks(names: list[str], out: Path, *, resumed_at: int | None = None,
                params: dict[str, Any] | None = None) -> list[Any]:
    """The chosen trackers, writing under ``out``."""
    return [importlib.import_module(f"{__name__}.{SINKS[name]}").create(
        out, resumed_at=resumed_at, params=params or {}) for name in names]


def train_outputs(loggers: str | list[str] | tuple[str, ...] = "tensorboard"
                  ) -> tuple[str, ...]:
    """What ``train`` writes: :data:`TRAIN_OUTPUTS` and each chosen tracker's files
    (``--logger csv``: metrics.csv; mlflow: mlruns/). A tracker whose package is missing
    is refused here, so before the run writes anything."""
    names = parse_names(loggers)
    check_installed(names)
    extra = [entry for name in names for entry in SINK_OUTPUTS[name]]
    return tuple(dict.fromkeys((*TRAIN_OUTPUTS, *extra)))
