"""TensorBoard event files under ``DIR/tb`` (the default tracker): every record's numbers
as scalars, and an evaluation's image grids (a GAN's samples) as images."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .base import Sink, numbers

#: metrics.jsonl field -> TensorBoard tag (the contract: docs/design.md).
TB_TAGS = {
    "loss": "train/loss", "lr": "train/lr", "loss_scale": "train/loss_scale",
    "grad_norm": "train/grad_norm", "skipped_steps": "train/skipped_steps",
    "samples_per_s": "train/samples_per_s", "val_loss": "val/loss", "val_acc": "val/acc",
    "peak_mem_bytes": "system/peak_mem_bytes", "tokens_per_s": "train/tokens_per_s",
    "data_wait_frac": "train/data_wait_frac",
}


def tb_tag(key: str) -> str | None:
    """The TensorBoard tag of a record field: :data:`TB_TAGS`, ``val/<metric>`` for every
    task's ``val_<metric>`` (``val_rmse`` -> ``val/rmse``), ``train/<key>`` for every loss a
    step logged (a GAN's ``d_loss``), and a per-part or per-loss field under its field's
    tag (``lr/generator`` -> ``train/lr/generator``, ``loss_scale/1`` ->
    ``train/loss_scale/1``)."""
    if key in TB_TAGS:
        return TB_TAGS[key]
    if key.startswith("val_"):
        return f"val/{key[4:]}"
    if key.endswith("_loss"):
        return f"train/{key}"
    field, _, which = key.partition("/")
    return f"{TB_TAGS[field]}/{which}" if which and field in TB_TAGS else None


class TensorBoardSink(Sink):
    name = "tensorboard"

    def __init__(self, out: Path, resumed_at: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # A resumed run logs the steps after its checkpoint again: purge what a killed
        # run wrote past that step so TensorBoard does not show those steps twice
        # (metrics.jsonl is trimmed the same way by checkpoint.trim_metrics).
        purge_step = resumed_at + 1 if resumed_at is not None else None
        self.path = out / "tb"  # named by a write that fails (a full disk)
        self._writer = SummaryWriter(log_dir=str(self.path), purge_step=purge_step)

    def log(self, record: dict[str, Any]) -> None:
        step = record["step"]
        for key, value in numbers(record).items():
            tag = tb_tag(key)
            if tag:
                self._writer.add_scalar(tag, value, step)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Scalars under their own tags (the numerics telemetry's ``numerics/...``)."""
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, step)

    def images(self, step: int, images: dict[str, Any]) -> None:
        """Each grid as the image ``val/<name>`` (an evaluation's, e.g. a GAN's ``val/samples``)."""
        for name, image in images.items():
            self._writer.add_image(f"val/{name}", image, step, dataformats="HWC")

    def close(self) -> None:
        self._writer.flush()
        self._writer.close()


def create(out: Path, *, resumed_at: int | None, params: dict[str, Any]) -> Sink:
    return TensorBoardSink(out, resumed_at)
