"""The training loop. It owns no precision logic: every precision difference lives in
:class:`~amptrain.precision.Precision`, every process-group difference in the strategy.

One optimizer step ("step") is one global batch: ``accumulate`` micro-batches per rank.
``--max-steps``, ``--log-every``, ``--save-every`` and the LR schedule count steps.
"""
from __future__ import annotations

import functools
import logging
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from . import __version__, checkpoint, datacheck, outdir, preemption
from .autobatch import AutoBatch
from .batches import DatasetWindows, GlobalBatchPlan, LoaderWindows, Window
from .config import TrainConfig, build_config, to_dict, write_yaml
from .devices import peak_memory_bytes, reset_peak_memory
from .distributed import Strategy, build_strategy
from .errors import Preempted, UserError, flag
from .logs import RunLogger
from .lrscale import LrPlan, plan_lr
from .metrics import EvalResult, class_names_for
from .models import is_conv_net
from .optim import build_optimizer, build_scheduler, scaled_lr
from .precision import NonFiniteHalt, Precision, StepOutcome
from .probe import first_nonfinite_module

log = logging.getLogger("amptrain")

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: In-memory datasets up to this size are moved to the accelerator once, so batches
#: are sliced there instead of being copied over every step.
DEVICE_DATA_LIMIT_BYTES = 1 << 30


def seed_everything(seed: int, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (all devices); optionally force deterministic kernels."""
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


def tune_backends(device: torch.device, deterministic: bool) -> None:
    """Let cuDNN time its convolution algorithms once per input shape and keep the fastest.

    Worth it for the fixed shapes of a training loop (timm and torchvision's references
    do the same); off with ``--deterministic``, where the choice must not vary by run.
    """
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = not deterministic


def split_outputs(output: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(logits, loss) from a tensor, a dict, or an object with ``logits``/``loss`` (HF style)."""
    if isinstance(output, torch.Tensor):
        return output, None
    if isinstance(output, dict):
        return output.get("logits"), output.get("loss")
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0], None
    return getattr(output, "logits", None), getattr(output, "loss", None)


