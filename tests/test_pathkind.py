"""pathkind.py: what a path given as a file really is."""
from __future__ import annotations

import os

from amptrain.pathkind import not_regular_reason, special_kind


def test_special_files_are_named_and_regular_ones_are_not(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "file.txt").write_text("text")
    assert special_kind(fifo) == "a FIFO (named pipe)"
    assert special_kind("/dev/zero") == "a character device"
    assert not_regular_reason("/dev/null") == "/dev/null is a character device, not a regular file"
    for ordinary in (tmp_path / "file.txt", tmp_path, tmp_path / "missing"):
        assert special_kind(ordinary) is None and not_regular_reason(ordinary) is None
