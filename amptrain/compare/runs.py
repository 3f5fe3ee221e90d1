"""The training runs of a study: every precision x seed a normal ``train`` run, each
checked to start from the seed's weights and see the seed's data order."""
from __future__ import annotations

import gc
import hashlib
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import torch

from ..config import RunConfig
from ..common.errors import TrainingHalted
from ..workflows.runner import assemble, run_training
from ..common.forward import fp32_window_loss
from ..trainer import Trainer
from .rows import row_config
from .summary import finite

log = logging.getLogger("amptrain")


# ------------------------------------------------------------ run identity
def digest(values: Any) -> str:
    """sha256 of tensors (names, dtypes and exact bytes) or of JSON-able values."""
    h = hashlib.sha256()
    if isinstance(values, dict) and all(isinstance(v, torch.Tensor) for v in values.values()):
        for name in sorted(values):
            tensor = values[name].detach().cpu().contiguous().reshape(-1)
            h.update(f"{name}:{tensor.dtype}:{tuple(values[name].shape)}".encode())
            h.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    else:
        h.update(json.dumps(values).encode())
    return h.hexdigest()


class RunProbe:
    """Trainer callback proving that a run is comparable with the other precisions.

    At fit start (after the precision set the model up) it records: whether the model
    holds exactly the seed's initial weights as this precision stores them (fp32 modes
    bitwise; half-weight modes the same values rounded), a digest of the fp32 weights,
    a digest of the data order of every epoch, and the loss of the first step's batch
    re-evaluated in fp32 (autocast off, fp32 weights) -- equal across precisions when
    weights and data are.
    """

    def __init__(self, reference_state: dict[str, torch.Tensor]) -> None:
        self.reference = reference_state
        self.facts: dict[str, Any] = {}

    def on_fit_start(self, trainer: Trainer) -> None:
        assert trainer.model is not None  # set up before on_fit_start
        live = trainer.model.state_dict()
        same = set(live) == set(self.reference) and all(
            torch.equal(self.reference[k].to(device=v.device, dtype=v.dtype), v)
            for k, v in live.items())
        fp32 = {k: v.detach().clone()
                for k, v in trainer.precision.fp32_state_dict(trainer.model).items()}
        windows = trainer.train_windows
        plan = windows.sample_order if windows is not None else None
        epochs = trainer.run_length.epochs if trainer.run_length is not None else None
        order = None if plan is None else digest(
            {"global_batch": plan.global_batch,
             "orders": [plan.order(e) for e in range(epochs or 0)]})
        self.facts = {"same_initial_weights": bool(same), "initial_weights_sha256": digest(fp32),
                      "data_order_sha256": order,
                      "first_step_loss_fp32": first_step_loss_fp32(trainer, fp32)}


def first_step_loss_fp32(trainer: Trainer, fp32_state: dict[str, torch.Tensor]) -> float | None:
    """Loss of the first training step's batch under fp32 weights with autocast off.

    Uses copies of the weights and buffers (BatchNorm statistics are not touched) and a
    forked RNG (dropout draws do not shift the run's random stream).
    """
    windows, model, loss_fn = trainer.train_windows, trainer.model, trainer.loss_fn
    assert windows is not None and model is not None and loss_fn is not None, "set up first"
    if trainer.task is not None and not trainer.task.iteration.batches_are_samples:
        return None  # rollout slots (ppo): no loss of a batch without the task's own step
    window = next(iter(windows.epoch(trainer.epoch, trainer.window_in_epoch)), None)
    if window is None:
        return None
    # Tied weights (a language model's embedding and head) appear once: functional_call
    # refuses a value for each name of a tied pair.
    names = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    state = {k: v.to(trainer.device) for k, v in fp32_state.items() if k in names}

    def fp32_model(*args: Any, **kwargs: Any) -> Any:
        return torch.func.functional_call(model, state, args, kwargs)

    return fp32_window_loss(fp32_model, window, loss_fn, trainer.device)


def train_runs(config: RunConfig, precisions: list[str], seeds: list[int], out: Path, *,
               print_every: int | None = None) -> list[dict[str, Any]]:
    """Each precision x seed as a normal training run; returns one record per run.

    ``print_every``: the runs' console lines come every that many steps (their records,
    for the curves, as often as ``config``'s --log-every)."""
    runs: list[dict[str, Any]] = []
    total = len(precisions) * len(seeds)
    for seed in seeds:
        reference_run = assemble(config.with_options(seed=seed))
        # What the Trainer does to a model before its first step: the task learns from the
        # data and takes the model's parts (a GAN maps its generator to the data's range).
        reference_run.task.learn_from(reference_run.data.train)
        reference_run.task.models(reference_run.model)
        reference_model = reference_run.model
        reference = {k: v.detach().clone() for k, v in reference_model.state_dict().items()}
        del reference_model, reference_run
        for precision in precisions:
            run_dir = out / "runs" / run_folder(precision) / f"seed-{seed}"
            run_config = row_config(precision, config, seed=seed, out=str(run_dir),
                                    resume=None)
            log.info("compare: run %d/%d: %s, seed %d -> %s", len(runs) + 1, total, precision,
                     seed, run_dir)
            probe = RunProbe(reference)
            started = time.perf_counter()
            record: dict[str, Any] = {"precision": precision, "seed": seed,
                                      "dir": str(run_dir.relative_to(out))}
            try:
                result = run_training(run_config, callbacks=[probe],
                                      print_every=print_every)
            except TrainingHalted as exc:
                log.info("compare: %s seed %d stopped: %s", precision, seed, exc)
                record.update(val_loss=None, final_loss=None, skipped_steps=None,
                              steps=None, halted=str(exc), train_samples_per_s=None,
                              train_speed_windows=0, data_wait_frac=None)
            else:
                # The task's metrics by name: val_acc, or val_perplexity, val_rmse, ...
                record.update({f"val_{k}": finite(v) for k, v in result.val_metrics.items()})
                record.update(val_loss=finite(result.val_loss),
                              final_loss=finite(result.final_loss),
                              skipped_steps=result.skipped_steps, steps=result.steps, halted=None,
                              train_samples_per_s=result.samples_per_s,
                              train_speed_windows=sum(1 for r in result.history
                                                      if r.get("samples_per_s")),
                              data_wait_frac=result.data_wait_frac)
            record["wall_s"] = round(time.perf_counter() - started, 3)
            record.update(probe.facts)
            runs.append(record)
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    _check_comparable(runs)
    return runs


def run_folder(precision: str) -> str:
    """The folder of a row's runs: its label, with a precision plan's path (``plan:a/b.yaml``)
    made one safe name (``plan-a_b.yaml``)."""
    return re.sub(r"[^A-Za-z0-9._+-]", "_", precision.replace(":", "-", 1))


def _check_comparable(runs: list[dict[str, Any]]) -> None:
    """Say loudly when runs of one seed did not start alike (the A/B would be unfair)."""
    for seed in sorted({r["seed"] for r in runs}):
        group = [r for r in runs if r["seed"] == seed and r.get("data_order_sha256")]
        if len({r["data_order_sha256"] for r in group}) > 1:
            log.warning("compare: seed %d: the precisions saw different data orders", seed)
        for r in runs:
            if r["seed"] == seed and r.get("same_initial_weights") is False:
                log.warning("compare: seed %d: %s did not start from the seed's initial weights "
                            "(is the model factory seeded?)", seed, r["precision"])