def forward_batch(model: nn.Module, batch: Any, loss_fn: LossFn,
                  check: Callable[[Any, Any], None] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Run the model on a batch: returns (mean loss, logits, targets).

    A batch is a tuple ``(*inputs, targets)`` or a dict of keyword inputs (with
    ``labels``). A model-computed ``loss`` wins over ``loss_fn``. ``check(logits,
    targets)``, when given, sees the outputs before the loss is computed from them.
    """
    if isinstance(batch, dict):
        output = model(**batch)
        targets = batch.get("labels")
    else:
        *inputs, targets = batch
        output = model(*inputs)
    logits, loss = split_outputs(output)
    if check is not None and loss is None:
        check(logits, targets)
    if loss is None:
        if logits is None or targets is None:
            raise UserError("the model returned no loss and no logits with targets: return logits "
                            "(a tensor) or an object with .loss")
        loss = loss_fn(logits, targets)
    return loss, logits, targets


@dataclass
class FitResult:
    """What a finished :meth:`Trainer.fit` reports."""

    precision: str
    steps: int
    epochs_completed: int
    final_loss: float | None
    val_loss: float | None
    val_acc: float | None
    skipped_steps: int
    samples_per_s: float | None
    peak_mem_bytes: int
    out: str | None
    history: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def nonfinite_metrics(self) -> list[str]:
        """Names of the final metrics that are NaN or infinite (a diverged run)."""
        values = {"loss": self.final_loss, "val_loss": self.val_loss}
        return [k for k, v in values.items() if v is not None and not np.isfinite(v)]


class Trainer:
    """The whole training loop: accumulation, clipping, logging, evaluation, checkpoints.

    ``Trainer(precision="bf16-mixed", accumulate=4, clip_grad_norm=1.0, out="runs/x")``
    takes any :class:`TrainConfig` field as a keyword, or a ready ``config``.
    ``callbacks`` are objects with any of ``on_fit_start(trainer)``,
    ``on_step_end(trainer)``, ``on_log(trainer, record)`` and ``on_fit_end(trainer)``.
    """

    def __init__(self, config: TrainConfig | None = None, *, strategy: Strategy | None = None,
                 callbacks: Iterable[Any] = (), run_info: dict[str, Any] | None = None,
                 **options: Any) -> None:
        base = to_dict(config) if config is not None else {}
        base.update(options)
        defaults = to_dict(TrainConfig())
        #: Options the caller chose (not left at their defaults).
        self.given_options = set(options) | {k for k, v in base.items()
                                             if k in defaults and v != defaults[k]}
        self.config: TrainConfig = build_config(type(config) if config is not None else TrainConfig,
                                                base)
        self.strategy = strategy or build_strategy(self.config.distributed.strategy,
                                                   self.config.device)
        self.device = self.strategy.device
        c = self.config
        self.precision = Precision.from_config(c.precision, device=self.device)
        self.callbacks = list(callbacks)
        self.run_info = dict(run_info or {})
        self.out = Path(c.out) if c.out else None
        self.logger = RunLogger(None, enabled=False)
        # Loop position: optimizer steps done, current epoch, windows done in that epoch.
        self.step = 0
        self.epoch = 0
        self.window_in_epoch = 0
        self.history: list[dict[str, Any]] = []
        self.model: nn.Module | None = None          # the user's module, set up for precision
        self.train_model: nn.Module | None = None    # what the loop calls (wrapped/compiled)
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: Any = None
        self.lr_plan: LrPlan | None = None
        self.autobatch = AutoBatch(self)  # --micro-batch-size auto, out-of-memory recovery
        self.loss_fn: LossFn = F.cross_entropy
        self.class_names: list[str] | None = None
        self.last_eval: EvalResult | None = None
        self._val_data: Any = None
        self._pending: StepOutcome | None = None
        self._last_window: Window | None = None
        self._grad_norm: torch.Tensor | None = None
        self._loss_sum = torch.zeros((), device=self.device)
        self._loss_samples = 0
        self._samples_since_log = 0
        self._last_log_time = 0.0
        self._last_log_step = 0
        self._last_saved_step: int | None = None
        self._step_epoch = 0  # epoch of the last trained step (for records)
        self.stop_requested: str | None = None  # set by a signal handler
        self._stopping: str | None = None        # the stop all ranks agreed on
        self._check_outputs: Callable[[Any, Any], None] | None = None  # first batch only
        self._resumed_finished = False
        self.constant_lr = False  # the caller's optimizer without a schedule (set up in fit)

    # ---------------------------------------------------------------- public
    def fit(self, model: nn.Module, train_data: Dataset | DataLoader | Iterable,
            val_data: Dataset | DataLoader | Iterable | None = None, *,
            optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
            loss_fn: LossFn | None = None, class_names: list[str] | None = None) -> FitResult:
        """Train ``model`` on ``train_data``; evaluate on ``val_data`` each epoch and at the end.

        Data may be a map-style Dataset (amptrain then owns batching, shuffling, sharding
        and exact resume) or a DataLoader / iterable of batches (each batch is one
        micro-batch; ``accumulate`` of them make a step).
        """
        self.setup(model, train_data, val_data, optimizer=optimizer, scheduler=scheduler,
                   loss_fn=loss_fn, class_names=class_names)
        return self.run()

    def setup(self, model: nn.Module, train_data: Any, val_data: Any = None, *,
              optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
              loss_fn: LossFn | None = None, class_names: list[str] | None = None) -> None:
        """Everything :meth:`fit` does before its first step (resume included).

        Split out so that tools (``compare``'s interleaved timing) can drive single steps
        with :meth:`train_step` on a fully prepared Trainer.
        """
        c = self.config
        self._check_fit_arguments(model, train_data, val_data, optimizer, loss_fn, class_names)
        if self.out is not None:
            outdir.check_on_main(self.out, resume=bool(c.checkpointing.resume),
                                 is_main=self.strategy.is_main,
                                 broadcast=self.strategy.broadcast_object)
        seed_everything(c.seed, c.deterministic)
        tune_backends(self.device, c.deterministic)
        self.loss_fn = loss_fn or F.cross_entropy
        self.class_names = class_names
        self._prepare_model(model, optimizer)
        micro, accumulate = c.batching.split(self.strategy.world_size)
        if c.batching.auto:
            micro, accumulate = self.autobatch.find_micro_batch(train_data)
        self.micro_batch_size, self.accumulate = micro, accumulate
        self.train_windows = self._windows(train_data, micro, accumulate, shuffle=True)
        if len(self.train_windows) == 0:
            raise UserError("train_data gives no batch for this process: it is empty or "
                            f"smaller than the {self.strategy.world_size} processes")
        self._val_data = val_data
        total = len(self.train_windows) * c.schedule.epochs
        self.total_steps = min(total, c.schedule.max_steps) if c.schedule.max_steps else total
        self.lr_plan = plan_lr(c, len(self.train_windows), self.total_steps)
        # The caller's own optimizer keeps the learning rate it was built with unless a
        # schedule is asked for: a default cosine decay to 0 would be a surprise.
        self.constant_lr = optimizer is not None and scheduler is None \
            and "scheduler" not in self.given_options
        self.scheduler = scheduler if scheduler is not None else None if self.constant_lr \
            else build_scheduler(self.lr_plan.scheduler_config(c), self.optimizer,
                                 self.total_steps)
        if loss_fn is None:
            self._check_model_outputs(train_data)
        if self.strategy.is_main and self.out is not None:
            outdir.prepare(self.out, resume=bool(c.checkpointing.resume))
        self._resume_if_requested()
        if self.strategy.is_main and self.out is not None:
            write_yaml(self.resolved_config(), self.out / "config.yaml")
        self.logger = RunLogger(self.out, enabled=self.strategy.is_main,
                                progress=not c.logging.no_progress,
                                resumed_at=self.step if self.step > 0 else None)
        emulated = self.precision.emulation_note()
        if emulated:  # first, so that nobody reads past it
            log.warning("%s", emulated)
        self.logger.message(self._banner())
        lr_note = self.lr_plan.describe(c)
        if lr_note:
            self.logger.message(f"amptrain: {lr_note}")

    def run(self) -> FitResult:
        """The training loop on a Trainer prepared by :meth:`setup`."""
        self._emit("on_fit_start")
        try:
            with preemption.stop_on_signals(self):
                self._loop()
        except NonFiniteHalt as halt:
            raise self._explain_halt(halt) from None
        finally:
            self.logger.close()
        self._emit("on_fit_end")
        result = self._result()
        bad = result.nonfinite_metrics()
        if bad:
            log.warning("training finished with non-finite %s: the model diverged (lower %s, "
                        "set %s, or run `amptrain diagnose`)", " and ".join(bad), flag("lr"),
                        flag("clip_grad_norm"))
        return result

    def train_step(self, window: Window) -> None:
        """One optimizer step on ``window`` (micro-batches on the device), without the
        loop's bookkeeping (logging, evaluation, checkpoints, step counter)."""
        self._train_step(window)

    def finish_step(self) -> None:
        """Wait for the last step and account for it (skip flag, LR schedule)."""
        self._resolve_pending()

    def evaluate(self, model: nn.Module | None = None, data: Any = None, *,
                 write_dir: str | Path | None = None) -> EvalResult:
        """Loss, accuracy and predictions on ``data`` under the training autocast.

        With ``write_dir`` the classification report goes there (rank 0 only).
        """
        model = model if model is not None else self.model
        data = data if data is not None else self._val_data
        if model is None or data is None:
            raise UserError("evaluate() needs a model and data (or a finished fit)")
        windows = self._windows(data, self._eval_micro(), 1, shuffle=False)
        was_training = model.training
        model.eval()
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float64)
        preds, targets = [], []
        self.logger.bar(len(windows), "eval")
        with torch.no_grad():
            for window in windows.epoch(0):
                for batch, n in zip(window.micro_batches, window.micro_samples):
                    with self.precision.autocast():
                        loss, logits, target = forward_batch(model, batch, self.loss_fn)
                    loss_sum += loss.detach().double() * n
                    if logits is not None and target is not None:
                        preds.append(logits.argmax(dim=-1).flatten())
                        targets.append(target.flatten())
                self.logger.advance()
        self.logger.close_bar()
        model.train(was_training)
        # Every rank joins the gathers, also one whose share of the data was empty.
        nothing = torch.empty(0, dtype=torch.long, device=self.device)
        pred = self.strategy.gather(torch.cat(preds) if preds else nothing)
        target = self.strategy.gather(torch.cat(targets) if targets else nothing)
        total_loss = self.strategy.reduce_sum(loss_sum).item()
        samples = int(target.numel()) or 1
        y_pred, y_true = pred.cpu().numpy(), target.cpu().numpy()
        num_classes = len(self.class_names) if self.class_names else \
            int(max(y_true.max(initial=0), y_pred.max(initial=0)) + 1)
        result = EvalResult(loss=total_loss / samples,
                            accuracy=float((y_pred == y_true).mean()) if len(y_true) else 0.0,
                            samples=len(y_true), predictions=y_pred, targets=y_true,
                            class_names=class_names_for(num_classes, self.class_names))
        if write_dir is not None and self.strategy.is_main:
            result.write(write_dir)
        return result

    def prepare(self, model: nn.Module) -> nn.Module:
        """Set a model up for this precision and device without training (for evaluation)."""
        model = model.to(self.device)
        if self.config.channels_last and is_conv_net(model):
            model = model.to(memory_format=torch.channels_last)
        self.model, _ = self.precision.setup(model, None)
        self.model.eval()
        return self.model

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        """Load fp32 weights (a checkpoint's ``model`` entry) into the prepared model."""
        mismatch = checkpoint.weights_mismatch(self.model.state_dict(), state)
        if mismatch:
            raise UserError(f"checkpoint does not fit this model: {mismatch}")
        try:
            self.strategy.load_model_state_dict(self.model, self.precision, state)
        except RuntimeError as exc:
            raise UserError(f"checkpoint does not fit this model: {_first_line(exc)}") from None

    def save_checkpoint(self, path: str | Path | None = None) -> Path | None:
        """Write the full training state (rank 0) to ``path`` or ``OUT/checkpoints/last.pt``."""
        self._resolve_pending()
        state = self.state_dict()
        if path is None and self.out is not None:
            # On every rank, as rank 0 does below: FSDP gathers the state collectively, so
            # all ranks must agree on the steps that save.
            self._last_saved_step = self.step
        if not self.strategy.is_main:
            return None
        if path is not None:
            checkpoint.atomic_save(state, path)
            return Path(path)
        if self.out is None:
            return None
        path = checkpoint.save_run_checkpoint(state, self.out / "checkpoints", self.step,
                                              self.config.checkpointing.keep_last)
        self._last_saved_step = self.step
        return path

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: weights (fp32), optimizer, scaler, RNG, position."""
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
        self.strategy.load_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.precision.load_state_dict(state.get("precision", {}))
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
        if hasattr(self, "micro_batch_size"):
            resolved["micro_batch_size"] = self.micro_batch_size
            resolved["accumulate"] = self.accumulate
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
        resolved.update(self.autobatch.report())
        resolved["world_size"] = self.strategy.world_size
        resolved.update({k: v for k, v in self.run_info.items() if k in ("model", "data")})
        return resolved

    # ----------------------------------------------------------------- setup
    def _check_fit_arguments(self, model: Any, train_data: Any, val_data: Any, optimizer: Any,
                             loss_fn: Any, class_names: Any) -> None:
        """One clear error per wrong argument of :meth:`fit`, before anything is built."""
        if not isinstance(model, nn.Module):
            raise UserError(f"model must be a torch.nn.Module (got {type(model).__name__})")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise UserError(f"optimizer must be a torch.optim.Optimizer (got "
                            f"{type(optimizer).__name__})")
        if loss_fn is not None and not callable(loss_fn):
            raise UserError(f"loss_fn must be callable as loss_fn(logits, targets) (got "
                            f"{type(loss_fn).__name__})")
        if class_names is not None and (isinstance(class_names, str) or not all(
                isinstance(n, str) for n in class_names)):
            raise UserError("class_names must be a list of strings, one per class")
        names = list(class_names) if class_names is not None else None
        datacheck.check_dataset(train_data, "train_data", classifier=loss_fn is None,
                                class_names=names)
        if val_data is not None:
            datacheck.check_dataset(val_data, "val_data", classifier=loss_fn is None,
                                    class_names=names)
        if isinstance(train_data, Dataset) and hasattr(train_data, "__len__"):
            datacheck.check_batch_size(len(train_data), self.config.batching.batch_size)

    def _check_model_outputs(self, train_data: Any) -> None:
        """Check that the model's outputs fit the labels: now, on two in-memory samples
        (so a wrong model is refused before the first log line), or else on the first
        training batch. The probe runs in eval mode with the RNG restored: training sees
        exactly what it would have seen without it."""
        num_classes = len(self.class_names) if self.class_names else None
        sample = datacheck.first_samples(train_data, self.device) \
            if self.strategy.world_size == 1 else None
        check = functools.partial(datacheck.check_outputs, num_classes=num_classes,
                                  model_name=self.run_info.get("model"),
                                  all_labels=train_data.tensors[-1] if sample else None)
        if sample is None:
            self._check_outputs = check
            return
        devices = [self.device] if self.device.type == "cuda" else []
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.random.fork_rng(devices=devices), torch.no_grad(), \
                    self.precision.autocast():
                forward_batch(self.model, sample, self.loss_fn, check)
        finally:
            self.model.train(was_training)

    def _prepare_model(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        model = model.to(self.device)
        if self.config.channels_last and is_conv_net(model):
            model = model.to(memory_format=torch.channels_last)
        model = self.strategy.prepare_model(model, self.precision, optimizer)
        optimizer = optimizer or build_optimizer(
            self.config, model, fused_allowed=self.precision.allows_fused(self.config.schedule.optimizer))
        self.model, self.optimizer = self.precision.setup(model, optimizer)
        train_model = self.strategy.wrap(self.model)
        if self.config.compile:
            train_model = torch.compile(train_model)
        self.train_model = train_model
        self.model.train()

    def _windows(self, data: Any, micro: int, accumulate: int, shuffle: bool) -> Any:
        if isinstance(data, Dataset) and hasattr(data, "__len__") and not isinstance(data, DataLoader):
            data = self._maybe_on_device(data)
            world = self.strategy.world_size
            plan = GlobalBatchPlan(len(data), micro * accumulate * world, micro,
                                   world_size=world, rank=self.strategy.rank,
                                   seed=self.config.seed, shuffle=shuffle)
            return DatasetWindows(data, plan, self.device, num_workers=self.config.batching.num_workers)
        # Only evaluation reads data unshuffled.
        data = self.strategy.shard_loader(data, seed=self.config.seed, evaluation=not shuffle)
        return LoaderWindows(data, accumulate, self.device, self.strategy.world_size)

    def _maybe_on_device(self, data: Dataset) -> Dataset:
        if self.device.type == "cpu" or not hasattr(data, "tensors") or not hasattr(data, "to"):
            return data
        if data.tensors[0].device == self.device:
            return data
        return data.to(self.device) if data.nbytes() <= DEVICE_DATA_LIMIT_BYTES else data

    def _eval_micro(self) -> int:
        micro, accumulate = self.config.batching.split(self.strategy.world_size)
        return micro * accumulate  # no gradients to hold: one pass per per-device batch

    def _resume_if_requested(self) -> None:
        if not self.config.checkpointing.resume:
            return
        # Rank 0 decides and every rank follows: another rank may not see a just-written
        # file yet, and an error must stop all ranks, not leave them waiting for rank 0.
        decision, found = None, None
        if self.strategy.is_main:
            try:
                found = checkpoint.find_resume(self.config.checkpointing.resume, self.out, cleanup=True)
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

    # ------------------------------------------------------------------ loop
    def _loop(self) -> None:
        c = self.config
        reset_peak_memory(self.device)
        self._last_log_time = time.perf_counter()
        self._last_log_step = self.step
        while self.epoch < c.schedule.epochs and not self._done():
            start = self.window_in_epoch
            self.logger.bar(len(self.train_windows), f"epoch {self.epoch + 1}/{c.schedule.epochs}", start)
            for window in self.train_windows.epoch(self.epoch, start):
                self._train_step(window)
                self._step_epoch = self.epoch
                self.step += 1
                self.window_in_epoch += 1
                self.logger.advance()
                self._after_step()
                self._agree_on_stop()
                if self._done():
                    break
            if self.window_in_epoch >= len(self.train_windows):
                self.epoch += 1
                self.window_in_epoch = 0
                self._end_of_epoch()
        if self._stopping is not None and not self._complete():
            raise self._preempted()
        self._resolve_pending()
        if self.step != self._last_log_step:
            self._log_train()
        self.logger.close_bar()
        if self._val_data is not None:
            # A finished run that was resumed has its final record already.
            self._evaluate_and_log(final=True, record=not self._resumed_finished)
        if self.out is not None and not self._saved_at_current_step():
            self.save_checkpoint()

    def _done(self) -> bool:
        return bool(self.config.schedule.max_steps and self.step >= self.config.schedule.max_steps) \
            or self._stopping is not None

    def _agree_on_stop(self) -> None:
        """Turn a signal (``stop_requested``) into a stop at a step all ranks share.

        One process stops right after the step it was signalled in. Several must stop at
        the same step, or the collective checkpoint would hang: they agree at --log-every
        boundaries, where the loop reads the device anyway (no extra sync per step).
        """
        if self.strategy.world_size == 1:
            self._stopping = self.stop_requested
            return
        if self.step % self.config.logging.log_every:
            return
        flag = torch.tensor([0.0 if self.stop_requested is None else 1.0], device=self.device)
        if self.strategy.reduce_sum(flag).item() > 0:
            self._stopping = self.stop_requested or "SIGTERM"

    def _complete(self) -> bool:
        return self.epoch >= self.config.schedule.epochs \
            or bool(self.config.schedule.max_steps and self.step >= self.config.schedule.max_steps)

    def _preempted(self) -> Preempted:
        """Checkpoint after a stop request (a signal) and build the exception that ends the run.

        No log record and no evaluation: the grace period before SIGKILL is short, and the
        metrics window in progress is saved, so the resumed run logs what this one would.
        """
        path = None
        if self.out is not None:
            path = self.out / checkpoint.CHECKPOINT_DIR / checkpoint.LAST \
                if self._saved_at_current_step() else self.save_checkpoint()
        else:
            self._resolve_pending()
        return preemption.preempted(self._stopping, self.step, path)

    def _forward_backward(self, window: Window) -> None:
        """Forward and backward of every micro-batch of ``window``; gradients accumulate."""
        world = self.strategy.world_size
        last = len(window.micro_batches) - 1
        losses = []
        check, self._check_outputs = self._check_outputs, None  # the run's first batch only
        for i, (batch, n) in enumerate(zip(window.micro_batches, window.micro_samples)):
            with self.strategy.accumulation_context(self.train_model, boundary=i == last):
                with self.precision.autocast():
                    loss, _, _ = forward_batch(self.train_model, batch, self.loss_fn,
                                               check if i == 0 else None)
                # The loss is a mean over this micro-batch, so its share of the step is
                # n / N (N = samples in the global batch). DDP then averages gradients over
                # ranks, which the factor `world` undoes: the sum over all ranks and
                # micro-batches is exactly the mean over the global batch. A share of
                # exactly 1 (no accumulation) is not multiplied in: that would cost a
                # kernel in the forward and one in the backward of every step, for nothing.
                share = n * world / window.global_samples
                self.precision.backward(loss if share == 1 else loss * share)
            losses.append((loss.detach(), n))
        # Counted once the whole window went through, so a redone window counts once.
        for loss, n in losses:
            self._loss_sum.add_(loss, alpha=n)
        self._loss_samples += sum(window.micro_samples)

    def _train_step(self, window: Window) -> None:
        # On out-of-memory, AutoBatch redoes this same global batch in smaller micro-batches.
        window = self.autobatch.run(window, self._forward_backward)
        self._last_window = window
        self._samples_since_log += window.global_samples
        # Reading the previous step's skip flag only now lets the GPU run this step's
        # forward/backward meanwhile; the LR it sets is still the one this step needs.
        self._resolve_pending()
        params = self.model.parameters()
        if self.config.schedule.clip_grad_norm:
            self._grad_norm = self.precision.clip_grad_norm_(params, self.config.schedule.clip_grad_norm)
        elif (self.step + 1) % self.config.logging.log_every == 0:
            self._grad_norm = self.precision.grad_norm(params)
        self._pending = self.precision.step_async(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)

    def _resolve_pending(self) -> None:
        outcome, self._pending = self._pending, None
        if outcome is None:
            return
        if self.precision.confirm(outcome, step=self.step) and self.scheduler is not None:
            self.scheduler.step()

    def _after_step(self) -> None:
        c = self.config
        if self.step % c.logging.log_every == 0:
            self._resolve_pending()
            self._log_train()
        self._emit("on_step_end")
        if c.logging.eval_every and self.step % c.logging.eval_every == 0 and self._val_data is not None:
            self._evaluate_and_log()
        if c.checkpointing.save_every and self.step % c.checkpointing.save_every == 0 and self.out is not None:
            self.save_checkpoint()

    def _end_of_epoch(self) -> None:
        if self._done() or self.epoch >= self.config.schedule.epochs:
            return  # the final evaluation and checkpoint follow right away
        if not self.config.logging.eval_every and self._val_data is not None:
            self._evaluate_and_log()
        if self.out is not None and not self._saved_at_current_step():
            self.save_checkpoint()

    def _saved_at_current_step(self) -> bool:
        return self._last_saved_step == self.step

    # --------------------------------------------------------------- metrics
    def _log_train(self) -> None:
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
            "peak_mem_bytes": peak_memory_bytes(self.device),
        }
        self._loss_sum.zero_()
        self._loss_samples = 0
        self._samples_since_log = 0
        self._last_log_time = time.perf_counter()
        self._last_log_step = self.step
        self._record(record)

    def _evaluate_and_log(self, final: bool = False, record: bool = True) -> None:
        self._resolve_pending()
        started = time.perf_counter()
        write_dir = self.out / "eval" if (final and self.out is not None) else None
        result = self.evaluate(self.model, self._val_data, write_dir=write_dir)
        self.last_eval = result
        if not record:
            return
        self._record({"step": self.step, "epoch": self._step_epoch, "val_loss": result.loss,
                      "val_acc": result.accuracy})
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
        return (f"amptrain: precision {p.name}{chosen} [{p.spec.summary}] on {self.device}; "
                f"{self.total_steps} steps of {self.config.batching.batch_size} samples "
                f"({self.micro_batch_size} x {self.accumulate} accumulated"
                f"{f' x {self.strategy.world_size} processes' if self.strategy.world_size > 1 else ''})"
                f"{'; your optimizer keeps its learning rate (no schedule)' if self.constant_lr else ''}")

    def _explain_halt(self, halt: NonFiniteHalt) -> NonFiniteHalt:
        """Add the first module that produced a non-finite value to a halt message."""
        window = self._last_window
        if window is None:
            return halt

        def rerun() -> None:
            with self.precision.autocast():
                loss, _, _ = forward_batch(self.model, window.micro_batches[0], self.loss_fn)
            self.precision.guard.scale(loss).backward()

        where = first_nonfinite_module(self.model, rerun)
        self.optimizer.zero_grad(set_to_none=True)
        if where is None:
            return halt
        module, phase = where
        return NonFiniteHalt(f"{halt}. First non-finite value: module '{module}' ({phase})",
                             halt.step)

    def _result(self) -> FitResult:
        train = [r for r in self.history if "loss" in r]
        speeds = [r["samples_per_s"] for r in train if r.get("samples_per_s")]
        return FitResult(
            precision=self.precision.name, steps=self.step, epochs_completed=self.epoch,
            final_loss=train[-1]["loss"] if train else None,
            val_loss=self.last_eval.loss if self.last_eval else None,
            val_acc=self.last_eval.accuracy if self.last_eval else None,
            skipped_steps=self.precision.skipped_steps,
            samples_per_s=float(np.median(speeds)) if speeds else None,
            peak_mem_bytes=peak_memory_bytes(self.device),
            out=str(self.out) if self.out else None, history=list(self.history))


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
