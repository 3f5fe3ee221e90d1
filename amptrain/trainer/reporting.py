"""What the Trainer tells: log records, the banner, the result, and where a halt began."""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from ..precision import NonFiniteHalt, label
from ..nonfinite import first_nonfinite_module
from ..forward import forward_batch
from .base import TrainerBase
from .result import FitResult


class ReportingMixin(TrainerBase):
    """Records, messages and results of a :class:`~amptrain.trainer.Trainer` (mixed into it)."""

    def _log_train(self) -> None:
        assert self.optimizer is not None, "set up first"
        loss_sum = self.strategy.reduce_sum(self._loss_sum.detach().double())
        samples = self.strategy.reduce_sum(torch.tensor(float(self._loss_samples),
                                                        device=self.device, dtype=torch.float64))
        now = time.perf_counter()
        elapsed = now - self._last_log_time
        grad_norm = self._grad_norm
        record = {
            "step": self.step, "epoch": self._step_epoch,
            "loss": float((loss_sum / samples.clamp(min=1)).item()),
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "loss_scale": self.precision.loss_scale,
            "grad_norm": float(grad_norm.item()) if grad_norm is not None else None,
            "skipped_steps": self.precision.skipped_steps,
            "samples_per_s": self._samples_since_log / elapsed if elapsed > 0 else None,
            # Share of the training time spent waiting for the next window (host clock).
            "data_wait_frac": min(1.0, self._data_wait_s / elapsed) if elapsed > 0 else None,
            "peak_mem_bytes": self.memory.peak(),
        }
        record.update(self.task.throughput(record["samples_per_s"]))  # an LM's tokens_per_s
        self._loss_sum.zero_()
        self._loss_samples = 0
        self._samples_since_log = 0
        self._data_wait_s = 0.0
        self._last_log_time = time.perf_counter()
        self._last_log_step = self.step
        self._record(record)

    def _evaluate_and_log(self, final: bool = False, record: bool = True) -> None:
        self._resolve_pending()
        started = time.perf_counter()
        write_dir = self.out / "eval" if (final and self.out is not None) else None
        full = final and self.config.logging.final_eval_full
        if final and not full and self.last_eval is not None \
                and self._last_eval_step == self.step:
            # --eval-every just evaluated this step: the same weights, so write its reports
            # instead of a second pass (and a second, identical record).
            if write_dir is not None and self.strategy.is_main:
                self.last_eval.write(write_dir)
            return
        result = self.evaluate(self.model, self._val_data, write_dir=write_dir, full=full)
        self.last_eval = result
        self._last_eval_step = self.step
        if record:
            self._record({"step": self.step, "epoch": self._step_epoch, **result.record()})
        # Evaluation time is not training time: keep it out of samples_per_s.
        self._last_log_time += time.perf_counter() - started

    def _record(self, record: dict[str, Any]) -> None:
        self.history.append(record)
        self.logger.log(record)
        for cb in self.callbacks:
            if hasattr(cb, "on_log"):
                cb.on_log(self, record)

    def _emit(self, event: str) -> None:
        for cb in self.callbacks:
            hook = getattr(cb, event, None)
            if hook is not None:
                hook(self)

    def _banner(self) -> str:
        p = self.precision
        chosen = f" (auto: {p.name})" if p.requested == "auto" else ""
        processes = (f" x {self.strategy.world_size} processes"
                     if self.strategy.world_size > 1 else "")
        constant = ("; your optimizer keeps its learning rate (no schedule)"
                    if self.constant_lr else "")
        task = "" if self.task.name == "classification" else f"; task {self.task.name}"
        name = label(p.name, p.given)  # the user's spelling beside: 16-mixed (mixed_float16)
        return (f"amptrain: precision {name}{chosen} [{p.spec.summary}] on {self.device}; "
                f"{self.total_steps} steps of {self.config.batching.batch_size} samples "
                f"({self.micro_batch_size} x {self.accumulate} accumulated{processes})"
                f"{task}{constant}")

    def _explain_halt(self, halt: NonFiniteHalt) -> NonFiniteHalt:
        """Add the first module that produced a non-finite value to a halt message."""
        window = self._last_window
        if window is None:
            return halt
        model, optimizer = self.model, self.optimizer
        assert model is not None and optimizer is not None, "set up first"

        def rerun() -> None:
            with self.precision.autocast():
                loss, _, _ = forward_batch(model, window.micro_batches[0], self.loss_fn)
            self.precision.scale_loss(loss).backward()

        where = first_nonfinite_module(model, rerun)
        optimizer.zero_grad(set_to_none=True)
        if where is None:
            return halt
        module, phase = where
        return NonFiniteHalt(f"{halt}. First non-finite value: module '{module}' ({phase})",
                             halt.step)

    def _result(self) -> FitResult:
        train = [r for r in self.history if "loss" in r]
        speeds = [r["samples_per_s"] for r in train if r.get("samples_per_s")]
        tokens = [r["tokens_per_s"] for r in train if r.get("tokens_per_s")]
        waits = [r["data_wait_frac"] for r in train if r.get("data_wait_frac") is not None]
        return FitResult(
            precision=self.precision.name, steps=self.step, epochs_completed=self.epoch,
            final_loss=train[-1]["loss"] if train else None,
            val_loss=self.last_eval.loss if self.last_eval else None,
            val_acc=self.last_eval.metrics.get("acc") if self.last_eval else None,
            val_metrics=dict(self.last_eval.metrics) if self.last_eval else {},
            skipped_steps=self.precision.skipped_steps,
            samples_per_s=float(np.median(speeds)) if speeds else None,
            tokens_per_s=float(np.median(tokens)) if tokens else None,
            data_wait_frac=float(np.median(waits)) if waits else None,
            peak_mem_bytes=self.memory.peak(),
            out=str(self.out) if self.out else None, history=list(self.history))
