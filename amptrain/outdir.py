"""The run directory (``--out``): a place that can be written and holds no other run.

Checked before anything is built or written, so a bad ``--out`` costs the user one line
instead of a traceback after the data has loaded, and an earlier run is never mixed
into (or overwritten by) a new one.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from .errors import UserError, flag

#: Files whose presence means a directory already holds a run.
RUN_MARKERS = ("checkpoints/last.pt", "metrics.jsonl")


def holds_run(out: Path) -> bool:
    """True when ``out`` already holds a training run's checkpoint or metrics."""
    return any((out / marker).exists() for marker in RUN_MARKERS)


def check(out: str | os.PathLike[str], *, resume: bool) -> Path:
    """Raise :class:`UserError` naming ``--out`` when ``out`` cannot hold a new run.

    ``out`` must be a directory or not exist yet; the nearest existing folder on its
    path must not be a file and must be writable; without ``resume`` it must not hold
    a run already. Nothing is created.
    """
    path = Path(out)
    name = f"{flag('out')} {path}"
    if path.exists() and not path.is_dir():
        raise UserError(f"{name} is a file, not a directory: choose another {flag('out')}")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise UserError(f"{name}: {existing} is a file, so no directory can be made under it")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{name}: {existing} is not writable; choose a directory you can write")
    if not resume and path.is_dir() and holds_run(path):
        raise UserError(f"{name} already holds a run; continue it with "
                        f"{flag('resume')} auto or choose another {flag('out')}")
    return path


def prepare(out: str | os.PathLike[str], *, resume: bool) -> Path:
    """:func:`check`, then create the directory (one line naming ``--out`` if that fails)."""
    path = check(out, resume=resume)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{flag('out')} {path}: cannot create it "
                        f"({exc.strerror or type(exc).__name__})") from None
    return path


def check_on_main(out: str | os.PathLike[str], *, resume: bool, is_main: bool,
                  broadcast: Callable[[Any], Any]) -> None:
    """:func:`check` on the main process, whose verdict every process follows.

    Each process checking for itself would race: rank 0 may already have written
    metrics.jsonl into ``out`` when a slower rank looks, and that rank would then refuse
    the very run it belongs to.
    """
    problem = None
    if is_main:
        try:
            check(out, resume=resume)
        except UserError as exc:
            problem = str(exc)
    problem = broadcast(problem)
    if problem:
        raise UserError(problem)
