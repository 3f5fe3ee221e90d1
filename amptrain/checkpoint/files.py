"""Checkpoint files on disk: written atomically, validated when read.

A checkpoint is a dict saved with ``torch.save``; ``format`` marks it as ours. Everything
in it is a tensor or a plain Python value, so it is read with ``weights_only=True``:
opening a file never runs code from it. A write goes to a temporary file that replaces
the target only once complete, so a crash or a full disk leaves the previous checkpoint
intact; a run keeps ``last.pt`` and the newest ``step-N.pt`` files next to it.
"""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
import re
import secrets
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import torch

from ..common.errors import AmptrainError, UserError
from ..common.pathkind import not_regular_reason, write_failure
from .sections import check_sections

log = logging.getLogger("amptrain")

FORMAT = "amptrain-checkpoint"
#: The file's layout: 2 keeps each part's state in its own versioned section (see
#: :mod:`.registry`); a file of layout 1 is still read (its sections at version 0).
FORMAT_VERSION = 2
CHECKPOINT_DIR = "checkpoints"
LAST = "last.pt"
_STEP_FILE = re.compile(r"step-(\d+)\.pt$")
# Leftovers of a write that never finished: atomic_save's temporary file, _link_or_copy's link.
_UNFINISHED = re.compile(r"^\..+\.pt\.(?:[^.]+\.tmp|link)$")
_ZIP_MAGIC = b"PK\x03\x04"

#: Fault injection for tests: ``N`` or ``N:SECONDS`` pauses the N-th checkpoint write of
#: the process for SECONDS (default 120) after its first bytes reach the temporary file,
#: so that a test can kill a real training process in the middle of a save.
SLOW_SAVE_ENV = "AMPTRAIN_FAULT_SLOW_SAVE"
_writes_started = 0


class CheckpointWriteError(AmptrainError):
    """A checkpoint could not be written (disk full, no permission); the old one is intact."""

    exit_code = 1


# ------------------------------------------------------------------- writing
def atomic_save(state: dict[str, Any], path: str | Path) -> None:
    """Write ``state`` to ``path`` so that a crash leaves either the old file or the new one.

    The bytes go to a temporary file in the same directory, are fsynced, and then
    renamed over the target; the directory is fsynced so the rename itself survives.
    A failed write (disk full, read-only directory) removes the temporary file and
    raises :class:`CheckpointWriteError`; ``path`` is untouched.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = _create_temporary(path)
    except OSError as exc:
        raise CheckpointWriteError(_write_failure(path, exc)) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            _write(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        # torch.save reports a failed write() of the file object as a RuntimeError whose
        # context is the real error: the OSError (disk full), or the SystemExit /
        # KeyboardInterrupt of a second signal, which must keep ending the process.
        cause = _root_cause(exc)
        if not isinstance(cause, Exception):
            raise cause from None
        if isinstance(cause, OSError):
            raise CheckpointWriteError(_write_failure(path, cause)) from None
        raise
    with contextlib.suppress(OSError):  # the file is in place; some file systems refuse this
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _create_temporary(path: Path) -> tuple[int, str]:
    """A new file next to ``path``. Unlike ``mkstemp`` (mode 0600) it gets the umask's
    permissions, so the checkpoint is as readable as any other file the user writes."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), str(tmp)
        except FileExistsError:
            continue


def _root_cause(exc: BaseException) -> BaseException:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) or not isinstance(seen, Exception):
            return seen
        seen = seen.__cause__ or seen.__context__
    return exc


def _write_failure(path: Path, exc: OSError) -> str:
    kept = (f"the previous checkpoint {path} is intact" if path.exists()
            else "no earlier checkpoint was there")
    return (f"could not write checkpoint {write_failure(path, exc).removeprefix('cannot write ')}"
            f"; {kept}. Free disk space or make {path.parent} writable, then continue with "
            f"--resume auto")


def _write(state: dict[str, Any], handle: BinaryIO) -> None:
    """``torch.save`` into an open file (the seam that fault-injection tests patch)."""
    global _writes_started
    _writes_started += 1
    spec = os.environ.get(SLOW_SAVE_ENV)
    if spec:
        nth, _, seconds = spec.partition(":")
        if int(nth) == _writes_started:
            handle = _PausingWriter(handle, float(seconds or 120))  # type: ignore[assignment]
    with _no_crc32():
        torch.save(state, handle)


_crc32_lock = threading.Lock()
_crc32_users = 0
_crc32_before = True


