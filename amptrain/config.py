"""Validated configuration dataclasses, shared by the library, the CLI and YAML files.

Each field carries its own help text and choices in ``metadata``; the command line is
generated from these fields, so a new option is added in exactly one place. Every
validation error is a :class:`UserError` that names the flag to change.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from .errors import UserError, flag


def option(default: Any = None, help: str = "", *, choices: Iterable[str] | None = None,
           kind: type | None = None, group: str = "training") -> Any:
    """A dataclass field with the metadata the CLI needs (help text, choices, value type)."""
    metadata = {"help": help, "choices": tuple(choices) if choices else None, "kind": kind,
                "group": group}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def cli_flag(name: str) -> str:
    """The command-line spelling of a config field: ``micro_batch_size`` -> ``--micro-batch-size``.

    For building command lines; error messages use :func:`~amptrain.errors.flag`, which
    names the keyword instead when the caller is the library.
    """
    return "--" + name.replace("_", "-")


OPTIMIZERS = ("sgd", "adamw")
SCHEDULERS = ("none", "cosine", "onecycle")
LR_SCALING = ("none", "linear", "sqrt")
STRATEGIES = ("auto", "ddp", "fsdp", "dp")
DEFAULT_LR = {"adamw": 1e-3, "sgd": 0.05}
MAX_SEED = 2 ** 32 - 1


@dataclass
class TrainConfig:
    """Everything the :class:`~amptrain.Trainer` loop needs; no model or data names."""

    precision: str = option("auto", "precision mode (see `amptrain env`); auto picks the best "
                                    "the hardware supports", group="precision")
    device: str = option("auto", "cpu, cuda, cuda:N or auto (cuda when available)")
    epochs: int = option(3, "passes over the training data")
    max_steps: int | None = option(None, "stop after this many optimizer steps (overrides "
                                         "--epochs when reached first)", kind=int)
    batch_size: int = option(64, "effective global batch per optimizer step "
                                 "(micro-batch x accumulate x processes)")
    micro_batch_size: int | str | None = option(
        None, "samples per forward/backward on each device (an integer, or auto: the largest "
              "that fits, found by probing real steps)", kind=str)
    memory_budget_gb: float | None = option(
        None, "memory a step may use, for --micro-batch-size auto (default: the GPU's own "
              "limit; on CPU the RAM available now; CPU counts peak RSS)", kind=float)
    accumulate: int | None = option(None, "micro-batches accumulated per optimizer step", kind=int)
    lr: float | None = option(None, "learning rate (default: 1e-3 for adamw, 0.05 for sgd)",
                              kind=float)
    optimizer: str = option("adamw", "optimizer", choices=OPTIMIZERS)
    momentum: float = option(0.9, "SGD momentum")
    weight_decay: float = option(0.01, "weight decay")
    scheduler: str = option("cosine", "learning-rate schedule over the run", choices=SCHEDULERS)
    warmup_steps: int = option(0, "linear warm-up steps before the schedule")
    lr_scaling: str = option("none", "scale --lr with --batch-size / --base-batch-size",
                             choices=LR_SCALING)
    base_batch_size: int | None = option(None, "the batch size --lr was tuned for", kind=int)
    clip_grad_norm: float | None = option(None, "clip the (unscaled) gradient norm to this value",
                                          kind=float)
    channels_last: bool = option(False, "channels_last memory format for conv nets")
    compile: bool = option(False, "torch.compile the model")
    seed: int = option(0, "seed for weights, data order and dropout")
    deterministic: bool = option(False, "deterministic kernels (bitwise-repeatable on CPU)")
    log_every: int = option(10, "read and log metrics every N optimizer steps")
    eval_every: int | None = option(None, "evaluate every N steps (default: each epoch end)",
                                    kind=int)
    save_every: int | None = option(None, "checkpoint every N steps (and at each epoch end)",
                                    kind=int)
    keep_last: int = option(2, "step-N.pt checkpoints kept besides last.pt")
    resume: str | None = option(None, "auto (latest valid checkpoint in --out) or a checkpoint path",
                                kind=str)
    num_workers: int = option(0, "DataLoader worker processes (in-memory data needs none)")
    strategy: str = option("auto", "distribution strategy", choices=STRATEGIES)
    no_progress: bool = option(False, "no progress bars (plain log lines instead)")
    init_scale: float = option(65536.0, "initial fp16 loss scale", group="precision")
    growth_factor: float = option(2.0, "loss-scale growth factor", group="precision")
    backoff_factor: float = option(0.5, "loss-scale backoff factor on overflow", group="precision")
    growth_interval: int = option(2000, "clean steps before the loss scale grows", group="precision")
    min_scale: float = option(1.0, "loss-scale floor: reaching it stops training",
                              group="precision")
    keep_fp32: list[str] = option([], "glob of module names run in fp32 inside autocast "
                                      "(repeatable, e.g. head or '*.norm*')", group="precision")
    max_bad_steps: int = option(10, "consecutive non-finite steps (no loss scaler) before "
                                    "training stops", group="precision")
    out: str | None = option(None, "output directory (default: runs/<time>-<model>-<data>)",
                             kind=str)

    def validate(self) -> None:
        """Raise :class:`UserError` naming the flag for any value that cannot work."""
        _positive(self, "epochs", "batch_size", "log_every", "growth_interval", "max_bad_steps")
        _positive(self, "max_steps", "accumulate", "eval_every", "save_every", "base_batch_size",
                  optional=True)
        _non_negative(self, "warmup_steps", "keep_last", "num_workers", "weight_decay",
                      "momentum", "seed")
        if self.micro_batch_size is not None and self.micro_batch_size != "auto":
            try:
                self.micro_batch_size = int(self.micro_batch_size)
            except (TypeError, ValueError):
                raise UserError(f"{flag('micro_batch_size')} must be a positive integer or "
                                f"'auto' (got {self.micro_batch_size!r})") from None
            _positive(self, "micro_batch_size")
        if self.micro_batch_size == "auto" and self.accumulate is not None:
            raise UserError(f"{flag('micro_batch_size')} auto derives {flag('accumulate')} "
                            f"from what fits; drop {flag('accumulate')} (or give an integer "
                            f"{flag('micro_batch_size')})")
        if self.memory_budget_gb is not None and self.micro_batch_size != "auto":
            raise UserError(f"{flag('memory_budget_gb')} only applies with "
                            f"{flag('micro_batch_size')} auto")
        for name in ("lr", "clip_grad_norm", "init_scale", "min_scale", "memory_budget_gb"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise UserError(f"{flag(name)} must be a positive number (got {value})")
        if self.growth_factor <= 1.0:
            raise UserError(f"{flag('growth_factor')} must be > 1 (got {self.growth_factor})")
        if not 0.0 < self.backoff_factor < 1.0:
            raise UserError(f"{flag('backoff_factor')} must be between 0 and 1 "
                            f"(got {self.backoff_factor})")
        if self.min_scale > self.init_scale:
            raise UserError(f"{flag('min_scale')} ({self.min_scale}) must not exceed "
                            f"{flag('init_scale')} ({self.init_scale})")
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                raise UserError(f"{flag(f.name)} must be one of {', '.join(choices)} "
                                f"(got {getattr(self, f.name)!r})")
        if self.lr_scaling != "none" and self.base_batch_size is None:
            raise UserError(f"{flag('lr_scaling')} {self.lr_scaling} needs "
                            f"{flag('base_batch_size')} (the batch size {flag('lr')} was "
                            f"tuned for)")
        if isinstance(self.keep_fp32, str):
            self.keep_fp32 = [self.keep_fp32]
        if not 0 <= self.seed <= MAX_SEED:
            # Lightning's bound: numpy seeds take 32 bits, and a seed is a name, not a size.
            raise UserError(f"{flag('seed')} must be an integer from 0 to {MAX_SEED} "
                            f"(got {self.seed})")
        if self.out is not None and not self.out.strip():
            raise UserError(f"{flag('out')} must name a directory (got {self.out!r})")

    def resolved_lr(self) -> float:
        """The learning rate before batch-size scaling: --lr or the optimizer's default."""
        return self.lr if self.lr is not None else DEFAULT_LR[self.optimizer]

    def batching(self, world_size: int = 1) -> tuple[int, int]:
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
            return micro, self.accumulate
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
            return micro, per_device // micro
        accumulate = self.accumulate or 1
        if per_device % accumulate:
            valid = [d for d in range(1, per_device + 1) if per_device % d == 0]
            raise UserError(f"{acc} {accumulate} does not divide the per-device batch "
                            f"{per_device}; valid values: {_some(valid)}")
        return per_device // accumulate, accumulate


