"""What a path given as a file really is, so that errors name it.

A FIFO, ``/dev/zero`` or a socket exists but is no regular file: reading one blocks or
never ends. Every place that reads a user's file refuses these up front, saying what
the path is (not "no such file" or "an empty directory").
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def special_kind(path: str | os.PathLike[str]) -> str | None:
    """``"a FIFO (named pipe)"``, ``"a character device"``, ... for a path that exists but is
    neither a regular file nor a directory; None otherwise (missing paths included)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    for test, name in _KINDS:
        if test(mode):
            return name
    return None


def not_regular_reason(path: str | os.PathLike[str]) -> str | None:
    """``"PATH is a FIFO (named pipe), not a regular file"``, or None."""
    kind = special_kind(path)
    return None if kind is None else f"{Path(path)} is {kind}, not a regular file"


def disk_of(path: str | os.PathLike[str]) -> str:
    """``"the disk mounted at /data (12 kB free)"``: where ``path`` would be written, for
    messages about a full disk."""
    probe = Path(os.path.abspath(path))
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    mount = probe
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        stats = os.statvfs(probe)
        free = f"{stats.f_bavail * stats.f_frsize // 1024} kB free"
    except OSError:
        free = "free space unknown"
    return f"the disk mounted at {mount} ({free})"


def write_failure(path: str | os.PathLike[str], exc: OSError) -> str:
    """``"cannot write PATH: No space left on device (ENOSPC) on the disk mounted at /data
    (0 kB free)"``; without the disk for errors that are not about space."""
    import errno

    code = errno.errorcode.get(exc.errno or 0)
    reason = f"{exc.strerror or exc}" + (f" ({code})" if code else "")
    where = f" on {disk_of(path)}" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    return f"cannot write {path}: {reason}{where}"


#: How Rust's ``std::io::Error`` shows its OS error: safetensors and tokenizers raise
#: their own exception types with only this in the text (no errno attribute).
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def os_error_of(exc: BaseException) -> OSError | None:
    """The OS error behind ``exc``: ``exc`` itself, the ``OSError`` it was raised from,
    or one read from a library's text ("No space left on device (os error 28)"); None
    for an exception that is not about the file system."""
    if isinstance(exc, OSError):
        return exc
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, OSError):
        return cause
    found = _RUST_OS_ERROR.search(str(exc))
    if found is None:
        return None
    code = int(found.group(1))
    return OSError(code, os.strerror(code))
