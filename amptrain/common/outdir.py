"""The output directory (``--out``) of every command: a place that can be written and
holds nothing that the command would replace.

One rule for every command: amptrain never replaces a file it did not write in this
invocation. Each command names what it writes (:data:`TRAIN_OUTPUTS`, ...); :func:`claim`
refuses an ``--out`` where one of those entries exists already (or has the wrong kind: a
file where a directory goes), before anything is built or written, so a bad ``--out``
costs the user one line instead of a traceback after training, and an earlier run, an
earlier report or the user's own file is never overwritten. Only ``train --resume``
continues what its own earlier invocation wrote.

The same rule holds for every single file the package writes (:func:`new_file`: created
exclusively, never opened through a FIFO, a device or a link), and for two runs started
together on one ``--out``: :func:`data_and_model` takes an exclusive lock on the directory
(``.amptrain.lock``, ``flock``) and checks again under it, so exactly one of them runs and
the other is one line, exit 2.
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import IO, Any, Callable

from .errors import UserError, flag
from .pathkind import os_error_of, special_kind, write_failure

#: Files whose presence means a directory already holds a run.
RUN_MARKERS = ("checkpoints/last.pt", "metrics.jsonl")

#: What each command writes into its ``--out`` (a trailing "/" marks a directory).
TRAIN_OUTPUTS = ("config.yaml", "metrics.jsonl", "tb/", "checkpoints/", "eval/",
                 "numerics.jsonl", "numerics.png", "nonfinite.json")
EVAL_OUTPUTS = ("eval/",)
DIAGNOSE_OUTPUTS = ("diagnose.json", "diagnose.md")
PLAN_OUTPUTS = ("precision-plan.yaml", "plan.md", "plan.json", "search/")
COMPARE_OUTPUTS = ("compare.json", "study.json", "report.md", "report.html", "compare.png",
                   "runs/")


#: The lock file a training run holds in its ``--out`` while it writes there.
LOCK_NAME = ".amptrain.lock"
#: What amptrain writes into the lock files it creates: a file of that name holding
#: anything else is the user's, refused and never removed.
LOCK_MARK = b"amptrain lock\n"
#: Locks this process holds: resolved ``--out`` -> (the locked file's descriptor, whether
#: this process created the file: only then does :func:`release` remove it).
_HELD: dict[str, tuple[int, bool]] = {}
#: Directories :func:`claim_locked` created (removed again by :func:`release` if empty).
_MADE: set[str] = set()


def holds_run(out: Path) -> bool:
    """True when ``out`` already holds a training run's checkpoint or metrics."""
    return any((out / marker).exists() for marker in RUN_MARKERS)


def check(out: str | os.PathLike[str], *, resume: bool,
          outputs: tuple[str, ...] = TRAIN_OUTPUTS) -> Path:
    """Raise :class:`UserError` naming ``--out`` when ``out`` cannot hold a new run.

    ``out`` must be a directory or not exist yet; the nearest existing folder on its
    path must not be a file and must be writable; without ``resume`` it must not hold
    a run already, nor any other entry a run writes. Nothing is created.
    """
    path = _writable(out)
    _check_entries(path, outputs, replace_allowed=True)  # kinds first
    if not resume and path.is_dir() and holds_run(path):
        raise UserError(f"{flag('out')} {path} already holds a run; continue it with "
                        f"{flag('resume')} auto or choose another {flag('out')}")
    _check_entries(path, outputs, replace_allowed=resume)
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
        if target.is_symlink() or (not wants_dir and not target.is_dir()
                                   and not target.is_file()):
            kind = "a symbolic link" if target.is_symlink() else special_kind(target)
            raise UserError(f"{flag('out')} {path}: {target} is {kind or 'not a regular file'}"
                            f", where amptrain writes a {'directory' if wants_dir else 'file'} "
                            f"of its own (it never writes through one); move it away or "
                            f"choose another {flag('out')}")
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
    limit = _name_max(path)
    too_long = [part for part in path.parts if len(os.fsencode(part)) > limit]
    if too_long or len(os.fsencode(path)) >= 4096:
        what = (f"the name {too_long[0][:40]}... is {len(os.fsencode(too_long[0]))} bytes, "
                f"over the file system's {limit}" if too_long
                else "the path is over the system's 4096 bytes")
        raise UserError(f"{flag('out')} {str(path)[:60]}...: {what}; choose a shorter "
                        f"{flag('out')}")
    if path.exists() and not path.is_dir():
        raise UserError(f"{name} is {special_kind(path) or 'a file'}, not a directory: choose "
                        f"another {flag('out')}")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise UserError(f"{name}: {existing} is a file, so no directory can be made under it")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{name}: {existing} is not writable; choose a directory you can write")
    return path


