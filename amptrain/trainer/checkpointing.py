"""The Trainer's state as checkpoints hold it: saving, restoring and resuming."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from .. import __version__, checkpoint
from . import preemption
from ..config import to_dict
from ..errors import Preempted, UserError, flag
from ..optim import scaled_lr
from .base import TrainerBase

log = logging.getLogger("amptrain")


class CheckpointingMixin(TrainerBase):
    """Checkpoints of a :class:`~amptrain.trainer.Trainer` (mixed into it)."""

    def save_checkpoint(self, path: str | Path | None = None) -> Path | None:
        """Write the full training state (rank 0) to ``path`` or ``OUT/checkpoints/last.pt``;
        returns once the file is complete (a background write in flight is waited for first)."""
        return self._save(path, background=False)

    def _save(self, path: str | Path | None = None, *, background: bool) -> Path | None:
        """:meth:`save_checkpoint`; ``background``: copy the state and return, the run's
        checkpoint is written on a thread (:class:`~amptrain.checkpoint.BackgroundWriter`)."""
        self._resolve_pending()
        state = self.state_dict()
        if path is None and self.out is not None:
            # On every rank, as rank 0 does below: FSDP gathers the state collectively, so
            # all ranks must agree on the steps that save.
            self._last_saved_step = self.step
        if not self.strategy.is_main:
            return None
        if path is not None:
            self._writes.wait()
            checkpoint.atomic_save(state, path)
            return Path(path)
        if self.out is None:
            return None
        directory, step = self.out / checkpoint.CHECKPOINT_DIR, self.step
        keep_last = self.config.checkpointing.keep_last

        def write(state: dict[str, Any]) -> Path:
            return checkpoint.save_run_checkpoint(state, directory, step, keep_last)

        if background:
            self._writes.submit(state, write, directory)
            return directory / checkpoint.LAST
        self._writes.wait()
        return write(state)

    def _wait_for_writes(self, failing: BaseException | None = None) -> None:
        """Wait for the checkpoint write in flight (the end of :meth:`run`).

        ``failing``: the exception ending the run. A second signal (SystemExit,
        KeyboardInterrupt) abandons the write: the process exits at once. Another
        exception stays the one raised, and a failed write is only logged beside it.
        """
        if isinstance(failing, (SystemExit, KeyboardInterrupt)):
            self._writes.abandon()
            return
        try:
            self._writes.wait()
        except Exception as exc:
            if failing is None:
                raise
            log.error("%s", exc)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: weights (fp32), optimizer, scaler, RNG,
        position."""
        assert self.model is not None and self.optimizer is not None, "set up first"
        self._resolve_pending()  # the lagged step's skip flag decides the scheduler state
        rng = checkpoint.capture_rng()
        return {
            "format": checkpoint.FORMAT, "format_version": checkpoint.FORMAT_VERSION,
            "amptrain_version": __version__, "torch_version": str(torch.__version__),
            "precision_name": self.precision.name,
            "model": self.strategy.model_state_dict(self.model, self.precision),
            "optimizer": self.strategy.optimizer_state_dict(self.model, self.optimizer),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "precision": self.precision.state_dict(),
            # What the task learnt from the data (regression's target statistics): eval and
            # generate rebuild the task from it.
            "task": {"name": self.task.name, **self.task.state()},
            "rng": rng, "step": self.step, "epoch": self.epoch,
            "window_in_epoch": self.window_in_epoch,
            "steps_per_epoch": len(self.train_windows) if hasattr(self, "train_windows") else None,
            # The metrics window in progress (--log-every), so a resumed run logs the same
            # means. Every rank restores rank 0's sums: right counts, loss estimated by rank 0.
            "log_window": {"loss_sum": self._loss_sum.detach().cpu().clone(),
                           "loss_samples": self._loss_samples,
                           "samples_since_log": self._samples_since_log,
                           "grad_norm": None if self._grad_norm is None
                           else self._grad_norm.detach().cpu().clone(),
                           "step_epoch": self._step_epoch},
            "config": self.resolved_config(), "run": self.run_info,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into a prepared Trainer (after model/optimizer setup)."""
        self.load_weights(state["model"])
        assert self.model is not None and self.optimizer is not None, "set up first"
        self.strategy.load_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.precision.load_state_dict(state.get("precision", {}))
        saved_rule = ((state.get("precision") or {}).get("weight_update") or {}).get("rule")
        if saved_rule and not self.precision.has_weight_rule():  # resumed with plain
            log.warning("warning: the checkpoint's %s weight-update state is dropped: "
                        "%s plain rounds the updates (resume with %s %s to keep it)",
                        saved_rule, flag("weight_update"), flag("weight_update"), saved_rule)
        checkpoint.restore_rng(state.get("rng", {}))
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        self.window_in_epoch = int(state["window_in_epoch"])
        window = state.get("log_window")
        if window:
            self._loss_sum.copy_(window["loss_sum"])
            self._loss_samples = int(window["loss_samples"])
            self._samples_since_log = int(window["samples_since_log"])
            grad_norm = window.get("grad_norm")
            self._grad_norm = None if grad_norm is None else grad_norm.to(self.device)
            self._step_epoch = int(window["step_epoch"])

    def resolved_config(self) -> dict[str, Any]:
        """The config as run: precision resolved, batching and learning rate derived."""
        resolved = to_dict(self.config)
        resolved["precision"] = self.precision.name
        resolved["device"] = str(self.device)
        if self.batch_plan is not None:
            resolved["micro_batch_size"] = self.batch_plan.micro_batch
            resolved["accumulate"] = self.batch_plan.accumulate
        # config.yaml is a recipe: fed back with --config it must rerun the same maths,
        # so it holds the lr and warm-up actually used (scaling already applied) and
        # keeps how they were derived in the informational lr_schedule block.
        resolved["lr"] = scaled_lr(self.config)
        resolved["lr_scaling"] = "none"
        if self.lr_plan is not None:
            resolved["warmup_steps"] = self.lr_plan.warmup_steps
            resolved["lr_schedule"] = {"lr_scaling": self.config.schedule.lr_scaling,
                                       **self.lr_plan.report()}
        if self.config.batching.auto:
            resolved["memory_budget_gb"] = None  # the search ran; its result is fixed above
        resolved.update(self.planner.report())
        resolved["world_size"] = self.strategy.world_size
        resolved.update({k: v for k, v in self.run_info.items() if k in ("model", "data")})
        return resolved

    def _resume_if_requested(self) -> None:
        if not self.config.checkpointing.resume:
            return
        # Rank 0 decides and every rank follows: another rank may not see a just-written
        # file yet, and an error must stop all ranks, not leave them waiting for rank 0.
        decision, found = None, None
        if self.strategy.is_main:
            try:
                found = checkpoint.find_resume(self.config.checkpointing.resume, self.out,
                                               cleanup=True)
                decision = ("resume", str(found[0])) if found is not None else ("fresh", None)
            except UserError as exc:
                decision = ("error", str(exc))
        kind, value = self.strategy.broadcast_object(decision)
        if kind == "error":
            raise UserError(value)
        if kind == "resume":
            path = Path(value)
            state = found[1] if found is not None else checkpoint.load(path)
            checkpoint.check_compatible(state, self.resolved_config(), self.run_info, path)
            try:
                self.load_state_dict(state)
            except UserError as exc:
                raise UserError(f"--resume {path}: {exc}") from None
            log.info(checkpoint.resume_message(path, state, self.precision.name,
                                               len(self.train_windows)))
            self._resumed_finished = self._complete()
            if self._resumed_finished:
                log.info("the run already finished at step %d: nothing left to train (raise "
                         "%s or %s to train on)", self.step, flag("epochs"), flag("max_steps"))
        if self.strategy.is_main and self.out is not None:
            # Records a killed run logged after its checkpoint are about to be logged again.
            checkpoint.trim_metrics(self.out / "metrics.jsonl", self.step)

    def _preempted(self) -> Preempted:
        """Checkpoint after a stop request (a signal) and build the exception that ends the run.

        No log record and no evaluation: the grace period before SIGKILL is short, and the
        metrics window in progress is saved, so the resumed run logs what this one would.
        """
        assert self._stopping is not None  # only called once all ranks agreed to stop
        path = None
        if self.out is not None:
            path = self.out / checkpoint.CHECKPOINT_DIR / checkpoint.LAST \
                if self._saved_at_current_step() else self.save_checkpoint()
        else:
            self._resolve_pending()
        return preemption.preempted(self._stopping, self.step, path)

    def _saved_at_current_step(self) -> bool:
        return self._last_saved_step == self.step
