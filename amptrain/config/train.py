"""What a training run is configured with, nested by concern; each section validates
itself when it is built (never changing a value), and each error names the option."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..common.choices import (LOSSES, TASK_CHOICES,
                              TASK_NAMES)
from ..common.errors import UserError, flag
from ..loggers import parse_names as parse_logger_names
from ..precision.options import PrecisionConfig
from ..common.options import (
    build_config,
    given_options,
    option,
    require_choices,
    require_non_negative,
    require_positive,
    section,
    with_given_options,
    with_options,
)

#: adamw8bit: AdamW with block-wise 8-bit moments (torchao; see amptrain/optim.py).
OPTIMIZERS = ("sgd", "adamw", "adamw8bit")
SCHEDULERS = ("none", "cosine", "onecycle", "linear")
LR_SCALING = ("none", "linear", "sqrt")
STRATEGIES = ("auto", "ddp", "fsdp", "dp")
#: Passes over the data when neither --epochs nor --max-steps is given.
DEFAULT_EPOCHS = 3
DEFAULT_LR = {"adamw": 1e-3, "adamw8bit": 1e-3, "sgd": 0.05}
#: Lightning's bound: numpy seeds take 32 bits, and a seed is a name, not a size.
MAX_SEED = 2 ** 32 - 1


def numerics_period(value: Any) -> int | None:
    """``--numerics``: ``auto`` -> 0, ``off`` -> None, ``N`` -> N (a positive integer)."""
    text = str(value).strip().lower()
    if text == "auto":
        return 0
    if text == "off":
        return None
    every = int(text) if text.isdigit() else 0
    if every < 1:
        raise UserError(f"{flag('numerics')} takes auto, off or a number of steps "
                        f"(got {value!r})")
    return every


def _positive_numbers(section_: object, *names: str) -> None:
    for name in names:
        value = getattr(section_, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UserError(f"{flag(name)} must be a positive number (got {value})")


class MicroBatchSplit(NamedTuple):
    """How a per-device batch is cut: ``micro_batch`` samples x ``accumulate`` passes.

    The one owner of the batch split: :meth:`BatchingConfig.split` derives the run's from
    the options, the ``auto`` search and the out-of-memory recovery pick a divisor of the
    per-device batch, and each goes through :meth:`of`, the one rounding rule.
    """

    micro_batch: int
    accumulate: int

    @classmethod
    def of(cls, micro_batch: int, per_device: int) -> MicroBatchSplit:
        """The split of ``per_device`` samples into micro-batches of ``micro_batch``.

        One rule: the micro-batch divides the per-device batch exactly (every global batch
        is met exactly, never rounded up or down); callers pick a divisor."""
        if micro_batch < 1 or per_device % micro_batch:
            raise ValueError(f"micro-batch {micro_batch} does not divide the per-device "
                             f"batch {per_device}")
        return cls(micro_batch, per_device // micro_batch)

    @property
    def per_device(self) -> int:
        """Samples per optimizer step on each device."""
        return self.micro_batch * self.accumulate


@dataclass
class BatchingConfig:
    """How many samples make a step, and how they are cut into micro-batches."""

    batch_size: int = option(64, "effective global batch per optimizer step "
                                 "(micro-batch x accumulate x processes)")
    micro_batch_size: int | str | None = option(
        None, "samples per forward/backward on each device (an integer, or auto: the largest "
              "that fits, found by probing real steps)", kind=str, integer_or_word=True)
    memory_budget_gb: float | None = option(
        None, "memory a step may use, for --micro-batch-size auto (default: the GPU's own "
              "limit; on CPU the RAM available now; CPU counts peak RSS)", kind=float)
    accumulate: int | None = option(None, "micro-batches accumulated per optimizer step", kind=int)
    num_workers: int | str = option(
        "auto", "DataLoader worker processes for data decoded while training (image "
                "folders, your own Dataset), or auto: up to 4, one core left to training "
                "(in-memory and token data need none)", kind=str, integer_or_word=True)

    def __post_init__(self) -> None:
        require_positive(self, "batch_size")
        require_positive(self, "accumulate", optional=True)
        workers = self.num_workers
        if workers != "auto" and (not isinstance(workers, int) or isinstance(workers, bool)
                                  or workers < 0):
            raise UserError(f"{flag('num_workers')} must be >= 0 or auto (got {workers!r})")
        micro = self.micro_batch_size
        if micro is not None and micro != "auto":
            if not isinstance(micro, int) or isinstance(micro, bool) or micro < 1:
                raise UserError(f"{flag('micro_batch_size')} must be a positive integer or "
                                f"'auto' (got {micro!r})")
        if micro == "auto" and self.accumulate is not None:
            raise UserError(f"{flag('micro_batch_size')} auto derives {flag('accumulate')} "
                            f"from what fits; drop {flag('accumulate')} (or give an integer "
                            f"{flag('micro_batch_size')})")
        if self.memory_budget_gb is not None and micro != "auto":
            raise UserError(f"{flag('memory_budget_gb')} only applies with "
                            f"{flag('micro_batch_size')} auto")
        _positive_numbers(self, "memory_budget_gb")

    @property
    def auto(self) -> bool:
        """True when the micro-batch size is to be found by probing (``auto``)."""
        return self.micro_batch_size == "auto"

    def split(self, world_size: int = 1) -> MicroBatchSplit:
        """(micro_batch_size, accumulate) such that micro x accumulate x world_size == batch_size.

        Any two of --batch-size, --micro-batch-size and --accumulate determine the third;
        an inconsistent or indivisible combination is a user error that lists valid values.
        """
        bs, mbs, acc = flag("batch_size"), flag("micro_batch_size"), flag("accumulate")
        per_device, rem = divmod(self.batch_size, world_size)
        if rem:
            below = self.batch_size - rem
            nearest = f"{below} or {below + world_size}" if below else str(world_size)
            raise UserError(f"{bs} {self.batch_size} is not divisible by the "
                            f"{world_size} processes; use a multiple of {world_size} "
                            f"(nearest: {nearest})")
        micro = self.micro_batch_size if isinstance(self.micro_batch_size, int) else None
        if micro is not None and micro > per_device:
            where = f"the per-device batch {per_device} ({bs} {self.batch_size} over " \
                    f"{world_size} processes)" if world_size > 1 else f"{bs} {self.batch_size}"
            raise UserError(f"{mbs} {micro} is larger than {where}: a micro-batch is a part "
                            f"of the batch; lower {mbs} or raise {bs}")
        if micro is not None and self.accumulate is not None:
            if micro * self.accumulate != per_device:
                raise UserError(
                    f"{mbs} {micro} x {acc} {self.accumulate} x "
                    f"{world_size} process(es) = {micro * self.accumulate * world_size}, not "
                    f"{bs} {self.batch_size}; drop one of the three")
            return MicroBatchSplit.of(micro, per_device)
        if micro is not None:
            if per_device % micro:
                valid = [d for d in range(1, per_device + 1) if per_device % d == 0]
                near = [d for d in valid if d < micro][-1:] + [d for d in valid if d > micro][:1]
                step = micro * world_size
                batches = [b for b in (self.batch_size // step * step,
                                       self.batch_size // step * step + step) if b]
                raise UserError(f"{mbs} {micro} does not divide the per-device "
                                f"batch {per_device}; valid values: {_some(valid)} (nearest: "
                                f"{' or '.join(map(str, near))}), or keep it with {bs} "
                                f"{' or '.join(map(str, batches))}")
            return MicroBatchSplit.of(micro, per_device)
        accumulate = self.accumulate or 1
        if per_device % accumulate:
            valid = [d for d in range(1, per_device + 1) if per_device % d == 0]
            raise UserError(f"{acc} {accumulate} does not divide the per-device batch "
                            f"{per_device}; valid values: {_some(valid)}")
        return MicroBatchSplit.of(per_device // accumulate, per_device)


@dataclass
class ScheduleConfig:
    """How long to train, the optimizer, and the learning rate over the run."""

    # Both None by default: whether the user GAVE one decides the run's length
    # (trainer/position.py RunLength: --max-steps alone sets it, both: whichever ends first).
    epochs: int | None = option(None, f"passes over the training data (default: "
                                      f"{DEFAULT_EPOCHS}, or as many as --max-steps needs "
                                      f"when only that is given)", kind=int)
    max_steps: int | None = option(None, "optimizer steps to train: alone it sets the run's "
                                         "length (as many epochs as needed); with --epochs "
                                         "the run ends at whichever comes first", kind=int)
    optimizer: str = option("adamw", "optimizer: amptrain's, or any torch.optim class by "
                                     "name (Adadelta, RMSprop...)", choices=OPTIMIZERS,
                            open_choices=True)
    optimizer_args: str | None = option(None, "keyword arguments of a torch.optim --optimizer "
                                              "as a JSON object, e.g. '{\"rho\": 0.9}'",
                                        kind=str)
    lr: float | None = option(None, "learning rate (default: 1e-3 for adamw, 0.05 for sgd)",
                              kind=float)
    momentum: float = option(0.9, "SGD momentum")
    weight_decay: float = option(0.01, "weight decay")
    scheduler: str = option("cosine", "learning-rate schedule over the run (linear: decay to "
                                      "0 at the end, PPO's annealing), stepped every "
                                      "optimizer step; or any torch.optim.lr_scheduler class "
                                      "by name (StepLR...), stepped per --scheduler-interval",
                            choices=SCHEDULERS, open_choices=True)
    scheduler_args: str | None = option(None, "keyword arguments of a torch.optim.lr_scheduler "
                                              "--scheduler as a JSON object, e.g. "
                                              "'{\"step_size\": 1, \"gamma\": 0.7}'",
                                        kind=str)
    scheduler_interval: str | None = option(None, "when a torch.optim.lr_scheduler --scheduler "
                                                  "steps: once per epoch (the default, as in "
                                                  "Lightning) or per optimizer step",
                                            choices=("epoch", "step"))
    warmup_steps: int = option(0, "linear warm-up steps before the schedule")
    lr_scaling: str = option("none", "scale --lr with --batch-size / --base-batch-size",
                             choices=LR_SCALING)
    base_batch_size: int | None = option(None, "the batch size --lr was tuned for", kind=int)
    clip_grad_norm: float | None = option(None, "clip the (unscaled) gradient norm to this value",
                                          kind=float)

    def __post_init__(self) -> None:
        require_positive(self, "epochs", "max_steps", "base_batch_size", optional=True)
        require_non_negative(self, "warmup_steps", "weight_decay", "momentum")
        _positive_numbers(self, "lr", "clip_grad_norm")
        require_choices(self)
        self._check_named()
        if self.lr_scaling != "none" and self.base_batch_size is None:
            raise UserError(f"{flag('lr_scaling')} {self.lr_scaling} needs "
                            f"{flag('base_batch_size')} (the batch size {flag('lr')} was "
                            f"tuned for)")

    def _check_named(self) -> None:
        """A torch class named by --optimizer/--scheduler exists and takes its --*-args (one
        line each, before anything is built; amptrain's own names need no torch here);
        the flags that only such a class reads are refused without one."""
        if self.optimizer not in OPTIMIZERS:
            from . import named  # deferred: it imports torch, needed only for a torch name
            cls = named.lookup(self.optimizer, named.optimizer_classes(), "optimizer",
                               OPTIMIZERS)
            named.check_keywords(cls, named.parse_args(self.optimizer_args, "optimizer_args"),
                                 "optimizer_args", ("params", "lr"))
        elif self.optimizer_args:
            raise UserError(f"{flag('optimizer_args')} is for a torch.optim {flag('optimizer')} "
                            f"(e.g. Adadelta); {self.optimizer} takes {flag('lr')}, "
                            f"{flag('momentum')} and {flag('weight_decay')}")
        if self.scheduler not in SCHEDULERS:
            from . import named  # deferred: as above
            cls = named.lookup(self.scheduler, named.scheduler_classes(), "scheduler",
                               SCHEDULERS)
            named.check_keywords(cls, named.parse_args(self.scheduler_args, "scheduler_args"),
                                 "scheduler_args", ("optimizer",))
            if self.warmup_steps:
                raise UserError(f"{flag('warmup_steps')} is the warm-up of amptrain's "
                                f"schedules; {flag('scheduler')} {self.scheduler} has its own "
                                f"arguments ({flag('scheduler_args')})")
        elif self.scheduler_args or self.scheduler_interval:
            given = flag("scheduler_args" if self.scheduler_args else "scheduler_interval")
            raise UserError(f"{given} is for a torch.optim.lr_scheduler {flag('scheduler')} "
                            f"(e.g. StepLR); {self.scheduler} steps every optimizer step")

    def resolved_lr(self) -> float:
        """The learning rate before batch-size scaling: --lr or the optimizer's default."""
        if self.lr is not None:
            return self.lr
        if self.optimizer in DEFAULT_LR:
            return DEFAULT_LR[self.optimizer]
        from .named import default_lr  # deferred: a torch class's own default (torch)
        return default_lr(self.optimizer)


@dataclass
class CheckpointConfig:
    """When checkpoints are written, how many are kept, and what to resume from."""

    save_every: int | None = option(None, "checkpoint every N steps (and at each epoch end)",
                                    kind=int)
    keep_last: int = option(2, "step-N.pt checkpoints kept besides last.pt")
    resume: str | None = option(None, "auto (latest valid checkpoint in --out) or a "
                                "checkpoint path", kind=str)

    def __post_init__(self) -> None:
        require_positive(self, "save_every", optional=True)
        require_non_negative(self, "keep_last")


@dataclass
class LoggingConfig:
    """How often metrics are read and evaluation runs, and how progress is shown."""

    log_every: int = option(10, "read and log metrics every N optimizer steps")
    eval_every: int | None = option(None, "evaluate every N steps (default: each epoch end)",
                                    kind=int)
    no_progress: bool = option(False, "no progress bars (plain log lines instead)")
    logger: str = option("tensorboard", "experiment trackers beside metrics.jsonl, "
                                        "comma-separated: tensorboard, mlflow (DIR/mlruns), "
                                        "csv (DIR/metrics.csv), or none", comma_list=True)
    eval_batches: int | None = option(None, "evaluate on a fixed sample of N validation "
                                            "batches of --batch-size (default: the whole "
                                            "split)", kind=int)
    final_eval_full: bool = option(False, "the final evaluation reads the whole validation "
                                          "split (with --eval-batches)")
    numerics: str = option("auto", "per-layer numerics telemetry (numerics.jsonl): auto "
                                   "(sampled so it costs at most 2 percent of step "
                                   "time), off, or every N steps")

    def __post_init__(self) -> None:
        require_positive(self, "log_every")
        require_positive(self, "eval_every", optional=True)
        parse_logger_names(self.logger)
        numerics_period(self.numerics)
        require_positive(self, "eval_batches", optional=True)
        if self.final_eval_full and self.eval_batches is None:
            raise UserError(f"{flag('final_eval_full')} applies with {flag('eval_batches')} "
                            f"(without it every evaluation reads the whole split)")


@dataclass
class DistributedConfig:
    """How the processes of a run share the work."""

    strategy: str = option("auto", "distribution strategy", choices=STRATEGIES)

    def __post_init__(self) -> None:
        require_choices(self)


@dataclass
class TrainConfig:
    """Everything the :class:`~amptrain.Trainer` loop needs; no model or data names."""

    device: str = option("auto", "cpu, cuda, cuda:N or auto (cuda when available)")
    task: str = option("auto", f"what is learnt: {', '.join(TASK_NAMES)} (docs/tasks.md); "
                               f"auto asks the model, then the data",
                       choices=TASK_CHOICES)
    loss: str | None = option(None, "regression loss on standardised targets: mse (default), "
                                    "l1 or huber", kind=str, choices=LOSSES)
    seed: int = option(0, "seed for weights, data order and dropout")
    deterministic: bool = option(False, "deterministic kernels (bitwise-repeatable on CPU)")
    channels_last: bool = option(False, "channels_last memory format for conv nets")
    compile: bool = option(False, "torch.compile the model")
    out: str | None = option(None, "output directory (default: runs/<time>-<model>-<data>)",
                             kind=str)
    precision: PrecisionConfig = section(PrecisionConfig)
    batching: BatchingConfig = section(BatchingConfig)
    schedule: ScheduleConfig = section(ScheduleConfig)
    checkpointing: CheckpointConfig = section(CheckpointConfig)
    logging: LoggingConfig = section(LoggingConfig)
    distributed: DistributedConfig = section(DistributedConfig)

    @classmethod
    def from_options(cls, **options: Any) -> Any:
        """The config from flat option names, as flags and YAML give them
        (``TrainConfig.from_options(lr=0.1, batch_size=32)``)."""
        return build_config(cls, options)

    def with_options(self, **changes: Any) -> Any:
        """A copy with some options (flat names) changed, validated anew
        (``config.with_options(out="runs/x", lr=0.1)``; see
        :func:`amptrain.common.options.with_options`)."""
        return with_options(self, **changes)

    def with_given_options(self, **options: Any) -> Any:
        """A copy with ``options`` changed as the user's own choices (a library call's
        keywords): they join :attr:`given` (see
        :func:`amptrain.common.options.with_given_options`)."""
        return with_given_options(self, **options)

    @property
    def given(self) -> frozenset[str]:
        """The options the user gave (flat names): carried from the command line (flags
        and --config keys) or the library call (keywords), never guessed from the values
        (see :func:`amptrain.common.options.given_options`)."""
        return given_options(self)
    def __post_init__(self) -> None:
        require_non_negative(self, "seed")
        require_choices(self)
        if self.seed > MAX_SEED:
            raise UserError(f"{flag('seed')} must be an integer from 0 to {MAX_SEED} "
                            f"(got {self.seed})")
        if self.out is not None and not self.out.strip():
            raise UserError(f"{flag('out')} must name a directory (got {self.out!r})")


def _some(values: list[int], limit: int = 8) -> str:
    shown = ", ".join(map(str, values[:limit]))
    return shown + (", ..." if len(values) > limit else "")
