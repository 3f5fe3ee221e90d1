"""Issue 48, class 6: one lock for every command that writes a directory, and the lock's
release never removes a file amptrain did not create."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from amptrain.common import outdir
from amptrain.common.errors import UserError
from tests.test_cli import run_in_process

HOLDER = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
          "os.write(fd, b'amptrain lock\\n'); fcntl.flock(fd, fcntl.LOCK_EX); "
          "print('held', flush=True); time.sleep(60)")


def test_a_users_own_lock_file_is_refused_and_survives(tmp_path):
    mine = tmp_path / outdir.LOCK_NAME
    mine.write_text("my notes\n")
    with pytest.raises(UserError, match=r"holds \.amptrain\.lock, a file amptrain did not "
                                        r"create"):
        outdir.lock(tmp_path)
    assert mine.read_text() == "my notes\n"


def test_the_lock_removes_only_the_file_it_created(tmp_path):
    outdir.lock(tmp_path)
    assert (tmp_path / outdir.LOCK_NAME).read_bytes() == outdir.LOCK_MARK
    outdir.release(tmp_path)
    assert not (tmp_path / outdir.LOCK_NAME).exists()
    empty = tmp_path / "e"
    empty.mkdir()
    (empty / outdir.LOCK_NAME).write_bytes(b"")  # an older amptrain's, or the user's: kept
    outdir.lock(empty)
    outdir.release(empty)
    assert (empty / outdir.LOCK_NAME).exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", [
    "prepare --data text:{text} --out {out}",
    "diagnose --model mlp --steps 1 --out {out}",
    "compare --bench-steps 1 --out {out}",
])
def test_a_second_command_on_a_locked_out_is_refused(tmp_path, command):
    out = tmp_path / "out"
    out.mkdir()
    text = tmp_path / "t.txt"
    text.write_text("hello world\n" * 50)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out / outdir.LOCK_NAME)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        argv = command.format(text=text, out=out).split()
        result = run_in_process(argv, tmp_path)
    finally:
        holder.kill()
        holder.wait()
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert f"--out {out} is in use by another amptrain run" in lines[0]
    assert sorted(p.name for p in out.iterdir()) == [outdir.LOCK_NAME]


KILLED_HOLDER = """
import sys, time
from pathlib import Path
from amptrain.common import outdir
outdir.lock(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(60)
def test_a_lock_left_by_a_killed_run_lets_the_next_run_in(tmp_path):
    # Issue 48: SIGKILL leaves amptrain's lock file behind; the kernel dropped its flock,
    # so the next command takes the directory, and keeps the file it did not create.
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", KILLED_HOLDER, str(out)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(UserError, match="is in use by another amptrain run"):
            outdir.lock(out)
    finally:
        holder.kill()
        holder.wait()
    assert (out / outdir.LOCK_NAME).read_bytes() == outdir.LOCK_MARK  # left behind
    outdir.lock(out)
    outdir.release(out)
    assert (out / outdir.LOCK_NAME).exists()


def test_prepare_leaves_no_lock_behind(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("hello world\n" * 50)
    result = run_in_process(["prepare", "--data", f"text:{text}", "--out",
                             str(tmp_path / "p"), "--no-progress"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert not (Path(tmp_path / "p") / outdir.LOCK_NAME).exists()
