"""amptrain/logs.py: RunLogger writes metrics.jsonl, TensorBoard events and progress
bars or plain lines; a disabled logger (ranks other than 0) writes nothing."""
from __future__ import annotations

import io
import json
import shutil

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from amptrain.trainer.logs import TB_TAGS, RunLogger


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def record(step: int, **values) -> dict:
    return {"step": step, "epoch": 0, **values}


def scalars(path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series TensorBoard reads from ``path`` (a directory or one file)."""
    accumulator = EventAccumulator(str(path))
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def event_files(run) -> list:
    return sorted((run / "tb").glob("events.out.tfevents.*"))


def test_metrics_jsonl_has_one_readable_line_per_record_with_null_for_nonfinite(tmp_path):
    run = tmp_path / "run"
    logger = RunLogger(run, progress=False, stream=io.StringIO())
    logger.log(record(1, loss=0.5, lr=0.1, loss_scale=65536.0))
    logger.log(record(2, loss=float("nan"), lr=0.1, grad_norm=float("inf"), note="x"))
    logger.log({"step": 2, "val_loss": 0.25, "val_acc": 0.75})
    logger.close()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]  # strict JSON: no NaN or Infinity tokens
    assert "NaN" not in lines[1] and "Infinity" not in lines[1]
    assert rows == [
        {"step": 1, "epoch": 0, "loss": 0.5, "lr": 0.1, "loss_scale": 65536.0},
        {"step": 2, "epoch": 0, "loss": None, "lr": 0.1, "grad_norm": None, "note": "x"},
        {"step": 2, "val_loss": 0.25, "val_acc": 0.75},
    ]
    # A second logger on the same directory (a resumed run) appends.
    again = RunLogger(run, progress=False, stream=io.StringIO())
    again.log(record(3, loss=0.125))
    again.close()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and rows[-1]["loss"] == 0.125


def test_tensorboard_events_hold_the_documented_tags(tmp_path):
    run = tmp_path / "run"
    logger = RunLogger(run, progress=False, stream=io.StringIO())
    logger.log(record(1, loss=2.0, lr=0.01, loss_scale=1024.0, grad_norm=3.5, skipped_steps=0,
                      samples_per_s=1000.0, peak_mem_bytes=4096, extra=1.0,
                      tokens_per_s=64000.0, data_wait_frac=0.25))
    logger.log(record(2, loss=1.5, lr=0.01, loss_scale=float("inf"), skipped_steps=True))
    logger.log({"step": 2, "val_loss": 1.25, "val_acc": 0.5})
    # Every task's metrics get val/<metric> tags (regression, language models).
    logger.log({"step": 3, "val_loss": 1.0, "val_rmse": 0.5, "val_perplexity": 2.5})
    logger.close()
    assert len(event_files(run)) == 1
    series = scalars(run / "tb")
    assert set(series) == set(TB_TAGS.values()) | {"val/rmse", "val/perplexity"}
    assert series["val/perplexity"] == [(3, 2.5)]
    assert series["train/tokens_per_s"] == [(1, 64000.0)]
    assert series["train/data_wait_frac"] == [(1, 0.25)]
    assert series["train/loss"] == [(1, 2.0), (2, 1.5)]
    assert series["train/lr"] == [(1, pytest.approx(0.01)), (2, pytest.approx(0.01))]
    assert series["train/loss_scale"] == [(1, 1024.0)]  # inf is not logged
    assert series["train/skipped_steps"] == [(1, 0.0)]  # a bool is not a number here
    assert series["train/grad_norm"] == [(1, 3.5)]
    assert series["train/samples_per_s"] == [(1, 1000.0)]
    assert series["system/peak_mem_bytes"] == [(1, 4096.0)]
    assert series["val/loss"] == [(2, 1.25), (3, 1.0)] and series["val/acc"] == [(2, 0.5)]


def test_a_resumed_run_purges_the_steps_after_its_checkpoint(tmp_path):
    run = tmp_path / "run"
    first = RunLogger(run, progress=False, stream=io.StringIO())
    for step in range(1, 5):
        first.log(record(step, loss=float(step)))
    first.close()
    (killed,) = event_files(run)
    resumed = RunLogger(run, progress=False, stream=io.StringIO(), resumed_at=2)
    for step in (3, 4):
        resumed.log(record(step, loss=10.0 * step))
    resumed.close()
    (continued,) = [f for f in event_files(run) if f != killed]
    # TensorBoard reads a directory's files in name order; copy them under names that
    # keep the order in which they were written.
    ordered = tmp_path / "ordered"
    ordered.mkdir()
    shutil.copy(killed, ordered / "events.out.tfevents.1")
    shutil.copy(continued, ordered / "events.out.tfevents.2")
    assert scalars(ordered)["train/loss"] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]
    assert scalars(killed)["train/loss"] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]


def test_plain_lines_when_progress_is_off_or_the_stream_is_no_terminal(tmp_path):
    for progress in (False, True):  # True is forced off: a StringIO is not a terminal
        stream = io.StringIO()
        logger = RunLogger(None, progress=progress, stream=stream)
        assert not logger.progress
        logger.bar(10, "epoch 0")
        logger.advance()
        logger.log({"step": 3, "epoch": 1, "loss": 0.123456, "lr": 0.001, "loss_scale": 65536.0,
                    "samples_per_s": 1234.4, "grad_norm": 9.0})
        logger.log({"step": 3, "epoch": 1, "val_loss": None, "val_acc": 0.5})
        logger.message("checkpoint written")
        logger.close()
        assert stream.getvalue().splitlines() == [
            "epoch 1 step 3  loss 0.1235  lr 0.001  loss_scale 6.55e+04  1234 samples/s",
            "epoch 1 step 3  val_acc 0.5000",
            "checkpoint written",
        ]
    assert not list(tmp_path.iterdir())  # out=None: no files


def test_a_terminal_gets_a_bar_instead_of_lines():
    stream = Terminal()
    logger = RunLogger(None, progress=True, stream=stream)
    assert logger.progress
    logger.bar(4, "epoch 0")
    logger.advance(2)
    logger.log({"step": 2, "epoch": 0, "loss": 0.5})
    logger.message("a notice above the bar")
    logger.close()
    text = stream.getvalue()
    assert "epoch 0" in text and "2/4" in text and "loss=0.5000" in text
    assert "a notice above the bar" in text
    assert "epoch 0 step 2" not in text  # no plain line while a bar is open


def test_a_disabled_logger_writes_nothing(tmp_path):
    stream = Terminal()
    logger = RunLogger(tmp_path / "run", enabled=False, progress=True, stream=stream)
    assert not logger.progress
    logger.bar(3, "epoch 0")
    logger.advance()
    logger.log(record(1, loss=0.5))
    logger.message("hello")
    logger.close()
    assert stream.getvalue() == "" and not (tmp_path / "run").exists()


def test_print_every_thins_the_console_lines_but_not_the_files(tmp_path):
    # compare records every step for its curves but prints as `train` does.
    stream = io.StringIO()
    logger = RunLogger(tmp_path, progress=False, stream=stream, print_every=10)
    for step in range(1, 26):
        logger.log({"step": step, "epoch": 0, "loss": 1.0 / step, "lr": 0.1})
    logger.log({"step": 25, "epoch": 0, "val_loss": 0.5, "val_acc": 0.9})
    logger.close()
    lines = stream.getvalue().splitlines()
    assert [line.split()[3] for line in lines] == ["10", "20", "25"]
    assert "val_acc 0.9" in lines[-1]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 26


def test_a_full_disk_while_logging_is_one_error_naming_the_file(tmp_path):
    """/dev/full answers every write with ENOSPC, as a full disk does: the run stops with
    amptrain's error (exit 1 under the CLI) naming metrics.jsonl, not an OSError traceback."""
    import os

    from amptrain.trainer.logs import LogWriteError

    os.symlink("/dev/full", tmp_path / "metrics.jsonl")
    logger = RunLogger(tmp_path, progress=False)
    with pytest.raises(LogWriteError, match=r"cannot write .*metrics.jsonl: No space left "
                                            r"on device \(ENOSPC\) on the disk mounted at") \
            as error:
        logger.log({"step": 1, "loss": 0.5})
    # Every message true about what was saved (issue 36): no checkpoint yet, none claimed.
    assert error.value.exit_code == 1 and "no checkpoint was saved yet" in str(error.value)
    assert "intact" not in str(error.value)
    logger.close()  # the failed write does not fail again on close
    from amptrain import checkpoint

    checkpoint.save_run_checkpoint({"step": 1}, tmp_path / "checkpoints", 1, keep_last=1)
    logger = RunLogger(tmp_path, progress=False)
    with pytest.raises(LogWriteError) as error:
        logger.log({"step": 2, "loss": 0.5})
    assert f"its last checkpoint {tmp_path / 'checkpoints' / 'last.pt'} is intact" \
        in str(error.value) and "resume auto" in str(error.value)
    logger.close()


def test_a_gan_record_shows_both_losses_and_every_loss_scale_in_lines_and_the_bar():
    gan = {"step": 20, "epoch": 0, "d_loss": 1.25, "g_loss": 0.75,
           "lr/discriminator": 0.001, "lr/generator": 0.001, "loss_scale": 1024.0,
           "loss_scale/0": 1024.0, "loss_scale/1": 2048.0, "grad_norm/generator": 3.0,
           "skipped_steps": 1, "skipped_steps/generator": 1, "samples_per_s": 100.0}
    stream = io.StringIO()
    logger = RunLogger(None, progress=False, stream=stream, print_every=20)
    logger.log({**gan, "step": 10})  # not a multiple of print_every: files only
    logger.log(gan)
    logger.log({"step": 20, "epoch": 0, "val_loss": 0.5, "val_fd": 12.5})
    logger.close()
    assert stream.getvalue().splitlines() == [
        "epoch 0 step 20  d_loss 1.2500  g_loss 0.7500  loss_scale 1024.0000  "
        "loss_scale/0 1024.0000  loss_scale/1 2048.0000  100 samples/s",
        "epoch 0 step 20  val_loss 0.5000  val_fd 12.5000",
    ]
    bar = Terminal()
    logger = RunLogger(None, progress=True, stream=bar)
    logger.bar(40, "epoch 0")
    logger.log(gan)
    logger.message("redraw")  # the bar redraws below it, with the record's values
    logger.close()
    assert "d_loss=1.2500" in bar.getvalue() and "g_loss=0.7500" in bar.getvalue()
    assert "loss_scale/1=2048.0000" in bar.getvalue()


def test_an_evaluations_image_grid_goes_to_tensorboard_and_nowhere_on_other_ranks(tmp_path):
    import numpy as np

    image = np.full((6, 6, 1), 128, dtype=np.uint8)
    logger = RunLogger(tmp_path / "run", progress=False, stream=io.StringIO(),
                       loggers="tensorboard,csv")
    logger.images(4, {"samples": image})
    logger.images(5, {})
    logger.close()
    accumulator = EventAccumulator(str(tmp_path / "run" / "tb"), size_guidance={"images": 0})
    accumulator.Reload()
    assert [e.step for e in accumulator.Images("val/samples")] == [4]
    off = RunLogger(tmp_path / "off", enabled=False, progress=False)
    off.images(4, {"samples": image})
    off.close()
    assert not (tmp_path / "off").exists()
