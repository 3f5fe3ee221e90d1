"""Where metrics go: metrics.jsonl, the chosen trackers (``--logger``: TensorBoard by
default, MLflow, CSV; see :mod:`amptrain.loggers`) and tqdm bars (or plain log lines).

The Trainer hands over plain Python numbers that it read once per ``--log-every``
steps; nothing here touches a device tensor.
"""
from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from ..common.errors import AmptrainError, flag
from ..loggers import DEFAULT, build_sinks, parse_names
from ..loggers.tensorboard import TB_TAGS, tb_tag
from ..checkpoint.resume import saved_so_far
from ..common.pathkind import write_failure

__all__ = ["TB_TAGS", "RunLogger", "tb_tag"]

log = logging.getLogger("amptrain")

def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 or abs(value) >= 1e4 else f"{value:.4f}"
    return str(value)


def shown_key(key: str, task_fields: Iterable[str] = ()) -> bool:
    """Whether the console line and the bar show a record field: every loss the step
    logged (``loss``, a GAN's ``d_loss``/``g_loss``: any ``*_loss``), the learning rate of
    a one-part run, every loss scale (``loss_scale``, ``loss_scale/<id>``), every
    evaluation metric (``val_*``) and the fields the task declares
    (:attr:`~amptrain.tasks.logkeys.LogKeys.shown_fields`: PPO's episode return)."""
    return (key in ("loss", "lr", "loss_scale") or key in task_fields
            or key.endswith("_loss") or key.startswith("loss_scale/") or key.startswith("val_"))


def is_train_record(record: dict[str, Any]) -> bool:
    """A training record (not an evaluation's): it has a loss or a speed."""
    return "loss" in record or "samples_per_s" in record


class LogWriteError(AmptrainError):
    """metrics.jsonl could not be written (a full disk, a lost mount): the run stops with
    one line (exit 1); the last checkpoint is intact and ``--resume auto`` continues."""

    exit_code = 1

    def __init__(self, path: Path, exc: OSError) -> None:

        saved = saved_so_far(path.parent)
        then = f"continue with {flag('resume')} auto" if "intact" in saved else "start it again"
        super().__init__(f"{write_failure(path, exc)}; the run stopped, {saved}: free space "
                         f"and {then}")


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
        loggers: the trackers (``--logger``), e.g. ``"tensorboard,mlflow"``; ``none``.
        params: the run's resolved config, for trackers that keep parameters (MLflow).
    """

    def __init__(self, out: str | Path | None, *, enabled: bool = True, progress: bool = True,
                 stream: TextIO | None = None, resumed_at: int | None = None,
                 print_every: int | None = None, loggers: str | list[str] = DEFAULT,
                 params: dict[str, Any] | None = None, shown: Iterable[str] = (),
                 speeds: Mapping[str, str] | None = None) -> None:
        self.enabled = enabled
        # The task's fields (its LogKeys part: shown_fields, speed_units): logs name no task's.
        self.shown, self.speeds = tuple(shown), dict(speeds or {})
        self.print_every = print_every
        self.stream = stream or sys.stderr
        self.progress = progress and enabled and self.stream.isatty()
        self._bar: tqdm | None = None
        self._jsonl: TextIO | None = None
        self._sinks: list[Any] = []
        if enabled and out is not None:
            out = Path(out)
            self._path = out / "metrics.jsonl"
            try:
                out.mkdir(parents=True, exist_ok=True)
                self._jsonl = open(self._path, "a", buffering=1)
            except OSError as exc:
                raise LogWriteError(self._path, exc) from None
            self._sinks = build_sinks(parse_names(loggers), out, resumed_at=resumed_at,
                                      params=params)

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
            try:
                self._jsonl.write(json.dumps(record) + "\n")
            except OSError as exc:  # a full disk: one line, the checkpoints are intact
                raise LogWriteError(self._path, exc) from None
        for sink in self._sinks:
            try:
                sink.log(record)
            except OSError as exc:
                raise LogWriteError(getattr(sink, "path", self._path), exc) from None
        shown = {k: v for k, v in record.items()
                 if v is not None and shown_key(k, self.shown)}
        if self._bar is not None:
            self._bar.set_postfix({k: _fmt(v) for k, v in shown.items()}, refresh=False)
        elif is_train_record(record) and self.print_every and record["step"] % self.print_every:
            pass  # a fine-grained training record for the files only
        else:
            text = "  ".join(f"{k} {_fmt(v)}" for k, v in shown.items())
            speed = record.get("samples_per_s")
            speed_text = f"  {speed:.0f} samples/s" if speed else ""
            for key, unit in self.speeds.items():
                value = record.get(key)
                speed_text += f"  {value:.0f} {unit}" if value else ""
            print(f"epoch {record.get('epoch')} step {record['step']}  {text}{speed_text}",
                  file=self.stream, flush=True)

    def images(self, step: int, images: dict[str, Any]) -> None:
        """An evaluation's image grids (``name`` -> ``H x W x C`` uint8 array) to the
        trackers that keep images (TensorBoard: ``val/<name>``)."""
        if not self.enabled or not images:
            return
        for sink in self._sinks:
            show = getattr(sink, "images", None)
            if show is None:
                continue
            try:
                show(step, images)
            except OSError as exc:
                raise LogWriteError(getattr(sink, "path", self._path), exc) from None

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """Scalars by their own tags (``numerics/...``) to the trackers that keep them
        (TensorBoard); not in metrics.jsonl."""
        if not self.enabled or not values:
            return
        for sink in self._sinks:
            write = getattr(sink, "scalars", None)
            if write is None:
                continue
            try:
                write(step, values)
            except OSError as exc:
                raise LogWriteError(getattr(sink, "path", self._path), exc) from None

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
            jsonl, self._jsonl = self._jsonl, None
            try:
                jsonl.close()
            except OSError:  # the write that failed already said so (LogWriteError)
                pass
        sinks, self._sinks = self._sinks, []
        for sink in sinks:
            try:
                sink.close()
            except OSError:  # reported by the write that failed
                pass
