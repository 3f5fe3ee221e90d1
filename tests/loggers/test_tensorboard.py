"""The TensorBoard tracker: DESIGN.md's tags, ``val/<metric>`` for every task's metrics,
non-numbers skipped."""
from __future__ import annotations

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from amptrain.loggers.tensorboard import TensorBoardSink, tb_tag


def test_tags_and_values_read_back(tmp_path):
    sink = TensorBoardSink(tmp_path)
    sink.log({"step": 3, "epoch": 0, "loss": 0.5, "note": "x", "flag": True, "lr": None})
    sink.log({"step": 3, "val_rmse": 1.5})
    sink.close()
    accumulator = EventAccumulator(str(tmp_path / "tb"))
    accumulator.Reload()
    assert set(accumulator.Tags()["scalars"]) == {"train/loss", "val/rmse"}
    assert [(e.step, e.value) for e in accumulator.Scalars("val/rmse")] == [(3, 1.5)]


def test_tag_names():
    assert tb_tag("loss_scale") == "train/loss_scale" and tb_tag("val_acc") == "val/acc"
    assert tb_tag("epoch") is None
