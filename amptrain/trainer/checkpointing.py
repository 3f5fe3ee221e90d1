"""The Trainer's checkpoints: the files (written now or on a background thread), the
config as run, and finding the checkpoint to resume from. What a checkpoint holds is the
parts' state, collected by :meth:`Trainer.state_dict <amptrain.trainer.Trainer.state_dict>`."""
from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .. import checkpoint
from ..version import __version__
from ..config import TrainConfig, to_dict
from ..distributed import Strategy
from ..errors import UserError, flag
from ..optim import LrPlan

if TYPE_CHECKING:
    from .core import Trainer
    from .optimizers import OptimizerSteps, Part

log = logging.getLogger("amptrain")


def collect_state(trainer: Trainer, *, weights: bool = True) -> dict[str, Any]:
    """A checkpoint: each part's state, the weights in fp32 (one part: today's format).
    ``weights=False``: model and optimizer entries left empty (a sharded save writes them
    as shards, :mod:`amptrain.checkpoint.sharded`)."""
    steps, model, task = trainer.steps, trainer.model, trainer.task
    assert steps is not None and model is not None and task is not None, "set up first"
    rng = checkpoint.capture_rng()
    windows = trainer.train_windows
    return {
        "format": checkpoint.FORMAT, "format_version": checkpoint.FORMAT_VERSION,
        "amptrain_version": __version__, "torch_version": str(torch.__version__),
        "precision_name": trainer.precision.name,
        "model": trainer.strategy.model_state_dict(model, trainer.precision) if weights else {},
        **steps.state_dict(trainer.strategy, optimizer_states=weights),
        "precision": trainer.precision.state_dict(),
        # Each versioned section's layout, for its migrate() when a later amptrain reads it.
        "section_versions": {trainer.precision.section: trainer.precision.format_version},
        # What the task learnt from the data (regression's target statistics): eval and
        # generate rebuild the task from it.
        "task": {"name": task.name, **task.state()},
        "rng": rng, **trainer.position.state_dict(),
        "steps_per_epoch": len(windows) if windows is not None else None,
        # The metrics window in progress (--log-every), so a resumed run logs the same
        # means. Every rank restores rank 0's sums: right counts, loss estimated by rank 0.
        "log_window": {**trainer.metrics.state_dict(),
                       "step_epoch": trainer.position.step_epoch},
        "config": trainer.resolved_config(), "run": trainer.run_info,
    }


def save_run(trainer: Trainer, path: str | Path | None = None, *,
             background: bool) -> Path | None:
    """Save ``trainer``'s state to ``path`` or the run's checkpoints; ``background``: the
    file is written on a thread, which copies every part's optimizer state itself (their
    next ``step()`` waits for it), or, under FSDP, each rank writes its shards."""
    steps = trainer.steps
    assert steps is not None, "set up first"
    if background and path is None and trainer.checkpointer.sharded(steps):
        return trainer.checkpointer.save_sharded(collect_state(trainer, weights=False),
                                                 trainer.step, steps.only())
    return trainer.checkpointer.save(trainer.state_dict(), trainer.step, path,
                                     background=background,
                                     defer=[part.optimizer for part in steps.parts.values()])


def restore_state(trainer: Trainer, state: dict[str, Any]) -> None:
    """Restore :func:`collect_state` into a set-up Trainer."""
    steps = trainer.steps
    assert steps is not None, "set up first"
    if state.get("sharded"):  # weights and optimizer state are in the shards
        part = steps.only()
        checkpoint.load_into(state["sharded"], part.module, part.optimizer)
    else:
        trainer.load_weights(state["model"])
    steps.load_state_dict(trainer.strategy, state,
                         optimizer_states=not state.get("sharded"))
    precision = trainer.precision
    versions = state.get("section_versions") or {}   # none: written before versions (0)
    section = precision.migrate(state.get(precision.section, {}),
                                versions.get(precision.section, 0))
    precision.load_state_dict(section)
    first_pair = (section.get("pairs") or [{}])[0]
    saved_rule = (first_pair.get("weight_update") or {}).get("rule")
    if saved_rule and not precision.has_weight_rule():  # resumed with plain
        log.warning("warning: the checkpoint's %s weight-update state is dropped: "
                    "%s plain rounds the updates (resume with %s %s to keep it)",
                    saved_rule, flag("weight_update"), flag("weight_update"), saved_rule)
    checkpoint.restore_rng(state.get("rng", {}))
    trainer.position.load_state_dict(state)
    window = state.get("log_window")
    if window:
        trainer.metrics.load_state_dict(window)


def resume_if_requested(trainer: Trainer) -> None:
    """``--resume``: load the checkpoint it names into the set-up Trainer (all ranks)."""
    if not trainer.config.checkpointing.resume:
        return
    found = trainer.checkpointer.find_resume()
    if found is not None:
        path, state = found
        checkpoint.check_compatible(state, trainer.resolved_config(), trainer.run_info, path)
        try:
            trainer.load_state_dict(state)
        except UserError as exc:
            raise UserError(f"--resume {path}: {exc}") from None
        assert trainer.train_windows is not None
        log.info(checkpoint.resume_message(path, state, trainer.precision.name,
                                           len(trainer.train_windows)))
        trainer.resumed_finished = trainer.complete()
        if trainer.resumed_finished:
            log.info("the run already finished at step %d: nothing left to train (raise "
                     "%s or %s to train on)", trainer.step, flag("epochs"), flag("max_steps"))
    trainer.checkpointer.trim_metrics(trainer.step)


