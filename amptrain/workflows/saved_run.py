"""A run saved by ``amptrain train``, read back: its checkpoint file (a file or a run
directory), its state and run info, the task and the model it trained. ``eval``,
``generate`` and ``export`` start here, and none of them builds a Trainer: the one loader,
:func:`open_run` then :meth:`SavedRun.load_model`, gives the model with its weights, set up
for a precision on a device, with the task it trained (the runner only writes runs).

The safety checks of a checkpoint read back live here too: a special file refused by
name, a file not written by ``amptrain train``, a damaged ``run`` section, model facts
out of bounds, non-finite weights, weights that do not fit the rebuilt model."""
from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from .. import checkpoint
from ..checkpoint.sections import check_finite_weights
from ..config import TrainConfig
from ..distributed import Strategy, build_strategy
from ..common.errors import UserError
from ..common.pathkind import not_regular_reason
from ..models import ModelInputs, build_model
from ..precision import Precision
from ..tasks import Task, build_task, saved_task_name
from ..trainer.assembly import placed


@contextlib.contextmanager
def _log_level(level: int) -> Iterator[None]:
    logger = logging.getLogger("amptrain")
    saved = logger.level
    logger.setLevel(max(level, saved))
    try:
        yield
    finally:
        logger.setLevel(saved)


def checkpoint_file(path: str | Path) -> Path:
    """``--checkpoint``: a file, or a run directory (its ``checkpoints/last.pt``)."""
    path = Path(path)
    special = not_regular_reason(path)
    if special:  # /dev/zero, a FIFO: named, not "no such file" (and never read)
        raise UserError(f"--checkpoint {special}")
    if not path.is_dir():
        return path
    for candidate in (path / checkpoint.CHECKPOINT_DIR / checkpoint.LAST, path / checkpoint.LAST):
        if candidate.is_file():
            logging.getLogger("amptrain").info("--checkpoint %s is a directory: using %s",
                                               path, candidate)
            return candidate
    raise UserError(f"--checkpoint {path} is a directory with no checkpoint in it; pass a "
                    f"checkpoint file, e.g. RUN_DIR/{checkpoint.CHECKPOINT_DIR}/{checkpoint.LAST}")


def load_run(checkpoint_path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(checkpoint state, its run info) of a checkpoint written by a command-line run."""
    state = checkpoint.load(checkpoint_path)
    run = state.get("run") or {}
    if not isinstance(run, dict) or "model" not in run or "inputs" not in run:
        raise UserError(f"checkpoint {checkpoint_path} was not written by `amptrain train` "
                        f"(no model name inside); use it with the library API")
    try:
        saved_inputs(run)
    except (TypeError, ValueError, KeyError):
        raise UserError(f"checkpoint {checkpoint_path}: its 'run' section does not describe "
                        f"the model's inputs (a damaged or hand-edited file)") from None
    # NaN weights evaluate to NaN and generate NUL bytes: garbage must not exit 0.
    check_finite_weights(state["model"], checkpoint_path)
    return state, run


#: Bounds on a saved run's model facts: beyond them a model (or generate's buffers) would
#: ask for terabytes; no real run has them.
MAX_CLASSES_OR_VOCAB = 1 << 24
MAX_INPUT_ELEMENTS = 1 << 28


def saved_inputs(run: dict[str, Any]) -> ModelInputs:
    """The model facts a run was trained with (a ValueError when out of bounds)."""
    inputs = run["inputs"]
    shape = tuple(inputs["input_shape"])
    counts = [inputs.get(k) for k in ("num_classes", "vocab_size")]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape) \
            or math.prod(shape) > MAX_INPUT_ELEMENTS \
            or any(v is not None and (not isinstance(v, int) or isinstance(v, bool)
                                      or not 0 <= v <= MAX_CLASSES_OR_VOCAB) for v in counts):
        raise ValueError(f"input shape {shape[:8]}, classes/vocabulary {counts} out of bounds")
    return ModelInputs(**{**inputs, "input_shape": shape})


def saved_task(state: dict[str, Any], class_names: list[str] | None) -> Task:
    """The task a checkpoint was trained on, with what it learnt from the data."""
    saved = {k: v for k, v in (state.get("task") or {}).items() if k != "name"}
    return build_task(saved_task_name(state), class_names=class_names, **saved)


def build_saved_model(run: dict[str, Any]) -> nn.Module:
    """A run's model, freshly built (its weights come from the checkpoint afterwards)."""
    # What the builder says about initialisation (hf:PATH's "head newly initialised")
    # does not apply to weights loaded next, so only warnings get through.
    with _log_level(logging.WARNING):
        return build_model(run["model"], saved_inputs(run))


@dataclass
class LoadedModel:
    """A saved run's model ready to run: on its device, set up for a precision (half
    weights cast, fp32 islands, low-bit layers), the checkpoint's weights loaded, in eval
    mode; with the precision (``autocast()`` for its forwards), the strategy and the
    config that describe where and how it runs."""

    model: nn.Module
    precision: Precision
    strategy: Strategy
    config: TrainConfig

    @property
    def device(self) -> torch.device:
        """Where the model runs."""
        return self.strategy.device


@dataclass
class SavedRun:
    """A run read back from its checkpoint (:func:`open_run`)."""

    path: str                  # the checkpoint file
    state: dict[str, Any]      # the checkpoint's content
    run: dict[str, Any]        # its run info: model spec, data spec, inputs, task, ...

    @property
    def task_name(self) -> str:
        """The task the run trained."""
        return saved_task_name(self.state)

    @property
    def fitted(self) -> dict[str, Any]:
        """The training data's preprocessing (normalisation, vocabulary, tokenizer)."""
        return self.run.get("data_fitted") or {}

    def task(self, class_names: list[str] | None = None) -> Task:
        """The task the run trained, with what it learnt from the data."""
        return saved_task(self.state, class_names)

    def build_model(self) -> nn.Module:
        """The run's model, freshly built (no weights loaded)."""
        return build_saved_model(self.run)

    def load_model(self, *, precision: str = "auto", device: str = "auto",
                   **options: Any) -> LoadedModel:
        """The run's model with its weights, set up for ``precision`` on ``device``
        (``options``: further run options by their flat names, ``batch_size``)."""
        config = TrainConfig().with_options(precision=precision, device=device, **options)
        strategy = build_strategy(config.distributed.strategy, config.device)
        mode = Precision.from_config(config.precision, device=strategy.device)
        model, _ = mode.setup(placed(self.build_model(), strategy.device, config), None)
        model.eval()
        checkpoint.load_weights(model, self.state["model"], strategy, mode)
        return LoadedModel(model, mode, strategy, config)


def open_run(checkpoint_path: str | Path) -> SavedRun:
    """The run in ``checkpoint_path`` (a checkpoint file or a run directory), checked."""
    path = str(checkpoint_file(checkpoint_path))
    state, run = load_run(path)
    return SavedRun(path, state, run)


__all__ = ["LoadedModel", "SavedRun", "build_saved_model", "checkpoint_file", "load_run",
           "open_run", "saved_inputs", "saved_task", "saved_task_name"]
