"""The run directory: a file, a path under a file, an unwritable place or an earlier run
is refused with one line naming --out (or the ``out`` keyword), before anything is written."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from amptrain.trainer import outdir
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


# ----------------------------------------- one rule for every command (issue 28, class 3)
@pytest.mark.parametrize("outputs,entry", [
    (outdir.TRAIN_OUTPUTS, "config.yaml"), (outdir.EVAL_OUTPUTS, "eval/report.json"),
    (outdir.DIAGNOSE_OUTPUTS, "diagnose.md"), (outdir.COMPARE_OUTPUTS, "compare.png"),
    (outdir.COMPARE_OUTPUTS, "study.json"),   # compare writes it too (issue 38)
])
def test_no_command_replaces_what_it_did_not_write(tmp_path, outputs, entry):
    target = tmp_path / entry
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("the user's")
    first = entry.split("/")[0] + ("/" if "/" in entry else "")
    with cli_spelling(), pytest.raises(UserError, match=f"already holds {first}, which this"):
        if outputs is outdir.TRAIN_OUTPUTS:
            outdir.check(tmp_path, resume=False)
        else:
            outdir.claim(tmp_path, outputs)
    assert target.read_text() == "the user's"


def test_empty_directories_and_other_files_are_no_obstacle(tmp_path):
    (tmp_path / "eval").mkdir()
    (tmp_path / "notes.txt").write_text("mine")
    assert outdir.claim(tmp_path, outdir.EVAL_OUTPUTS) == tmp_path
    outdir.check(tmp_path, resume=False)


def test_an_entry_of_the_wrong_kind_is_refused_even_on_resume(tmp_path):
    (tmp_path / "tb").write_text("a file where TensorBoard's directory goes")
    with pytest.raises(UserError, match="tb is a file, but amptrain writes a directory there"):
        outdir.check(tmp_path, resume=True)
    (tmp_path / "tb").unlink()
    (tmp_path / "config.yaml").mkdir()
    with pytest.raises(UserError, match="config.yaml is a directory, but amptrain writes a "
                                        "file there"):
        outdir.check(tmp_path, resume=True)
