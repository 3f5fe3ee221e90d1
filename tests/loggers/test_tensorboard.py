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


def test_per_part_and_per_loss_fields_get_tags_under_their_field():
    assert tb_tag("d_loss") == "train/d_loss" and tb_tag("g_loss") == "train/g_loss"
    assert tb_tag("lr/generator") == "train/lr/generator"
    assert tb_tag("grad_norm/discriminator") == "train/grad_norm/discriminator"
    assert tb_tag("skipped_steps/generator") == "train/skipped_steps/generator"
    assert tb_tag("loss_scale/1") == "train/loss_scale/1"
    assert tb_tag("peak_mem_bytes/x") == "system/peak_mem_bytes/x"
    assert tb_tag("unknown/x") is None and tb_tag("samples") is None


def test_image_grids_read_back_as_images_at_their_steps(tmp_path):
    import io

    import numpy as np
    from PIL import Image

    sink = TensorBoardSink(tmp_path)
    grey = np.arange(6 * 5, dtype=np.uint8).reshape(6, 5, 1) * 8
    rgb = np.zeros((4, 3, 3), dtype=np.uint8)
    rgb[..., 1] = 200
    sink.images(10, {"samples": grey})
    sink.images(20, {"samples": rgb})
    sink.close()
    accumulator = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    accumulator.Reload()
    assert accumulator.Tags()["images"] == ["val/samples"]
    events = accumulator.Images("val/samples")
    assert [(e.step, e.width, e.height) for e in events] == [(10, 5, 6), (20, 3, 4)]
    first = np.asarray(Image.open(io.BytesIO(events[0].encoded_image_string)).convert("L"))
    assert np.array_equal(first, grey[..., 0])
    second = np.asarray(Image.open(io.BytesIO(events[1].encoded_image_string)).convert("RGB"))
    assert np.array_equal(second, rgb)
