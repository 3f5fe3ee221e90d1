"""--logger csv: DIR/metrics.csv, one column per field (widened when evaluation adds its
metrics), read back with csv.DictReader; a resumed run drops rows past its checkpoint."""
from __future__ import annotations

import csv
import io

from amptrain.trainer.logs import RunLogger


def _rows(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_rows_and_widened_header_read_back(tmp_path):
    logger = RunLogger(tmp_path, progress=False, stream=io.StringIO(), loggers="csv")
    logger.log({"step": 1, "epoch": 0, "loss": 0.5, "loss_scale": None})
    logger.log({"step": 2, "epoch": 0, "loss": float("nan")})
    logger.log({"step": 2, "val_loss": 0.25, "val_acc": 0.75})
    logger.close()
    rows = _rows(tmp_path / "metrics.csv")
    assert list(rows[0]) == ["step", "epoch", "loss", "loss_scale", "val_loss", "val_acc"]
    assert [(r["step"], r["loss"], r["val_acc"]) for r in rows] == [
        ("1", "0.5", ""), ("2", "", ""), ("2", "", "0.75")]  # NaN is written as empty
    assert not (tmp_path / "tb").exists()


def test_a_resumed_run_drops_rows_after_its_checkpoint(tmp_path):
    first = RunLogger(tmp_path, progress=False, stream=io.StringIO(), loggers="csv")
    for step in (1, 2, 3):
        first.log({"step": step, "loss": float(step)})
    first.close()
    again = RunLogger(tmp_path, progress=False, stream=io.StringIO(), loggers="csv,tensorboard",
                      resumed_at=2)
    again.log({"step": 3, "loss": 30.0})
    again.close()
    assert [(r["step"], r["loss"]) for r in _rows(tmp_path / "metrics.csv")] == [
        ("1", "1.0"), ("2", "2.0"), ("3", "30.0")]
    assert (tmp_path / "tb").is_dir()


# ----------------------------------------------------------------- issue 36, class 3
def _train(out, **options):
    from amptrain.trainer import Trainer
    from tests.conftest import tiny_classification, tiny_mlp

    return Trainer(device="cpu", no_progress=True, max_steps=1, batch_size=32, out=str(out),
                   logger="csv", **options).fit(tiny_mlp(), tiny_classification(n=64))


def test_a_users_metrics_csv_is_never_rewritten(tmp_path):
    import pytest

    from amptrain.common.errors import UserError

    (tmp_path / "metrics.csv").write_text("epoch,my own column\n1,2\n")
    with pytest.raises(UserError, match="already holds metrics.csv, which this command would "
                                        "replace"):
        _train(tmp_path)
    assert (tmp_path / "metrics.csv").read_text() == "epoch,my own column\n1,2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv"]  # nothing written


def test_a_fifo_or_a_directory_named_metrics_csv_is_one_error_not_a_hang(tmp_path):
    import os

    import pytest

    from amptrain.common.errors import UserError

    os.mkfifo(tmp_path / "metrics.csv")
    with pytest.raises(UserError, match="metrics.csv is a FIFO"):
        _train(tmp_path)
    with pytest.raises(UserError, match="metrics.csv is a FIFO"):
        _train(tmp_path, resume="auto")  # not this run's own file, even when resuming
    os.unlink(tmp_path / "metrics.csv")
    (tmp_path / "metrics.csv").mkdir()
    with pytest.raises(UserError, match="metrics.csv is a directory, but amptrain writes a "
                                        "file there"):
        _train(tmp_path)


def test_the_sink_itself_refuses_a_file_it_did_not_write(tmp_path):
    import pytest

    from amptrain.common.errors import UserError

    (tmp_path / "metrics.csv").write_text("a,b\n")
    with pytest.raises(UserError, match="exists already"):
        RunLogger(tmp_path, progress=False, stream=io.StringIO(), loggers="csv")
    assert (tmp_path / "metrics.csv").read_text() == "a,b\n"
