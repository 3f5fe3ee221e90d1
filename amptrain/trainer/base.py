"""What the Trainer's parts share: its state, declared once with its types, and the few
methods one part calls on another. :class:`~amptrain.trainer.core.Trainer` sets the state
and implements the methods; the parts (:mod:`.checkpointing`, :mod:`.reporting`,
:mod:`.batching`) build on this class, so none of them needs to know the Trainer."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..autobatch import MicroBatchSplit, MicroBatchPlanner
from ..batches import StepBatch
from ..checkpoint import BackgroundWriter
from ..config import TrainConfig
from ..distributed import Strategy
from ..logs import RunLogger
from ..optim import LrPlan
from ..memory import MemoryMeter
from ..precision import Precision, StepOutcome
from .snapshot import StepStart
from ..forward import LossFn
from ..tasks import EvalResult, Task


class TrainerBase:
    """The Trainer's state (see the module docstring)."""

    config: TrainConfig
    given_options: set[str]
    strategy: Strategy
    device: torch.device
    memory: MemoryMeter
    precision: Precision
    callbacks: list[Any]
    print_every: int | None
    run_info: dict[str, Any]
    out: Path | None
    logger: RunLogger
    # Loop position: optimizer steps done, current epoch, windows done in that epoch.
    step: int
    epoch: int
    window_in_epoch: int
    history: list[dict[str, Any]]
    model: nn.Module | None          # the user's module, set up for precision
    train_model: nn.Module | None    # what the loop calls (wrapped/compiled)
    optimizer: torch.optim.Optimizer | None
    scheduler: Any
    lr_plan: LrPlan | None
    task: Task
    loss_fn: LossFn
    last_eval: EvalResult | None
    planner: MicroBatchPlanner
    batch_plan: MicroBatchSplit | None
    train_windows: Any
    total_steps: int
    constant_lr: bool
    stop_requested: str | None
    _oom_events_told: int
    _step_start: StepStart | None
    _val_data: Any
    _pending: StepOutcome | None
    _last_window: StepBatch | None
    _grad_norm: torch.Tensor | None
    _loss_sum: torch.Tensor
    _loss_samples: int
    _samples_since_log: int
    _data_wait_s: float
    _last_log_time: float
    _last_log_step: int
    _last_saved_step: int | None
    _last_eval_step: int | None   # the step of last_eval (the final pass reuses it)
    _step_epoch: int
    _stopping: str | None
    _check_outputs: Callable[[Any, Any], None] | None
    _resumed_finished: bool
    _writes: BackgroundWriter     # the checkpoint write in flight, if any

    @property
    def micro_batch_size(self) -> int:
        """Samples per forward/backward on each device (the plan in use)."""
        assert self.batch_plan is not None, "set up first"
        return self.batch_plan.micro_batch

    @property
    def accumulate(self) -> int:
        """Micro-batches per optimizer step on each device (the plan in use)."""
        assert self.batch_plan is not None, "set up first"
        return self.batch_plan.accumulate

    # Implemented by the Trainer; declared here for the parts that call them.
    def evaluate(self, model: nn.Module | None = None, data: Any = None, *,
                 write_dir: str | Path | None = None, full: bool = False) -> EvalResult:
        raise NotImplementedError

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        raise NotImplementedError

    def _resolve_pending(self) -> None:
        raise NotImplementedError

    def _complete(self) -> bool:
        raise NotImplementedError

    # Implemented by the parts; declared here for the Trainer and the other parts.
    def save_checkpoint(self, path: str | Path | None = None) -> Path | None:
        raise NotImplementedError

    def _save(self, path: str | Path | None = None, *, background: bool) -> Path | None:
        raise NotImplementedError

    def resolved_config(self) -> dict[str, Any]:
        raise NotImplementedError

    def _saved_at_current_step(self) -> bool:
        raise NotImplementedError

    def _record(self, record: dict[str, Any]) -> None:
        raise NotImplementedError

    def _windows(self, data: Any, micro: int, accumulate: int, shuffle: bool) -> Any:
        raise NotImplementedError
