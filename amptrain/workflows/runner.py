"""Command-level orchestration: build data and model from names, then run the Trainer.

``train``, ``eval`` and later ``compare``/``diagnose`` all go through these functions,
so a run started from the command line and one started by ``compare`` are the same.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ..common import outdir
from ..loggers import train_outputs
from ..config import RunConfig
from ..data import DataBundle, DataOptions, GymOptions, build_data
from ..distributed import build_strategy
from ..common.errors import UserError
from .launch import resume_after_restart
from .export import export_trained
from ..models import ModelInputs, build_model, task_of_model, text_encoder_for
from ..common.reproducibility import MODEL_INIT, seed_phase
from ..trainer.logs import RunLogger
from .saved_run import open_run, saved_inputs
from ..precision import ResolvedPrecision, resolve_precision
from ..tasks import EvalResult, Task, data_task, decide_task as choose_task, output_noun
from ..trainer import FitResult, Trainer
from ..trainer.evaluation import Evaluator
from ..data.gym_options import check_eval_episodes


def model_inputs(data: DataBundle) -> ModelInputs:
    """The data facts a model factory needs."""
    return ModelInputs(num_classes=data.num_classes, input_shape=tuple(data.input_shape),
                       kind=data.kind, vocab_size=data.vocab_size)


def run_info(config: RunConfig, data: DataBundle, task: Task | None = None) -> dict[str, Any]:
    """What a checkpoint must remember to rebuild the model without the training flags
    (``task``: the run's decided task; without it, the task the data says it is)."""
    return {"model": config.model, "data": config.data, "class_names": data.class_names,
            "inputs": asdict(model_inputs(data)), "data_fitted": data.fitted,
            "task": task.name if task is not None else data_task(data.task)}


def text_encoder(model: str, tokenizer: str | None) -> Any:
    """The tokenizer of text data: ``--tokenizer hf:DIR``, else the one a model brings
    (``hf:PATH``), else None (the data's built-in one; ``--tokenizer byte`` asks for it)."""
    if tokenizer == "byte":
        return None
    return text_encoder_for(tokenizer, option="tokenizer") if tokenizer \
        else text_encoder_for(model)


# ------------------------------------------------------------- one downward pass
# A run is assembled in this order, each decision made once: the precision is checked
# (before anything is loaded), then data -> task -> model -> Trainer.

def check_precision(config: RunConfig, device: Any) -> ResolvedPrecision:
    """The mode ``--precision`` means on ``device`` (auto resolved), refusing one the
    device cannot run before the data and the model are loaded: the run's one decision,
    handed to the Trainer."""
    return resolve_precision(config.precision.name, device)


def build_run_data(config: RunConfig) -> DataBundle:
    """The data ``--data`` names, prepared with the run's options (a model that brings its
    own tokenizer, ``hf:PATH``, tokenises text data)."""
    return build_data(config.data, DataOptions(
        seed=config.seed, val_fraction=config.val_fraction,
        text_encoder=text_encoder(config.model, config.text.tokenizer), task=config.task,
        text=config.text, images=config.images, gym=config.gym))


def rl_facts(config: RunConfig) -> dict[str, Any]:
    """The ppo task's options given (RunConfig refuses them for data other than gym:)."""
    return config.ppo.given()


def decide_task(config: RunConfig, data: DataBundle) -> Task:
    """The run's task, decided once (:func:`amptrain.tasks.decide_task`): ``--task``, which
    must fit the data, or (auto) the model's task, else what the data is."""
    return choose_task(config.task, data_hint=data.task,
                       model_task=task_of_model(config.model) if config.task == "auto" else None,
                       train_data=data.train, loss=config.loss, model=config.model,
                       data=config.data, class_names=data.class_names or None,
                       **rl_facts(config))


def build_run_model(config: RunConfig, data: DataBundle) -> nn.Module:
    """A freshly initialised model for ``data`` (seeded: same seed, same weights)."""
    seed_phase(MODEL_INIT, config.seed)
    return build_model(config.model, model_inputs(data))


@dataclass
class Assembled:
    """What a run trains, built in order: its data, its task, its model."""

    data: DataBundle
    task: Task
    model: nn.Module
    #: The run's config with what the task decides for it (PPO's length and minibatch).
    config: RunConfig


def assemble(config: RunConfig) -> Assembled:
    """Data, then the task it fits, then the model (the runner's, compare's and diagnose's
    runs are the same)."""
    data = build_run_data(config)
    task = decide_task(config, data)
    decided = task.iteration.run_options(config, data)
    if decided:
        config = config.with_options(**decided)
    return Assembled(data, task, build_run_model(config, data), config)


def data_and_model(config: RunConfig) -> tuple[DataBundle, nn.Module]:
    """Build the data and a freshly initialised model (seeded: same seed, same weights)."""
    run = assemble(config)
    return run.data, run.model


def run_training(config: RunConfig, **trainer_options: Any) -> FitResult:
    """Train as ``amptrain train`` does; returns the Trainer's result."""
    config = resume_after_restart(config)
    strategy = trainer_options.pop("strategy", None)
    owned = strategy is None
    if owned:
        strategy = build_strategy(config.distributed.strategy, config.device)
    try:
        # A precision the hardware lacks (fp8 on a CPU) is refused before anything is loaded.
        precision = check_precision(config, strategy.device)
        # The output directory: the command's --out (or its default), rank 0's under plain
        # torchrun, where each process picked its own default.
        config = config.with_options(out=strategy.broadcast_object(config.out))
        if config.out is not None:  # without one nothing is written (as in the Trainer)
            outdir.check_on_main(config.out, resume=bool(config.checkpointing.resume),
                                 is_main=strategy.is_main, broadcast=strategy.broadcast_object,
                                 outputs=train_outputs(config.logging.logger),
                                 remember=True)  # the Trainer's check: this verdict
        run = assemble(config)
        config = run.config
        trainer = Trainer(config, strategy=strategy,
                          run_info=run_info(config, run.data, run.task),
                          precision_mode=precision, **trainer_options)
        trainer.setup(run.model, run.data.train, run.data.val,
                      class_names=run.data.class_names or None, task=run.task)
        result = trainer.run()  # fit() is these two calls
        if config.out is not None:
            # DIR/model.safetensors for every model, and a model from another framework
            # written back in its own format (its export hook).
            state = strategy.model_state_dict(run.model, trainer.precision)  # on every rank
            if strategy.is_main:
                export_trained(Path(config.out), run.model, state, trainer.run_info,
                               step=trainer.step, replace=bool(config.checkpointing.resume))
            del state
        # Every rank finishes (rank 0 writes the last checkpoint and reports) before any
        # tears the process group down: a rank leaving early made gloo abort the other.
        strategy.barrier()
        # The teardown below frees the Trainer (and the DDP wrapper it holds) before it
        # destroys the process group.
        del trainer, run
        return result
    finally:
        if config.out is not None:
            outdir.forget(config.out)  # a run that failed before its Trainer checked
        if owned:
            strategy.teardown()


def run_evaluation(*, checkpoint_path: str, data: str | None, precision: str, out: str,
                   batch_size: int = 256, device: str = "auto",
                   progress: bool = True, episodes: int | None = None
                   ) -> tuple[EvalResult, str]:
    """Evaluate a checkpoint as ``amptrain eval`` does; returns (result, trained precision).
    No Trainer: the saved run's model (:mod:`.saved_run`) and one evaluation pass.
    ``episodes``: how many evaluation episodes a ``gym:`` run's policy plays;
    ``progress`` is kept for callers; an evaluation outside training shows no bar."""
    if episodes is not None and episodes < 1:
        raise UserError(f"--episodes must be >= 1 (got {episodes})")

    check_eval_episodes(episodes, "--episodes")
    # Before anything is read: one line, no report lost; locked: one eval per --out.
    outdir.claim_locked(out, outdir.EVAL_OUTPUTS)
    saved = open_run(checkpoint_path)
    run = saved.run
    data_spec: str = data or run["data"]  # "data" is written with "model" (run_info)
    fitted = saved.fitted
    # The training split's preprocessing (normalisation, vocabulary, class order,
    # tokenizer, block size) is reused, so other data is fed to the model exactly as the
    # training data was.
    bundle = build_data(data_spec,
                        DataOptions(val_fraction=saved.state["config"].get("val_fraction", 0.2),
                                    fitted=fitted, task=saved.task_name,
                                    gym=GymOptions(eval_episodes=episodes),
                                    text_encoder=text_encoder(run["model"],
                                                              fitted.get("tokenizer"))))
    if episodes is not None and getattr(bundle.val, "env", None) is None:
        raise UserError(f"--episodes applies to checkpoints of gym: runs (environments); "
                        f"--data {data_spec} holds samples")
    inputs = saved_inputs(run)
    if bundle.num_classes != inputs.num_classes or tuple(bundle.input_shape) != inputs.input_shape:
        outputs = output_noun(saved.task_name)
        raise UserError(f"--data {data_spec} has {bundle.num_classes} {outputs} and inputs "
                        f"{tuple(bundle.input_shape)}, but the checkpoint's model expects "
                        f"{inputs.num_classes} {outputs} and {inputs.input_shape}")
    if bundle.val is None:
        raise UserError(f"--data {data_spec} has no validation split to evaluate")
    loaded = saved.load_model(precision=precision, device=device, batch_size=batch_size)
    task = saved.task(run.get("class_names") or bundle.class_names or None)
    # Facts of this data (an LM's bytes per token); learnt ones are kept. A task that
    # measures against the training split (a GAN's feature network) is fitted on that
    # split of the data, as in training.
    task.learn_from(bundle.train if task.offers.eval_learn_split == "train" else bundle.val)
    evaluator = Evaluator(loaded.config, loaded.strategy, loaded.precision, task, task.loss)
    result = evaluator.evaluate(loaded.model, bundle.val, logger=RunLogger(None, enabled=False),
                                write_dir=Path(out) / "eval")
    return result, saved.state.get("precision_name", "unknown")
