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

from ..errors import UserError, flag

#: tracker name -> module of this package (its ``create`` builds the sink).
SINKS: dict[str, str] = {
    "tensorboard": "tensorboard",
    "mlflow": "mlflow_sink",
    "csv": "csv_sink",
}
NONE = "none"
DEFAULT = "tensorboard"


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


def build_sinks(names: list[str], out: Path, *, resumed_at: int | None = None,
                params: dict[str, Any] | None = None) -> list[Any]:
    """The chosen trackers, writing under ``out``."""
    return [importlib.import_module(f"{__name__}.{SINKS[name]}").create(
        out, resumed_at=resumed_at, params=params or {}) for name in names]