def _name_max(path: Path) -> int:
    """The longest file name the file system under ``path`` takes (255 where unknown)."""
    existing = path
    while not _exists(existing) and existing != existing.parent:
        existing = existing.parent
    try:
        return os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _exists(path: Path) -> bool:
    """``path.exists()`` that says False for a name too long to look up (ENAMETOOLONG)."""
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


def make_run_dir(out: str | os.PathLike[str], *, resume: bool,
            outputs: tuple[str, ...] = TRAIN_OUTPUTS) -> Path:
    """:func:`check`, then create the directory (one line naming ``--out`` if that fails)."""
    return make(check(out, resume=resume, outputs=outputs))


def claim_run(out: str | os.PathLike[str], *, resume: bool,
                outputs: tuple[str, ...] = TRAIN_OUTPUTS) -> Path:
    """:func:`make_run_dir` for a training run, which then locks the directory for this process
    (:func:`lock`, until :func:`release`) and checks again under the lock: of two runs
    started together on one ``--out``, the second is refused before it writes anything."""
    forget(out)  # from here on the directory holds what this run writes
    path = make_run_dir(out, resume=resume, outputs=outputs)
    lock(path)
    try:
        return check(path, resume=resume, outputs=outputs)
    except UserError:
        release(path)
        raise


def lock(path: Path) -> None:
    """Hold an exclusive ``flock`` on ``path``/:data:`LOCK_NAME` until :func:`release` or
    the process ends (the kernel drops it then, also after a SIGKILL). Refuses, naming
    ``--out``, while another process holds it."""
    key = os.path.realpath(path)
    if key in _HELD:
        return
    file = path / LOCK_NAME
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    created = True
    try:
        try:
            fd = os.open(file, flags | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:  # another run's (live or ended) or the user's own file
            created = False
            fd = os.open(file, flags)
    except OSError as exc:
        raise UserError(f"{flag('out')} {path}: cannot lock it with {file} "
                        f"({exc.strerror or type(exc).__name__})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"{flag('out')} {path}: {file} is not a regular file; move it away")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise UserError(f"{flag('out')} {path} is in use by another amptrain run "
                            f"(it holds {LOCK_NAME}); wait for it to end or choose another "
                            f"{flag('out')}") from None
        raise UserError(f"{flag('out')} {path}: cannot lock it "
                        f"({exc.strerror or type(exc).__name__})") from None
    if created:
        with contextlib.suppress(OSError):
            os.write(fd, LOCK_MARK)
    else:
        head = os.pread(fd, len(LOCK_MARK) + 1, 0)
        if head and head != LOCK_MARK:
            os.close(fd)
            raise UserError(f"{flag('out')} {path} holds {LOCK_NAME}, a file amptrain did not "
                            f"create (it locks {flag('out')} with that name); move it away "
                            f"or choose another {flag('out')}")
    try:  # the file locked must still be the lock: a run that ended may have removed it
        same = os.stat(file, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
    except OSError:
        same = False
    if not same:
        os.close(fd)
        raise UserError(f"{flag('out')} {path} is in use by another amptrain run (its lock "
                        f"changed hands); wait for it to end or choose another {flag('out')}")
    _HELD[key] = (fd, created)


def release(path: str | os.PathLike[str] | None) -> None:
    """Give up this process's lock on ``path`` (nothing when it holds none)."""
    if path is None:
        return
    held = _HELD.pop(os.path.realpath(path), None)
    if held is not None:
        fd, created = held
        if created:  # only a file this process created: removed while still held (no
            # other run can have it), then unlocked by closing
            with contextlib.suppress(OSError):
                os.unlink(Path(path) / LOCK_NAME)
        os.close(fd)
    key = os.path.realpath(path)
    if key in _MADE:  # a directory claim_locked made stays only if the command wrote in it
        _MADE.discard(key)
        with contextlib.suppress(OSError):
            os.rmdir(key)


def claim_locked(out: str | os.PathLike[str], outputs: tuple[str, ...]) -> Path:
    """:func:`claim`, then create ``out`` and lock it for the rest of this process (every
    command that writes a directory: two on one ``--out`` cannot both write it) and claim
    again under the lock. Released at exit (or by :func:`release`)."""
    path = claim(out, outputs)
    if not path.exists():
        _MADE.add(os.path.realpath(make(path)))
    else:
        make(path)
    lock(path)
    try:
        return claim(path, outputs)
    except UserError:
        release(path)
        raise


@atexit.register
def release_all() -> None:
    """Give up every lock this process holds (a command's end; the process's exit)."""
    for key in list(_HELD):
        release(key)


def new_file(path: str | os.PathLike[str], *, option: str = "out") -> IO[bytes]:
    """``path`` opened for writing as a new regular file: an existing entry of any kind
    (the user's file, a FIFO, a device, a link) is refused naming ``option``, never
    replaced or waited on. Every writer of a file that is not its own earlier output uses
    this (image grids, ``generate``'s samples, a new tracker file)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        raise UserError(f"{flag(option)}: {path} exists already and amptrain never replaces "
                        f"what it did not write; move it away or choose another "
                        f"{flag(option)}") from None
    except OSError as exc:
        raise UserError(f"{flag(option)}: cannot create {path} "
                        f"({exc.strerror or type(exc).__name__})") from None
    return os.fdopen(fd, "wb")


def make(path: Path) -> Path:
    """Create the directory ``path`` (and its parents); one line naming ``--out`` if that
    fails."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{flag('out')} {path}: cannot create it "
                        f"({exc.strerror or type(exc).__name__})") from None
    return path


#: A training run's ``--out`` passed by :func:`check_on_main` (``remember=True``) before
#: its command loaded the data and the model: resolved path -> (resume, outputs). The
#: Trainer's own check of that directory is this verdict (used once); nothing was
#: written there in between. :func:`data_and_model` (the first write) and :func:`forget`
#: drop it.
_VERDICTS: dict[str, tuple[bool, tuple[str, ...]]] = {}


def _verdict_key(out: str | os.PathLike[str]) -> str:
    return os.path.abspath(os.fspath(out))


def check_on_main(out: str | os.PathLike[str], *, resume: bool, is_main: bool,
                  broadcast: Callable[[Any], Any],
                  outputs: tuple[str, ...] = TRAIN_OUTPUTS, remember: bool = False) -> None:
    """:func:`check` on the main process, whose verdict every process follows.

    Each process checking for itself would race: rank 0 may already have written
    metrics.jsonl into ``out`` when a slower rank looks, and that rank would then refuse
    the very run it belongs to.

    The check is made once per run: ``remember`` keeps a passing verdict (a command
    checks before it loads anything) for the run's Trainer, whose own check of the same
    directory, resume and outputs then takes it instead of looking again.
    """
    if _VERDICTS.pop(_verdict_key(out), None) == (resume, tuple(outputs)):
        return
    problem = None
    if is_main:
        try:
            check(out, resume=resume, outputs=outputs)
        except UserError as exc:
            problem = str(exc)
    problem = broadcast(problem)
    if problem:
        raise UserError(problem)
    if remember:
        _VERDICTS[_verdict_key(out)] = (resume, tuple(outputs))


def forget(out: str | os.PathLike[str]) -> None:
    """Drop a remembered verdict on ``out`` (the command's run is over)."""
    _VERDICTS.pop(_verdict_key(out), None)


def write_bytes(path: str | os.PathLike[str], data: bytes, *, replace: bool,
                option: str = "out") -> Path:
    """Write ``data`` to the file ``path``. Without ``replace`` the file must be new
    (:func:`new_file`); with it (a command's own earlier output, e.g. a resumed run's
    eval/samples.png) an existing regular file is replaced atomically, but a link, a FIFO,
    a device or a directory there is refused naming ``option``: never written through,
    never waited on."""
    path = Path(path)
    if not replace or not (path.exists() or path.is_symlink()):
        _written(path, path, data, option)
        return path
    _refuse_odd(path, option)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    _written(partial, path, data, option)
    _renamed(partial, path, option)
    return path


def write_file(path: str | os.PathLike[str], write: Callable[[Path], object], *,
               replace: bool, option: str = "out") -> Path:
    """:func:`write_bytes` for a file a library writes itself (safetensors'
    ``save_file``): ``write(partial)`` fills a new file beside ``path``, renamed into
    place once whole. The same rules: without ``replace`` ``path`` must be new; a full
    disk is one line (:func:`writing`) and leaves no partial file behind."""
    path = Path(path)
    if not replace:
        new_file(path, option=option).close()  # claimed exclusively (refuses what is there)
    elif path.exists() or path.is_symlink():
        _refuse_odd(path, option)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        with writing(path, option):
            new_file(partial, option=option).close()
            write(partial)
    except BaseException:
        partial.unlink(missing_ok=True)
        if not replace:
            path.unlink(missing_ok=True)  # the empty file claimed above: this call's own
        raise
    _renamed(partial, path, option)
    return path


@contextlib.contextmanager
def writing(path: str | os.PathLike[str], option: str = "out") -> Any:
    """Around a write handed to a library (``save_file``, ``save_pretrained``): its OS
    error, raised or only in its text, is :func:`write_error`'s line naming ``path``."""
    try:
        yield
    except Exception as exc:
        error = None if isinstance(exc, UserError) else os_error_of(exc)
        if error is None:
            raise
        raise UserError(write_error(path, error, option)) from None


def _refuse_odd(path: Path, option: str) -> None:
    """An existing entry amptrain may replace must be a regular file (its own earlier
    output): a link, a FIFO, a device or a directory is refused naming ``option``."""
    if path.is_symlink() or not path.is_file():
        kind = "a symbolic link" if path.is_symlink() else \
            "a directory" if path.is_dir() else special_kind(path) or "not a regular file"
        raise UserError(f"{flag(option)}: {path} is {kind}; amptrain writes a file of its "
                        f"own there; move it away or choose another {flag(option)}")


def _renamed(partial: Path, path: Path, option: str) -> None:
    try:
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise UserError(write_error(path, exc, option)) from None


def write_text(path: str | os.PathLike[str], text: str, *, replace: bool,
               option: str = "out") -> Path:
    """:func:`write_bytes` of ``text`` in UTF-8 (every report amptrain writes)."""
    return write_bytes(path, text.encode("utf-8"), replace=replace, option=option)


def write_error(path: str | os.PathLike[str], exc: OSError, option: str = "out") -> str:
    """The one line for a write that failed (a full disk: the disk and its free space)."""

    return (f"{write_failure(path, exc)}; free space there (or choose another "
            f"{flag(option)}) and run the command again")


def _written(target: Path, shown: Path, data: bytes, option: str) -> None:
    """``data`` into the new file ``target``: whole, or removed again with one line
    naming ``shown`` (a full disk, a quota, an I/O error)."""
    f = new_file(target, option=option)
    try:
        with f:
            f.write(data)
    except OSError as exc:
        target.unlink(missing_ok=True)
        raise UserError(write_error(shown, exc, option)) from None
