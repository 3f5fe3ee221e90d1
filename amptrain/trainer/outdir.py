"""The output directory (``--out``) of every command: a place that can be written and
holds nothing that the command would replace.

One rule for every command: amptrain never replaces a file it did not write in this
invocation. Each command names what it writes (:data:`TRAIN_OUTPUTS`, ...); :func:`claim`
refuses an ``--out`` where one of those entries exists already (or has the wrong kind: a
file where a directory goes), before anything is built or written, so a bad ``--out``
costs the user one line instead of a traceback after training, and an earlier run, an
earlier report or the user's own file is never overwritten. Only ``train --resume``
continues what its own earlier invocation wrote.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from ..errors import UserError, flag

#: Files whose presence means a directory already holds a run.
RUN_MARKERS = ("checkpoints/last.pt", "metrics.jsonl")

#: What each command writes into its ``--out`` (a trailing "/" marks a directory).
TRAIN_OUTPUTS = ("config.yaml", "metrics.jsonl", "tb/", "checkpoints/", "eval/")
EVAL_OUTPUTS = ("eval/",)
DIAGNOSE_OUTPUTS = ("diagnose.json", "diagnose.md")
COMPARE_OUTPUTS = ("compare.json", "study.json", "report.md", "report.html", "compare.png",
                   "runs/")


def holds_run(out: Path) -> bool:
    """True when ``out`` already holds a training run's checkpoint or metrics."""
    return any((out / marker).exists() for marker in RUN_MARKERS)


def check(out: str | os.PathLike[str], *, resume: bool) -> Path:
    """Raise :class:`UserError` naming ``--out`` when ``out`` cannot hold a new run.

    ``out`` must be a directory or not exist yet; the nearest existing folder on its
    path must not be a file and must be writable; without ``resume`` it must not hold
    a run already, nor any other entry a run writes. Nothing is created.
    """
    path = _writable(out)
    _check_entries(path, TRAIN_OUTPUTS, replace_allowed=True)  # kinds first
    if not resume and path.is_dir() and holds_run(path):
        raise UserError(f"{flag('out')} {path} already holds a run; continue it with "
                        f"{flag('resume')} auto or choose another {flag('out')}")
    _check_entries(path, TRAIN_OUTPUTS, replace_allowed=resume)
    return path


def claim(out: str | os.PathLike[str], outputs: tuple[str, ...]) -> Path:
    """Check that ``out`` can take a command's ``outputs`` without replacing anything
    (see the module's rule). Raises :class:`UserError` naming ``--out``; creates nothing."""
    path = _writable(out)
    _check_entries(path, outputs, replace_allowed=False)
    return path


def _check_entries(path: Path, outputs: tuple[str, ...], *, replace_allowed: bool) -> None:
    """Each entry a command writes is absent, an empty directory, or (``replace_allowed``:
    a resumed run's own outputs) of the kind the command writes."""
    if not path.is_dir():
        return
    for entry in outputs:
        target = path / entry.rstrip("/")
        if not (target.exists() or target.is_symlink()):
            continue
        wants_dir = entry.endswith("/")
        if wants_dir != target.is_dir():
            have, want = ("a directory", "a file") if target.is_dir() else ("a file" if
                          target.is_file() else "not a regular file", "a directory")
            raise UserError(f"{flag('out')} {path}: {target} is {have}, but amptrain writes "
                            f"{want} there; move it away or choose another {flag('out')}")
        if replace_allowed or (wants_dir and not any(target.iterdir())):
            continue
        raise UserError(f"{flag('out')} {path} already holds {entry}, which this command "
                        f"would replace (amptrain never overwrites what it did not write in "
                        f"this invocation); choose another {flag('out')}")


def _writable(out: str | os.PathLike[str]) -> Path:
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
    return path


def prepare(out: str | os.PathLike[str], *, resume: bool) -> Path:
    """:func:`check`, then create the directory (one line naming ``--out`` if that fails)."""
    return _make(check(out, resume=resume))


def _make(path: Path) -> Path:
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