class Checkpointer:
    """Writes a run's checkpoints (rank 0) and finds the one to resume from.

    ``out``: the run directory (None: nowhere to write unless a path is given).
    """

    def __init__(self, out: Path | None, config: TrainConfig, strategy: Strategy) -> None:
        self.out, self.config, self.strategy = out, config, strategy
        self.writes = checkpoint.BackgroundWriter()  # the write in flight, if any
        self.last_saved_step: int | None = None

    def saved_at(self, step: int) -> bool:
        """Whether the run's checkpoint of ``step`` is written (or being written)."""
        return self.last_saved_step == step

    def sharded(self, steps: OptimizerSteps) -> bool:
        """Whether the run's background saves are sharded (FSDP with one part: each rank
        writes its shards; the end of the run still writes one full ``last.pt``)."""
        return self.out is not None and self.strategy.sharded_checkpoints and steps.single

    def save_sharded(self, state: dict[str, Any], step: int, part: Part) -> Path:
        """A sharded save of ``part`` with the plain values ``state`` (collective). It does
        not count as the run's checkpoint of ``step``: the end writes a full one."""
        assert self.out is not None, "sharded saves go to the run directory"
        return self.writes.submit_sharded(
            self.out / checkpoint.CHECKPOINT_DIR, step, state, part.module, part.optimizer,
            is_main=self.strategy.is_main, keep_last=self.config.checkpointing.keep_last)

    def save(self, state: dict[str, Any], step: int, path: str | Path | None = None, *,
             background: bool, defer: Sequence[torch.optim.Optimizer] = ()) -> Path | None:
        """Write ``state`` to ``path`` or ``OUT/checkpoints/`` (as ``step``); ``background``:
        return at once, the file is written on a thread
        (:class:`~amptrain.checkpoint.BackgroundWriter`), which copies the parameters and
        state of the optimizers in ``defer`` itself: their next ``step()`` waits for it."""
        if path is None and self.out is not None:
            # On every rank, as rank 0 does below: FSDP gathers the state collectively, so
            # all ranks must agree on the steps that save.
            self.last_saved_step = step
        if not self.strategy.is_main:
            return None
        if path is not None:
            self.writes.wait()
            checkpoint.atomic_save(state, path)
            return Path(path)
        if self.out is None:
            return None
        directory = self.out / checkpoint.CHECKPOINT_DIR
        keep_last = self.config.checkpointing.keep_last

        def write(state: dict[str, Any]) -> Path:
            return checkpoint.save_run_checkpoint(state, directory, step, keep_last)

        if background:
            self.writes.submit(state, write, directory, defer=defer)
            return directory / checkpoint.LAST
        self.writes.wait()
        return write(state)

    def wait(self, failing: BaseException | None = None) -> None:
        """Wait for the write in flight (the end of a run).

        ``failing``: the exception ending the run. A second signal (SystemExit,
        KeyboardInterrupt) abandons the write: the process exits at once. Another
        exception stays the one raised, and a failed write is only logged beside it.
        """
        if isinstance(failing, (SystemExit, KeyboardInterrupt)):
            self.writes.abandon()
            return
        try:
            self.writes.wait()
        except Exception as exc:
            if failing is None:
                raise
            log.error("%s", exc)

    def find_resume(self) -> tuple[Path, dict[str, Any]] | None:
        """The checkpoint ``--resume`` names, loaded on every rank (None: start fresh).

        Rank 0 decides and every rank follows: another rank may not see a just-written
        file yet, and an error must stop all ranks, not leave them waiting for rank 0.
        """
        decision, found = None, None
        resume = self.config.checkpointing.resume
        assert resume is not None, "only with --resume"
        if self.strategy.is_main:
            try:
                found = checkpoint.find_resume(resume, self.out, cleanup=True)
                decision = ("resume", str(found[0])) if found is not None else ("fresh", None)
            except UserError as exc:
                decision = ("error", str(exc))
        kind, value = self.strategy.broadcast_object(decision)
        if kind == "error":
            raise UserError(value)
        if kind != "resume":
            return None
        path = Path(value)
        return path, found[1] if found is not None else checkpoint.read(path)

    def trim_metrics(self, step: int) -> None:
        """Records a killed run logged after its checkpoint are about to be logged again."""
        if self.strategy.is_main and self.out is not None:
            checkpoint.trim_metrics(self.out / "metrics.jsonl", step)


def resolved_config(config: TrainConfig, *, precision: str, device: Any, world_size: int,
                    micro: int | None, accumulate: int | None, lr_plan: LrPlan | None,
                    planner_report: dict[str, Any], run_info: dict[str, Any]
                    ) -> dict[str, Any]:
    """The config as run: precision resolved, batching and learning rate derived."""
    resolved = to_dict(config)
    resolved["precision"] = precision
    resolved["device"] = str(device)
    if micro is not None and accumulate is not None:
        resolved["micro_batch_size"] = micro
        resolved["accumulate"] = accumulate
    # config.yaml is a recipe: fed back with --config it must rerun the same maths,
    # so it holds the lr and warm-up actually used (scaling already applied) and
    # keeps how they were derived in the informational lr_schedule block.
    resolved["lr"] = (lr_plan or LrPlan.for_batch(config)).lr
    resolved["lr_scaling"] = "none"
    if lr_plan is not None:
        resolved["warmup_steps"] = lr_plan.warmup_steps
        resolved["lr_schedule"] = {"lr_scaling": config.schedule.lr_scaling,
                                   **lr_plan.report()}
    if config.batching.auto:
        resolved["memory_budget_gb"] = None  # the search ran; its result is fixed above
    resolved.update(planner_report)
    resolved["world_size"] = world_size
    resolved.update({k: v for k, v in run_info.items() if k in ("model", "data")})
    return resolved


