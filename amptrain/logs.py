"""Where metrics go: metrics.jsonl, TensorBoard and tqdm bars (or plain log lines).

The Trainer hands over plain Python numbers that it read once per ``--log-every``
steps; nothing here touches a device tensor.
"""
from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

log = logging.getLogger("amptrain")

#: metrics.jsonl field -> TensorBoard tag (DESIGN.md's contract).
TB_TAGS = {
    "loss": "train/loss", "lr": "train/lr", "loss_scale": "train/loss_scale",
    "grad_norm": "train/grad_norm", "skipped_steps": "train/skipped_steps",
    "samples_per_s": "train/samples_per_s", "val_loss": "val/loss", "val_acc": "val/acc",
    "peak_mem_bytes": "system/peak_mem_bytes", "tokens_per_s": "train/tokens_per_s",
    "data_wait_frac": "train/data_wait_frac",
}


def tb_tag(key: str) -> str | None:
    """The TensorBoard tag of a record field: :data:`TB_TAGS`, and ``val/<metric>`` for
    every task's ``val_<metric>`` (``val_rmse`` -> ``val/rmse``)."""
    if key in TB_TAGS:
        return TB_TAGS[key]
    return f"val/{key[4:]}" if key.startswith("val_") else None


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e4 else f"{value:.4f}"
    return str(value)


class RunLogger:
    """Fans one record out to every sink; a disabled logger (non-zero ranks) does nothing.

    Args:
        out: run directory (metrics.jsonl and tb/ go there); None writes no files.
        enabled: False on ranks other than 0.
        progress: show tqdm bars; forced off when ``stream`` is not a terminal, where
            each log event becomes one plain line instead.
        resumed_at: the checkpoint step a resumed run continues from; TensorBoard events
            logged after it by the interrupted run are purged.
        print_every: without a progress bar, print a training record's plain line only
            at steps that are multiples of this (every record when None). Files always get
            every record: ``compare`` records finely for its curves but prints as ``train``.
    """

    def __init__(self, out: str | Path | None, *, enabled: bool = True, progress: bool = True,
                 stream: TextIO | None = None, resumed_at: int | None = None,
                 print_every: int | None = None) -> None:
        self.enabled = enabled
        self.print_every = print_every
        self.stream = stream or sys.stderr
        self.progress = progress and enabled and self.stream.isatty()
        self._bar: tqdm | None = None
        self._jsonl: TextIO | None = None
        self._tb = None
        if enabled and out is not None:
            out = Path(out)
            out.mkdir(parents=True, exist_ok=True)
            self._jsonl = open(out / "metrics.jsonl", "a", buffering=1)
            from torch.utils.tensorboard import SummaryWriter

            # A resumed run logs the steps after its checkpoint again: purge what a killed
            # run wrote past that step so TensorBoard does not show those steps twice
            # (metrics.jsonl is trimmed the same way by checkpoint.trim_metrics).
            purge_step = resumed_at + 1 if resumed_at is not None else None
            self._tb = SummaryWriter(log_dir=str(out / "tb"), purge_step=purge_step)

    # bars -----------------------------------------------------------------
    def bar(self, total: int, desc: str, initial: int = 0) -> None:
        """Open a progress bar (one per epoch, and one per evaluation)."""
        self.close_bar()
        if self.progress:
            self._bar = tqdm(total=total, initial=initial, desc=desc, file=self.stream,
                             dynamic_ncols=True, leave=False, unit="step")

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close_bar(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # records --------------------------------------------------------------
    def log(self, record: dict[str, Any]) -> None:
        """Write one metrics record (a train log event or an eval event)."""
        if not self.enabled:
            return
        # Strict JSON has no NaN/inf: a non-finite value is written as null.
        record = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                  for k, v in record.items()}
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(record) + "\n")
        if self._tb is not None:
            step = record["step"]
            for key, value in record.items():
                tag = tb_tag(key)
                if tag and isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(tag, value, step)
        shown = {k: v for k, v in record.items() if v is not None and (
            k in ("loss", "lr", "loss_scale") or k.startswith("val_"))}
        if self._bar is not None:
            self._bar.set_postfix({k: _fmt(v) for k, v in shown.items()}, refresh=False)
        elif "loss" in record and self.print_every and record["step"] % self.print_every:
            pass  # a fine-grained training record for the files only
        else:
            text = "  ".join(f"{k} {_fmt(v)}" for k, v in shown.items())
            speed = record.get("samples_per_s")
            tokens = record.get("tokens_per_s")
            speed_text = f"  {speed:.0f} samples/s" if speed else ""
            speed_text += f"  {tokens:.0f} tokens/s" if tokens else ""
            print(f"epoch {record.get('epoch')} step {record['step']}  {text}{speed_text}",
                  file=self.stream, flush=True)

    def message(self, text: str) -> None:
        """A one-off line for the user, printed above any progress bar."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        self.close_bar()
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
            self._tb = None
