"""The Trainer's checkpoints: what one holds (the weights, the precision's state and the
section of every part registered with the :class:`Checkpointer`), the files (written now
or on a background thread), the config as run, and resuming from a checkpoint."""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .. import checkpoint
from ..checkpoint.stateful import Stateful
from .windows import Windows
from ..version import __version__
from ..config import TrainConfig, to_dict
from ..distributed import Strategy
from ..common.errors import UserError, flag
from .optim import LrSchedule
from ..precision import Precision
from .optimizers import OptimizerSteps
from .position import LoopPosition

log = logging.getLogger("amptrain")


class Checkpointer:
    """Writes a run's checkpoints (rank 0), finds the one to resume from and loads it.

    ``out``: the run directory (None: nowhere to write unless a path is given). A
    checkpoint holds a header (:meth:`header`), ``model``'s fp32 weights, the precision's
    state and the section of every part registered (:meth:`register`); ``steps`` decide
    whether saves are sharded. ``resolved()``: the config as run.
    """

    def __init__(self, out: Path | None, config: TrainConfig, strategy: Strategy, *,
                 model: nn.Module, precision: Precision, steps: OptimizerSteps,
                 position: LoopPosition, windows: Windows,
                 resolved: Callable[[], dict[str, Any]], run_info: dict[str, Any]) -> None:
        self.out, self.config, self.strategy = out, config, strategy
        self.model, self.precision, self.steps = model, precision, steps
        # The header's sources: where the loop is, the train windows (steps per epoch,
        # which an out-of-memory resize changes), the config as run.
        self.position, self.windows = position, windows
        self.resolved, self.run_info = resolved, run_info
        self.registry = checkpoint.StateRegistry()
        self.writes = checkpoint.BackgroundWriter()  # the write in flight, if any
        self.last_saved_step: int | None = None

    def register(self, part: Stateful) -> None:
        """``part``'s state goes into every checkpoint under its section, and back."""
        self.registry.register(part)

    # ------------------------------------------------------------- the state
    def header(self) -> dict[str, Any]:
        """What a checkpoint's readers (``--resume``'s choice of file, export, eval) look up
        without loading the parts: the step it was written at (a copy of the position's),
        the config as run, the run's facts."""
        position = self.position
        return {"precision_name": self.precision.name, "step": position.step,
                "epoch": position.epoch, "window_in_epoch": position.window_in_epoch,
                "steps_per_epoch": len(self.windows), "config": self.resolved(),
                "run": self.run_info}

    def state_dict(self, *, weights: bool = True) -> dict[str, Any]:
        """A checkpoint: the :meth:`header`, the fp32 weights, the precision's state and
        every registered section. ``weights=False``: the weights and optimizer states left
        empty (a sharded save writes them as shards, :mod:`amptrain.checkpoint.sharded`)."""
        given = {} if weights else {self.steps.section: self.steps.state_dict(
            optimizer_states=False)}
        # The sections first: the optimizer steps settle the lagged step, whose skip the
        # precision counts before its state is taken.
        sections = self.registry.state_dict(given)
        return {
            "format": checkpoint.FORMAT, "format_version": checkpoint.FORMAT_VERSION,
            "amptrain_version": __version__, "torch_version": str(torch.__version__),
            **self.header(),
            "model": self.strategy.model_state_dict(self.model, self.precision)
            if weights else {},
            **sections,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (of this or an older amptrain) into the set-up parts."""
        if state.get("sharded"):  # weights and optimizer state are in the shards
            part = self.steps.only()
            checkpoint.load_into(state["sharded"], part.module, part.optimizer)
        else:
            checkpoint.load_weights(self.model, state["model"], self.strategy, self.precision)
        self.registry.load_state_dict(state)
        precision = self.precision
        saved = self.registry.section_of(state, precision, checkpoint.section_versions(
            state).get(precision.section, 0))
        first_pair = (saved.get("pairs") or [{}])[0]
        saved_rule = (first_pair.get("weight_update") or {}).get("rule")
        if saved_rule and not precision.has_weight_rule():  # resumed with plain
            log.warning("warning: the checkpoint's %s weight-update state is dropped: "
                        "%s plain rounds the updates (resume with %s %s to keep it)",
                        saved_rule, flag("weight_update"), flag("weight_update"), saved_rule)

    def resume(self, resolved: dict[str, Any], run_info: dict[str, Any],
               steps_per_epoch: int) -> bool:
        """``--resume``: load the checkpoint it names (all ranks), checked against the
        config as run (``resolved``); returns whether one was loaded (False: start fresh)."""
        found = self.find_resume()
        if found is None:
            return False
        path, state = found
        checkpoint.check_compatible(state, resolved, run_info, path)
        try:
            self.load_state_dict(state)
        except UserError as exc:
            raise UserError(f"--resume {path}: {exc}") from None
        log.info(checkpoint.resume_message(path, state, self.precision.name, steps_per_epoch))
        return True

    # ------------------------------------------------------------- the files
    def saved_at(self, step: int) -> bool:
        """Whether the run's checkpoint of ``step`` is written (or being written)."""
        return self.last_saved_step == step

    def save_run(self, step: int, path: str | Path | None = None, *,
                 background: bool) -> Path | None:
        """Save the run at ``step`` to ``path`` or the run's checkpoints; ``background``: the
        file is written on a thread, which copies every part's optimizer state itself (their
        next ``step()`` waits for it), or, under FSDP, each rank writes its shards."""
        if background and path is None and self.sharded:
            return self.save_sharded(self.state_dict(weights=False), step)
        return self.save(self.state_dict(), step, path, background=background,
                         defer=[part.optimizer for part in self.steps.parts.values()])

    @property
    def sharded(self) -> bool:
        """Whether the run's background saves are sharded (FSDP with one part: each rank
        writes its shards; the end of the run still writes one full ``last.pt``)."""
        return self.out is not None and self.strategy.sharded_checkpoints and self.steps.single

    def save_sharded(self, state: dict[str, Any], step: int) -> Path:
        """A sharded save of the one part with the plain values ``state`` (collective). It
        does not count as the run's checkpoint of ``step``: the end writes a full one."""
        assert self.out is not None, "sharded saves go to the run directory"
        part = self.steps.only()
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
                    micro: int | None, accumulate: int | None, lr_schedule: LrSchedule | None,
                    sizer_report: dict[str, Any], run_info: dict[str, Any]
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
    resolved["lr"] = (lr_schedule or LrSchedule.for_batch(config)).lr
    resolved["lr_scaling"] = "none"
    if lr_schedule is not None:
        resolved["warmup_steps"] = lr_schedule.warmup_steps
        resolved["lr_schedule"] = {"lr_scaling": config.schedule.lr_scaling,
                                   **lr_schedule.report()}
    if config.batching.auto:
        resolved["memory_budget_gb"] = None  # the search ran; its result is fixed above
    resolved.update(sizer_report)
    resolved["world_size"] = world_size
    resolved.update({k: v for k, v in run_info.items() if k in ("model", "data")})
    return resolved