@contextlib.contextmanager
def _no_crc32() -> Iterator[None]:
    """``torch.save`` without the zip CRC-32 of every record, for our own writes only.

    ``torch.load`` never checks those checksums (a flipped byte loads silently either
    way), and computing them is a large share of a save's CPU time. The option is
    process-wide (read when a file is opened for writing): it is turned off while any of
    our writes runs and put back as it was when the last one ends.
    """
    global _crc32_users, _crc32_before
    serialization = torch.serialization
    if not hasattr(serialization, "set_crc32_options"):  # torch < 2.6
        yield
        return
    with _crc32_lock:
        if _crc32_users == 0:
            _crc32_before = serialization.get_crc32_options()
            serialization.set_crc32_options(False)
        _crc32_users += 1
    try:
        yield
    finally:
        with _crc32_lock:
            _crc32_users -= 1
            if _crc32_users == 0:
                serialization.set_crc32_options(_crc32_before)


class _PausingWriter:
    """Passes bytes through, but sleeps after the first write (see :data:`SLOW_SAVE_ENV`)."""

    def __init__(self, handle: BinaryIO, seconds: float) -> None:
        self.handle, self.seconds, self.paused = handle, seconds, False

    def write(self, data: bytes) -> int:
        written = self.handle.write(data)
        if not self.paused:
            self.paused = True
            self.handle.flush()
            time.sleep(self.seconds)
        return written

    def flush(self) -> None:
        self.handle.flush()


def save_run_checkpoint(state: dict[str, Any], directory: str | Path, step: int,
                        keep_last: int) -> Path:
    """Write ``last.pt`` atomically, keep it as ``step-N.pt`` too, prune old step files.

    ``step-N.pt`` is a hard link to the new ``last.pt`` (one write, not two); the next
    save replaces ``last.pt`` with a new file and the link keeps the old bytes. Failing
    to make the step file or to prune only warns: ``last.pt`` is already safe.
    """
    directory = Path(directory)
    last = directory / LAST
    atomic_save(state, last)
    try:
        if keep_last > 0:
            _link_or_copy(last, directory / f"step-{step}.pt")
        prune(directory, keep_last)
    except OSError as exc:
        log.warning("wrote %s, but could not keep step-%d.pt or prune old ones: %s",
                    last, step, exc.strerror or exc)
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


def step_checkpoints(directory: str | Path) -> list[Path]:
    """``step-N.pt`` files in ``directory``, oldest step first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _STEP_FILE.search(p.name))]
    return [p for _, p in sorted(found)]


def prune(directory: str | Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` step-N.pt files."""
    files = step_checkpoints(directory)
    for old in files[:max(0, len(files) - keep_last)]:
        old.unlink(missing_ok=True)


def remove_unfinished(directory: str | Path) -> list[Path]:
    """Delete temporary files left by a save that was killed; returns what was removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for leftover in directory.iterdir():
        if _UNFINISHED.match(leftover.name) and leftover.is_file():
            with contextlib.suppress(OSError):
                leftover.unlink()
                removed.append(leftover)
    return removed


# ------------------------------------------------------------------- reading
def load(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read and validate an amptrain checkpoint; any problem is a one-line UserError."""
    path = Path(path)
    special = not_regular_reason(path)
    if special:
        raise UserError(f"checkpoint {special}")
    if not path.is_file():
        raise UserError(f"checkpoint {path}: no such file")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, ValueError,
            OSError, AttributeError, ImportError, IndexError, KeyError, TypeError) as exc:
        raise UserError(f"checkpoint {path}: {_unreadable(path, exc)}") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UserError(f"checkpoint {path}: not an amptrain checkpoint ({_describe(state)}); "
                        f"--resume and eval need a file that amptrain wrote, such as "
                        f"OUT/{CHECKPOINT_DIR}/{LAST}")
    if state.get("format_version", 0) > FORMAT_VERSION:
        raise UserError(f"checkpoint {path}: written by a newer amptrain "
                        f"(format {state.get('format_version')}); upgrade amptrain")
    check_sections(state, path)
    return state


def _unreadable(path: Path, exc: BaseException) -> str:
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head == _ZIP_MAGIC and not zipfile.is_zipfile(path):
        return "truncated (its end is missing: an interrupted copy or write?)"
    if head == _ZIP_MAGIC and "Weights only load failed" in str(exc):
        return ("holds pickled Python objects, not an amptrain checkpoint (which holds only "
                "tensors and plain values)")
    if head == _ZIP_MAGIC:
        return f"damaged PyTorch file ({type(exc).__name__})"
    return "not a PyTorch checkpoint file (unreadable bytes)"


def _describe(state: Any) -> str:
    if isinstance(state, dict) and state \
            and all(isinstance(v, torch.Tensor) for v in state.values()):
        return f"a bare state_dict of {len(state)} tensors"
    if isinstance(state, dict):
        keys = ", ".join(map(str, list(state)[:4]))
        return f"a dict with keys {keys}" if keys else "an empty dict"
    return f"a {type(state).__name__}"