@dataclass
class RunConfig(TrainConfig):
    """A command-line run: the training options plus which model and data to build."""

    model: str = option("cnn", "model name (mlp, cnn, resnet18, resnet50, lstm, transformer, "
                               "module:pkg.mod.factory, timm:NAME, hf:PATH)", group="run")
    data: str = option("digits", "dataset (digits, synthetic-image, synthetic-seq, idx:DIR, "
                                 "cifar10:DIR, imagefolder:DIR, npz:FILE, csv-text:FILE)",
                       group="run")
    val_fraction: float = option(0.2, "validation share when the data has no split", group="run")

    def validate(self) -> None:
        super().validate()
        if not 0.0 < self.val_fraction < 1.0:
            raise UserError(f"{flag('val_fraction')} must be between 0 and 1 "
                            f"(got {self.val_fraction})")


def config_fields(cls: type) -> dict[str, dataclasses.Field]:
    """The dataclass fields of a config class, by name."""
    return {f.name: f for f in dataclasses.fields(cls)}


#: Keys that ``Trainer.resolved_config()`` writes to config.yaml but that are not options.
RESOLVED_ONLY_KEYS = frozenset({"world_size", "lr_schedule", "micro_batch_search", "oom_events"})


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a --config YAML file into a dict with underscore keys."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"--config {path} is a directory; give the YAML file")
    if not path.is_file():
        raise UserError(f"--config {path}: no such file")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"--config {path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise UserError(f"--config {path}: cannot read it ({exc.strerror})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UserError(f"--config {path}: not valid YAML{where}") from None
    if raw is None:
        raise UserError(f"--config {path}: the file is empty; write one option: value per line")
    if not isinstance(raw, dict):
        raise UserError(f"--config {path}: expected a mapping of option: value "
                        f"(got a YAML {type(raw).__name__})")
    values = {str(k).replace("-", "_"): v for k, v in raw.items()}
    # A run's resolved config.yaml also records facts that are not options; reading it
    # back as --config must work, so those are dropped here.
    return {k: v for k, v in values.items() if k not in RESOLVED_ONLY_KEYS}


