"""Command-level orchestration: build data and model from names, then run the Trainer.

``train``, ``eval`` and later ``compare``/``diagnose`` all go through these functions,
so a run started from the command line and one started by ``compare`` are the same.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

from torch import nn

from . import checkpoint, outdir
from .config import RunConfig, replace_options
from .data import DataBundle, DataOptions, build_data
from .distributed import build_strategy
from .errors import UserError
from .launch import resume_after_restart
from .models import ModelInputs, build_model, text_encoder_for
from .reproducibility import seed_everything
from .tasks import EvalResult
from .trainer import FitResult, Trainer


def model_inputs(data: DataBundle) -> ModelInputs:
    """The data facts a model factory needs."""
    return ModelInputs(num_classes=data.num_classes, input_shape=tuple(data.input_shape),
                       kind=data.kind, vocab_size=data.vocab_size)


def run_info(config: RunConfig, data: DataBundle) -> dict[str, Any]:
    """What a checkpoint must remember to rebuild the model without the training flags."""
    return {"model": config.model, "data": config.data, "class_names": data.class_names,
            "inputs": asdict(model_inputs(data)), "data_fitted": data.fitted}


def prepare_run(config: RunConfig) -> tuple[DataBundle, nn.Module]:
    """Build the data and a freshly initialised model (seeded: same seed, same weights)."""
    # A model that brings its own tokenizer (hf:PATH) tokenises the text data.
    data = build_data(config.data, DataOptions(seed=config.seed, val_fraction=config.val_fraction,
                                               text_encoder=text_encoder_for(config.model)))
    seed_everything(config.seed)
    model = build_model(config.model, model_inputs(data))
    return data, model


def run_training(config: RunConfig, **trainer_options: Any) -> FitResult:
    """Train as ``amptrain train`` does; returns the Trainer's result."""
    config = resume_after_restart(config)
    strategy = trainer_options.pop("strategy", None)
    owned = strategy is None
    if owned:
        strategy = build_strategy(config.distributed.strategy, config.device)
    try:
        # Under plain torchrun each process picked its own default --out: use rank 0's.
        config = replace_options(config, out=strategy.broadcast_object(config.out))
        if config.out is not None:  # without one nothing is written (as in the Trainer)
            outdir.check_on_main(config.out, resume=bool(config.checkpointing.resume),
                                 is_main=strategy.is_main, broadcast=strategy.broadcast_object)
        # The Trainer first: a precision the hardware lacks (fp8 on a CPU) is refused before
        # the data and the model are loaded.
        trainer = Trainer(config, strategy=strategy, **trainer_options)
        data, model = prepare_run(config)
        trainer.run_info = run_info(config, data)
        result = trainer.fit(model, data.train, data.val, class_names=data.class_names)
        # Every rank finishes (rank 0 writes the last checkpoint and reports) before any
        # tears the process group down: a rank leaving early made gloo abort the other.
        strategy.barrier()
        return result
    finally:
        if owned:
            strategy.teardown()


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
    if not path.is_dir():
        return path
    for candidate in (path / checkpoint.CHECKPOINT_DIR / checkpoint.LAST, path / checkpoint.LAST):
        if candidate.is_file():
            logging.getLogger("amptrain").info("--checkpoint %s is a directory: evaluating %s",
                                               path, candidate)
            return candidate
    raise UserError(f"--checkpoint {path} is a directory with no checkpoint in it; pass a "
                    f"checkpoint file, e.g. RUN_DIR/{checkpoint.CHECKPOINT_DIR}/{checkpoint.LAST}")


def run_evaluation(*, checkpoint_path: str, data: str | None, precision: str, out: str,
                   batch_size: int = 256, device: str = "auto",
                   progress: bool = True) -> tuple[EvalResult, str]:
    """Evaluate a checkpoint as ``amptrain eval`` does; returns (result, trained precision)."""
    checkpoint_path = str(checkpoint_file(checkpoint_path))
    state = checkpoint.load(checkpoint_path)
    run = state.get("run") or {}
    if "model" not in run or "inputs" not in run:
        raise UserError(f"checkpoint {checkpoint_path} was not written by `amptrain train` "
                        f"(no model name inside); evaluate it with the library API")
    data_spec: str = data or run["data"]  # "data" is written with "model" (run_info)
    # The training split's preprocessing (normalisation, vocabulary, class order) is
    # reused, so other data is fed to the model exactly as the training data was.
    bundle = build_data(data_spec,
                        DataOptions(val_fraction=state["config"].get("val_fraction", 0.2),
                                    fitted=run.get("data_fitted"),
                                    text_encoder=text_encoder_for(run["model"])))
    inputs = ModelInputs(**{**run["inputs"], "input_shape": tuple(run["inputs"]["input_shape"])})
    if bundle.num_classes != inputs.num_classes or tuple(bundle.input_shape) != inputs.input_shape:
        raise UserError(f"--data {data_spec} has {bundle.num_classes} classes and inputs "
                        f"{tuple(bundle.input_shape)}, but the checkpoint's model expects "
                        f"{inputs.num_classes} classes and {inputs.input_shape}")
    # The weights come from the checkpoint: what the builder says about initialisation
    # (hf:PATH's "head newly initialised") does not apply, so only warnings get through.
    with _log_level(logging.WARNING):
        model = build_model(run["model"], inputs)
    trainer = Trainer(precision=precision, device=device, batch_size=batch_size, out=out,
                      no_progress=not progress)
    trainer.prepare(model, class_names=run.get("class_names") or bundle.class_names)
    trainer.load_weights(state["model"])
    result = trainer.evaluate(trainer.model, bundle.val, write_dir=Path(out) / "eval")
    return result, state.get("precision_name", "unknown")
