"""The run directory: a file, a path under a file, an unwritable place or an earlier run
is refused with one line naming --out (or the ``out`` keyword), before anything is written."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from amptrain.common import outdir
from amptrain.loggers import train_outputs
from amptrain.common.errors import UserError, cli_spelling


def test_a_new_directory_is_created(tmp_path):
    path = outdir.make_run_dir(tmp_path / "a" / "b", resume=False)
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
        outdir.make_run_dir("/proc/amptrain-run", resume=False)


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


# ---------------------------------------------------------------- issue 36, class 3
@pytest.mark.slow
def test_two_runs_started_together_on_one_out_one_trains_the_other_is_refused(tmp_path):
    # Both processes pass the first check before either writes; the lock taken when the
    # directory is made, and the check made again under it, lets exactly one through.
    import json
    import subprocess
    import sys

    from tests.commands.helpers import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    for attempt in range(3):
        out = tmp_path / f"run{attempt}"
        argv = [sys.executable, "-m", "amptrain", "train", "--model", "mlp", "--max-steps",
                "3", "--log-every", "1", "--logger", "none", "--no-progress", "--out", str(out)]
        procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        done = [(p.wait(timeout=300), p.stderr.read()) for p in procs]  # type: ignore[union-attr]
        assert sorted(code for code, _ in done) == [0, 2], done
        refused = next(err for code, err in done if code == 2)
        errors = [line for line in refused.splitlines() if line.startswith("amptrain: error:")]
        assert "Traceback" not in refused and len(errors) == 1, refused
        assert "--out" in errors[0] and ("in use by another amptrain run" in errors[0]
                                         or "already holds" in errors[0]), errors[0]
        steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text()
                 .splitlines() if "loss" in json.loads(line)]
        assert steps == sorted(set(steps)) and steps[-1] == 3, steps


def test_a_locked_out_is_refused_and_free_again_once_released(tmp_path):
    import subprocess
    import sys

    outdir.claim_run(tmp_path, resume=False)
    try:
        # Another process: the flock is per open file, so this process would not see it.
        probe = ("from amptrain.common import outdir\n"
                 "from amptrain.common.errors import UserError\n"
                 f"try:\n    outdir.lock(__import__('pathlib').Path({str(tmp_path)!r}))\n"
                 "except UserError as e:\n    print(e)\n")
        said = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
        assert "is in use by another amptrain run" in said.stdout, said
    finally:
        outdir.release(tmp_path)
    said = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    assert said.stdout == "" and said.returncode == 0, said


@pytest.mark.parametrize("make,kind", [
    (lambda p: os.mkfifo(p), "a FIFO"),
    (lambda p: p.symlink_to("/etc/hostname"), "a symbolic link"),
])
def test_a_fifo_or_link_where_a_file_goes_is_refused_even_on_resume(tmp_path, make, kind):
    make(tmp_path / "metrics.jsonl")
    with cli_spelling(), pytest.raises(UserError, match=f"metrics.jsonl is {kind}"):
        outdir.check(tmp_path, resume=True)


def test_the_trackers_files_are_what_train_writes(tmp_path):
    (tmp_path / "metrics.csv").write_text("step,loss\n1,2\n")
    outdir.check(tmp_path, resume=False)  # tensorboard only: the user's csv is no obstacle
    with pytest.raises(UserError, match="already holds metrics.csv"):
        outdir.check(tmp_path, resume=False, outputs=train_outputs("tensorboard,csv"))
    (tmp_path / "metrics.csv").unlink()
    (tmp_path / "mlruns").mkdir()
    (tmp_path / "mlruns" / "mine").write_text("x")
    with pytest.raises(UserError, match="already holds mlruns/"):
        outdir.check(tmp_path, resume=False, outputs=train_outputs("mlflow"))


def test_a_name_too_long_for_the_file_system_is_one_line(tmp_path):
    with cli_spelling(), pytest.raises(UserError, match="is 300 bytes, over the file system's"):
        outdir.check(tmp_path / ("x" * 300), resume=False)
    with pytest.raises(UserError, match="over the system's 4096 bytes"):
        outdir.check(tmp_path.joinpath(*["y" * 200] * 25), resume=False)


def test_new_file_never_replaces_waits_or_follows(tmp_path):
    (tmp_path / "grid.png").write_bytes(b"mine")
    os.mkfifo(tmp_path / "pipe.png")
    (tmp_path / "link.png").symlink_to(tmp_path / "elsewhere.png")
    for name in ("grid.png", "pipe.png", "link.png"):
        with cli_spelling(), pytest.raises(UserError, match=f"--out: .*{name} exists already"):
            outdir.new_file(tmp_path / name)
    assert (tmp_path / "grid.png").read_bytes() == b"mine"
    assert not (tmp_path / "elsewhere.png").exists()
    with outdir.new_file(tmp_path / "new.png") as f:
        f.write(b"ours")
    assert (tmp_path / "new.png").read_bytes() == b"ours"


def test_write_bytes_replaces_only_a_regular_file(tmp_path):
    target = tmp_path / "samples.png"
    outdir.write_bytes(target, b"one", replace=True)
    outdir.write_bytes(target, b"two", replace=True)  # a resumed run's own earlier file
    assert target.read_bytes() == b"two"
    os.mkfifo(tmp_path / "pipe.png")
    with pytest.raises(UserError, match="pipe.png is a FIFO"):
        outdir.write_bytes(tmp_path / "pipe.png", b"x", replace=True)
    with pytest.raises(UserError, match="exists already"):
        outdir.write_bytes(target, b"three", replace=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.png", "samples.png"]


# Issue 33: a run's --out is checked once: the command's verdict is the Trainer's.
def _check(out, **options):
    outdir.check_on_main(out, resume=False, is_main=True, broadcast=lambda x: x, **options)


def test_a_remembered_verdict_answers_the_next_check_once(tmp_path):
    out = tmp_path / "run"
    _check(out, remember=True)
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")  # what the verdict did not see
    _check(out)  # the run's Trainer: the command's verdict, not a second look
    with pytest.raises(UserError, match="already holds a run"):
        _check(out)  # used once: the next check looks again


def test_a_verdict_for_another_setting_is_not_taken(tmp_path):
    out = tmp_path / "run"
    _check(out, remember=True)
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(UserError, match="already holds a run"):
        _check(out, outputs=train_outputs("csv"))  # other outputs: checked again


def test_writing_the_run_or_forgetting_drops_the_verdict(tmp_path):
    out = tmp_path / "run"
    _check(out, remember=True)
    outdir.forget(out)
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(UserError, match="already holds a run"):
        _check(out)
    other = tmp_path / "other"
    _check(other, remember=True)
    outdir.claim_run(other, resume=False)
    try:
        (other / "metrics.jsonl").write_text("{}\n")
        with pytest.raises(UserError, match="already holds a run"):
            _check(other)
    finally:
        outdir.release(other)


def test_a_write_handed_to_a_library_says_its_os_error_in_one_line(tmp_path):
    # The export hooks (save_pretrained, Keras' save) write under outdir.writing.
    target = tmp_path / "hf"
    with cli_spelling(), pytest.raises(UserError) as error:
        with outdir.writing(target):
            raise RuntimeError("I/O error: No space left on device (os error 28)")
    assert str(error.value).startswith(f"cannot write {target}: No space left on device "
                                       f"(ENOSPC) on the disk mounted at ")
    assert str(error.value).endswith("choose another --out) and run the command again")
    with pytest.raises(UserError, match="already said"), outdir.writing(target):
        raise UserError("already said")
    with pytest.raises(TypeError, match="not about files"), outdir.writing(target):
        raise TypeError("not about files")