def coerce(field_: dataclasses.Field, value: Any) -> Any:
    """``value`` as option ``field_`` takes it, converted as its flag would convert it.

    YAML 1.1 reads ``1e-3`` as a string and a library caller may pass ``"0.1"``: a
    number written as text is taken; a value of the wrong kind is a :class:`UserError`
    naming the option.
    """
    name = field_.name
    default = field_.default if field_.default is not dataclasses.MISSING else None
    if value is None:
        if default is None:
            return None
        raise UserError(f"{flag(name)} needs a value (default: {default})")
    if field_.default is dataclasses.MISSING:  # list options (--keep-fp32 PATTERN ...)
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
            raise UserError(f"{flag(name)} takes a pattern or a list of patterns "
                            f"(got {value!r})")
        return list(items)
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise UserError(f"{flag(name)} is true or false (got {value!r})")
    kind = field_.metadata.get("kind") or type(default)
    if name == "micro_batch_size" and isinstance(value, int) and not isinstance(value, bool):
        return value  # an integer, or the word auto
    if kind is str:
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if not isinstance(value, str):
            raise UserError(f"{flag(name)} must be a string (got {type(value).__name__} "
                            f"{value!r})")
        return value
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise UserError(f"{flag(name)} must be {_A_KIND[kind]} (got {value!r})")
        try:
            number = kind(value.strip()) if isinstance(value, str) else value
        except ValueError:
            raise UserError(f"{flag(name)} must be {_A_KIND[kind]} (got {value!r})") from None
        if kind is int and isinstance(number, float):
            if not number.is_integer():
                raise UserError(f"{flag(name)} must be {_A_KIND[kind]} (got {value!r})")
            number = int(number)
        return kind(number) if kind is float else number
    return value


_A_KIND = {int: "an integer", float: "a number"}


def build_config(cls: type, values: dict[str, Any], source: str = "option") -> Any:
    """Instantiate and validate ``cls`` from a dict, rejecting unknown keys by name.

    Every value is first converted as its flag would convert it (:func:`coerce`).
    """
    known = config_fields(cls)
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise UserError(_unknown_message(cls, unknown[0], source, known))
    config = cls(**{name: coerce(known[name], value) for name, value in values.items()})
    config.validate()
    return config


def _unknown_message(cls: type, name: str, source: str, known: dict[str, Any]) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(known), n=1)
    if flag(name).startswith("--"):
        hint = f"; did you mean {flag(close[0])}?" if close else ""
        return (f"unknown {source} {flag(name)}{hint} "
                f"(see `amptrain {'train' if cls is RunConfig else ''} --help`)")
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"unknown keyword {name!r} for Trainer ({cls.__name__}){hint}"


def to_dict(config: Any) -> dict[str, Any]:
    """A plain dict of a config dataclass (for config.yaml and checkpoints)."""
    return dataclasses.asdict(config)


def write_yaml(data: dict[str, Any], path: str | Path) -> None:
    """Write a resolved config as YAML, keys in field order."""
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))


def _positive(config: Any, *names: str, optional: bool = False) -> None:
    for name in names:
        value = getattr(config, name)
        if value is None and optional:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UserError(f"{flag(name)} must be an integer >= 1 (got {value!r})")


def _non_negative(config: Any, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise UserError(f"{flag(name)} must be >= 0 (got {value!r})")


def _some(values: list[int], limit: int = 8) -> str:
    shown = ", ".join(map(str, values[:limit]))
    return shown + (", ..." if len(values) > limit else "")
