"""Issue 48, class 5: a full disk while amptrain writes any file is one line naming the
file and the disk, and leaves no half-written file (a real 64 kB tmpfs; root only)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from amptrain.common import outdir
from amptrain.common.errors import UserError
from tests.test_cli import run_in_process


@pytest.fixture
def full_disk(tmp_path):
    """A 64 kB tmpfs with about 1 kB left."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True)
    if made.returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        filler = mount / "filler"
        with open(filler, "wb") as f:
            try:
                f.write(b"x" * (60 << 10))
            except OSError:
                pass
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_the_one_writer_says_a_full_disk_and_leaves_nothing(full_disk):
    target = full_disk / "report.json"
    with pytest.raises(UserError, match=r"cannot write .*report.json: No space left on "
                                        r"device \(ENOSPC\)"):
        outdir.write_text(target, "y" * (200 << 10), replace=False)
    assert not target.exists()
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", [
    "prepare --data text:{text} --out {disk}/prepared --no-progress",
    "diagnose --model mlp --steps 1 --out {disk}/diag",
])
def test_a_command_on_a_full_disk_is_one_line(full_disk, tmp_path, command):
    text = tmp_path / "big.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 4000)
    argv = command.format(text=text, disk=full_disk).split()
    result = run_in_process(argv, tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    error = [line for line in lines if line.startswith("amptrain: error:")]
    assert len(error) == 1 and "No space left on device (ENOSPC)" in error[0]
    left = {p.name for p in Path(full_disk).rglob("*") if p.is_file()}
    assert left <= {"filler"}


def test_a_full_token_cache_falls_back_to_memory_and_leaves_nothing(full_disk, tmp_path,
                                                                   monkeypatch, caplog):
    # Issue 48: the text: cache is amptrain's; its disk filling up is no reason to stop.
    from amptrain.data import DataOptions, build_data

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello world, " * 20_000)  # 260 kB of tokens: no room
    monkeypatch.setenv("AMPTRAIN_CACHE", str(full_disk))
    bundle = build_data(f"text:{corpus}", DataOptions(seq_len=8))
    assert type(bundle.train).__name__ == "TokenBlocks" and len(bundle.train) > 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("cannot write the token cache" in w and "No space left on device" in w
               and "tokenizing in memory" in w for w in warnings)
    assert list((full_disk / "tokens").iterdir()) == []  # no half-written entry
