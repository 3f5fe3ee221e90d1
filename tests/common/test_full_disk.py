"""Issue 48, class 5: a full disk while amptrain writes any file is one line naming the
file and the disk, and leaves no half-written file (a real 64 kB tmpfs; root only)."""
from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest

from amptrain.common import outdir
from amptrain.common.errors import UserError
from tests.test_cli import run_in_process


@contextlib.contextmanager
def _tmpfs(where: Path, size_kb: int = 64, before_filling=None):
    """A ``size_kb`` tmpfs at ``where``, ``before_filling(mount)`` run on it, then
    filled up to about 4 kB (one page) by the file ``filler``."""
    where.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs",
                           str(where)], capture_output=True)
    if made.returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        if before_filling is not None:
            before_filling(where)
        with open(where / "filler", "wb") as f:
            try:
                f.write(b"x" * (size_kb << 10))
            except OSError:  # full: exactly what is wanted
                pass
        (where / "filler").write_bytes((where / "filler").read_bytes()[:-(4 << 10)])
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def full_disk(tmp_path):
    """A 64 kB tmpfs with about 4 kB (one page) left."""
    with _tmpfs(tmp_path / "disk") as mount:
        yield mount


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


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
    from amptrain.data import DataOptions, TextOptions, build_data

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello world, " * 20_000)  # 260 kB of tokens: no room
    monkeypatch.setenv("AMPTRAIN_CACHE", str(full_disk))
    bundle = build_data(f"text:{corpus}", DataOptions(text=TextOptions(seq_len=8)))
    assert type(bundle.train).__name__ == "TokenBlocks" and len(bundle.train) > 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("cannot write the token cache" in w and "No space left on device" in w
               and "tokenizing in memory" in w for w in warnings)
    assert list((full_disk / "tokens").iterdir()) == []  # no half-written entry


# ------------------------------------------------ files a library writes (export)
def test_a_file_a_library_writes_goes_through_the_one_writer(full_disk):
    # safetensors' save_file reports a full disk as its own error, the OS error only in
    # its text: the writer reads it and says it in one line, leaving nothing.
    import safetensors.torch
    import torch

    target = full_disk / "model.safetensors"
    with pytest.raises(UserError) as error:
        outdir.write_file(target, lambda p: safetensors.torch.save_file(
            {"w": torch.zeros(1 << 14)}, str(p)), replace=False)
    assert str(error.value).startswith(f"cannot write {target}: No space left on device "
                                       f"(ENOSPC) on the disk mounted at {full_disk}")
    assert _files(full_disk) == {"filler"}  # neither the partial file nor the claimed one


def test_the_library_writer_replaces_only_regular_files_and_only_when_told(tmp_path):
    target = tmp_path / "model.bin"
    outdir.write_file(target, lambda p: p.write_bytes(b"first"), replace=False)
    with pytest.raises(UserError, match="exists already and amptrain never replaces"):
        outdir.write_file(target, lambda p: p.write_bytes(b"second"), replace=False)
    outdir.write_file(target, lambda p: p.write_bytes(b"third"), replace=True)
    link = tmp_path / "link.bin"
    link.symlink_to(target)
    with pytest.raises(UserError, match="is a symbolic link"):
        outdir.write_file(link, lambda p: p.write_bytes(b"fourth"), replace=True)
    with pytest.raises(ZeroDivisionError):  # not about files: the caller's, as it was
        outdir.write_file(tmp_path / "x.bin", lambda p: 1 // 0, replace=False)
    assert target.read_bytes() == b"third" and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.bin", "model.bin"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A one-step mlp run's checkpoint (its weights are larger than the disk's room)."""
    root = tmp_path_factory.mktemp("trained")
    result = run_in_process(["train", "--model", "mlp", "--max-steps", "1", "--no-progress",
                             "--out", str(root / "run")], root)
    assert result.returncode == 0, result.stderr
    return root / "run" / "checkpoints" / "last.pt"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", [
    "export --checkpoint {checkpoint} --format safetensors --out {disk}/exported",
    # compare.json fits the page left, study.json does not (compare's own writes).
    "compare --model mlp --precisions 32-true --bench-steps 1 --timing-warmup 1 "
    "--out {disk}/study --no-progress",
])
def test_export_and_compare_on_a_full_disk_are_one_line(full_disk, tmp_path, checkpoint,
                                                        command):
    argv = command.format(checkpoint=checkpoint, disk=full_disk).split()
    result = run_in_process(argv, tmp_path)
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and len(errors) == 1
    assert errors[0].startswith("amptrain: error: cannot write ")
    assert "No space left on device (ENOSPC)" in errors[0]
    assert "choose another --out" in errors[0]
    left = _files(full_disk) - {"filler"}
    assert not any(Path(name).name.startswith(".") for name in left)  # no partial, no lock
    for name in left:  # what is left is whole (compare.json, written before the disk filled)
        json.loads((full_disk / name).read_text())


def test_compare_reports_on_a_full_disk_are_one_line_and_leave_the_study(tmp_path):
    # Re-rendering a finished study (amptrain.report.write_reports) on a disk that has
    # room for its inputs but not for compare.png.
    from amptrain import report
    from tests.report.conftest import write_study

    with _tmpfs(tmp_path / "disk", size_kb=256, before_filling=write_study) as disk:
        before = {name: (disk / name).read_bytes() for name in _files(disk) - {"filler"}}
        with pytest.raises(UserError) as error:
            report.write_reports(disk)
        assert str(error.value).startswith(f"cannot write {disk / 'compare.png'}: No space "
                                           f"left on device (ENOSPC)")
        assert "choose another out" in str(error.value)  # the library's keyword
        assert _files(disk) - {"filler"} == set(before)
        assert all((disk / name).read_bytes() == data for name, data in before.items())
