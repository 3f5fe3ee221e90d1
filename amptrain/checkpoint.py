"""Checkpoint files: written atomically, validated when read.

A checkpoint is a dict saved with ``torch.save``; ``format`` marks it as ours. Weights
are always fp32 (master copies where the precision keeps them), so a checkpoint loads
in any precision and without the libraries a precision needed.
"""
from __future__ import annotations

import os
import pickle
import re
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch

from .errors import UserError

FORMAT = "amptrain-checkpoint"
FORMAT_VERSION = 1
_STEP_FILE = re.compile(r"step-(\d+)\.pt$")


def atomic_save(state: dict[str, Any], path: str | Path) -> None:
    """Write ``state`` to ``path`` so that a crash leaves either the old file or the new one.

    The bytes go to a temporary file in the same directory, are fsynced, and then
    renamed over the target; the directory is fsynced so the rename itself survives.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with _suppress():
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return True


def load(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read and validate an amptrain checkpoint; any problem is a one-line UserError."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"checkpoint {path}: no such file")
    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError,
            OSError, AttributeError, ImportError, IndexError, KeyError, TypeError) as exc:
        raise UserError(f"checkpoint {path}: unreadable, truncated or not a PyTorch file "
                        f"({type(exc).__name__})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UserError(f"checkpoint {path}: not an amptrain checkpoint")
    if state.get("format_version", 0) > FORMAT_VERSION:
        raise UserError(f"checkpoint {path}: written by a newer amptrain "
                        f"(format {state.get('format_version')}); upgrade amptrain")
    return state


def step_checkpoints(directory: str | Path) -> list[Path]:
    """``step-N.pt`` files in ``directory``, oldest step first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _STEP_FILE.search(p.name))]
    return [p for _, p in sorted(found)]


def save_run_checkpoint(state: dict[str, Any], directory: str | Path, step: int,
                        keep_last: int) -> Path:
    """Write ``last.pt`` atomically, keep it as ``step-N.pt`` too, prune old step files.

    ``step-N.pt`` is a hard link to the new ``last.pt`` (one write, not two); the next
    save replaces ``last.pt`` with a new file and the link keeps the old bytes.
    """
    directory = Path(directory)
    last = directory / "last.pt"
    atomic_save(state, last)
    if keep_last > 0:
        _link_or_copy(last, directory / f"step-{step}.pt")
    prune(directory, keep_last)
    return last


def _link_or_copy(source: Path, target: Path) -> None:
    tmp = target.with_name(f".{target.name}.link")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:  # file systems without hard links
        import shutil

        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def prune(directory: str | Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` step-N.pt files."""
    files = step_checkpoints(directory)
    for old in files[:max(0, len(files) - keep_last)]:
        old.unlink(missing_ok=True)
