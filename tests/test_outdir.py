"""The run directory: a file, a path under a file, an unwritable place or an earlier run
is refused with one line naming --out (or the ``out`` keyword), before anything is written."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from amptrain import outdir
from amptrain.errors import UserError, cli_spelling


def test_a_new_directory_is_created(tmp_path):
    path = outdir.prepare(tmp_path / "a" / "b", resume=False)
    assert path.is_dir()


def test_a_file_is_not_a_run_directory(tmp_path):
    (tmp_path / "f").write_text("x")
    with cli_spelling(), pytest.raises(UserError, match="--out .* is a file, not a directory"):
        outdir.check(tmp_path / "f", resume=False)
    with pytest.raises(UserError, match="is a file, so no directory can be made under it"):
        outdir.check(tmp_path / "f" / "run", resume=False)
    assert (tmp_path / "f").read_text() == "x"


def test_an_earlier_run_is_kept_unless_resumed(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.pt").write_bytes(b"old")
    with pytest.raises(UserError, match="already holds a run; continue it with resume auto"):
        outdir.check(tmp_path, resume=False)
    assert outdir.check(tmp_path, resume=True) == Path(tmp_path)


def test_an_unwritable_place(tmp_path, monkeypatch):
    # Root may write anywhere, so the permission answer is faked; the creation failure
    # below is real (/proc takes no new directories).
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(UserError, match="is not writable"):
        outdir.check(tmp_path / "run", resume=False)
    monkeypatch.undo()
    with pytest.raises(UserError, match="cannot create it"):
        outdir.prepare("/proc/amptrain-run", resume=False)
