"""pathkind.py: what a path given as a file really is."""
from __future__ import annotations

import errno
import os

from amptrain.common.pathkind import not_regular_reason, os_error_of, special_kind


def test_special_files_are_named_and_regular_ones_are_not(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "file.txt").write_text("text")
    assert special_kind(fifo) == "a FIFO (named pipe)"
    assert special_kind("/dev/zero") == "a character device"
    assert not_regular_reason("/dev/null") == "/dev/null is a character device, not a regular file"
    for ordinary in (tmp_path / "file.txt", tmp_path, tmp_path / "missing"):
        assert special_kind(ordinary) is None and not_regular_reason(ordinary) is None


def test_a_full_disk_is_named_with_its_mount_point_and_free_space(tmp_path):
    import errno

    from amptrain.common.pathkind import write_failure

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    message = write_failure(tmp_path / "new" / "config.yaml", full)
    assert message.startswith(f"cannot write {tmp_path / 'new' / 'config.yaml'}: No space left "
                              f"on device (ENOSPC) on the disk mounted at ")
    assert " kB free)" in message
    denied = OSError(errno.EACCES, os.strerror(errno.EACCES))
    assert write_failure(tmp_path / "x", denied) == \
        f"cannot write {tmp_path / 'x'}: Permission denied (EACCES)"


def test_train_on_a_full_small_file_system_is_one_line(tmp_path):
    """A real 64 kB tmpfs, filled: config.yaml is the first write (root only; skipped where
    mounting is not permitted)."""
    import subprocess

    import pytest

    from tests.commands.helpers import amptrain

    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()[:80]})")
    try:
        with open(disk / "fill", "wb") as fill:
            try:
                fill.write(b"\0" * (1 << 20))
            except OSError:
                pass
        result = amptrain("train", "--max-steps", "1", "--out", str(disk / "run"),
                          "--no-progress", cwd=tmp_path)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert lines[0] == (f"amptrain: error: cannot write {disk / 'run' / 'config.yaml'}: No "
                            f"space left on device (ENOSPC) on the disk mounted at {disk} (0 kB "
                            f"free); free space there (or choose another directory) and run the "
                            f"command again")
        assert sorted(p.name for p in (disk / "run").iterdir()) == []  # no empty config.yaml
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def test_the_os_error_behind_a_librarys_exception_is_found():
    own = OSError(errno.ENOSPC, "No space left on device")
    assert os_error_of(own) is own
    try:
        try:
            raise own
        except OSError as exc:
            raise RuntimeError("saving failed") from exc
    except RuntimeError as wrapped:
        assert os_error_of(wrapped) is own
    # safetensors' (Rust's) own exception: the OS error only in its text.
    rust = os_error_of(ValueError("Error while serializing: I/O error: No space left on "
                                  "device (os error 28)"))
    assert rust is not None and rust.errno == errno.ENOSPC
    assert rust.strerror == os.strerror(errno.ENOSPC)
    assert os_error_of(ValueError("shape mismatch: (os error)")) is None
    assert os_error_of(KeyError("w")) is None
