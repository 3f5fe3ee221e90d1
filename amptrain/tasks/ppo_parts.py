"""The ppo task's parts (:mod:`.ppo`): its own loop and the run options it sets, the keys it
logs, diagnose's value path, its checks and its report, each reading the task's state."""
from __future__ import annotations

import itertools
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..common.errors import UserError, flag
from ..common.options import given_options
from ..data.gym import process_world
from . import ppo_eval
from .base import DataChecks, Diagnosis, EvalResult, Iteration, LogKeys, Reports

if TYPE_CHECKING:
    from .ppo import PpoTask
    from .step import TrainLoop

#: The model a ppo run trains when ``--model`` is left at its default (the image default,
#: cnn, cannot act): the built-in policy and value MLPs (models/actor_critic.py).
DEFAULT_MODEL = "actor-critic"
#: The built-in actor-critic's value path (models/actor_critic.py), trained by the value
#: loss alone: diagnose names a gradient overflow there as the value loss's.
VALUE_PATH = "critic"
#: Evaluations in a run when --eval-every is not given.
EVALUATIONS = 20


class PpoIteration(Iteration):
    """The task drives the run: a rollout, then epochs of minibatch steps
    (:meth:`iterate`); its batches are rollout slots, not samples."""

    owns = True
    batches_are_samples = False

    def __init__(self, task: PpoTask) -> None:
        self.task = task

    def iterate(self, loop: TrainLoop) -> None:
        """CleanRL's loop: for each update a rollout with the current policy, then
        ``update_epochs`` epochs of ``minibatches`` minibatch steps over it. The epochs are
        the run's data epochs of the rollout's slots (its seed decides the minibatches); a
        resumed run goes on inside the update it stopped in, on a fresh rollout; so a
        checkpoint is written at the end of an update, where a resume repeats the run
        exactly, not after each of its epochs (4 times as many files, each a stall)."""
        task = self.task
        s = task.settings
        per_epoch, epochs = s["minibatches"], s["update_epochs"]
        per_update = per_epoch * epochs
        for update in itertools.count(loop.step_number // per_update):
            if loop.done:
                return
            task.collect(loop, update)
            done = loop.step_number - update * per_update   # > 0 only in a resumed update
            for epoch in range(done // per_epoch, epochs):
                start = done % per_epoch if epoch == done // per_epoch else 0
                for window in loop.epoch(update * epochs + epoch, start,
                                         saves=epoch == epochs - 1):
                    loop.step(window)

    def timed_unit(self) -> int:
        """A whole update: its rollout and its ``minibatches x update_epochs`` steps."""
        settings = self.task.settings
        return int(settings["minibatches"] * settings["update_epochs"])

    def run_options(self, config: Any, data: Any) -> dict[str, Any]:
        """The run's length and minibatch from ``--env-steps`` and the rollout, and the
        recipe's optimizer settings for those the user did not give."""
        given = given_options(config)
        env = data.train.env
        s = self.task.recipe(env)
        _, world = process_world()
        rollout = env.rollout_size * world
        minibatches = s["minibatches"]
        shape = (f"{flag('num_envs')} {env.num_envs} x {flag('rollout_steps')} "
                 f"{env.rollout_steps}" + (f" x {world} processes" if world > 1 else ""))
        if rollout % minibatches:
            raise UserError(f"{flag('minibatches')} {minibatches} does not divide the rollout "
                            f"of {rollout} transitions ({shape})")
        if rollout // minibatches < 2:  # advantage normalisation: the std of one is NaN
            raise UserError(f"{flag('minibatches')} {minibatches} leaves minibatches of one "
                            f"transition (the rollout is {rollout}: {shape}); a minibatch "
                            f"needs 2 or more (advantages are normalised over it)")
        env_steps = self.task.env_steps if self.task.env_steps is not None else 500_000
        if env_steps < rollout:
            raise UserError(f"{flag('env_steps')} {env_steps} is less than one rollout of "
                            f"{rollout} environment steps ({shape}); give at least {rollout} "
                            f"or a smaller rollout")
        updates = env_steps // rollout
        per_update = minibatches * s["update_epochs"]
        options: dict[str, Any] = {"batch_size": rollout // minibatches,
                                   "max_steps": updates * per_update}
        # A run's own config.yaml holds the length and minibatch decided here: the same
        # values rerun it; any other is refused (--env-steps decides them).
        if getattr(config.schedule, "epochs", None) is not None:
            raise UserError(f"{flag('epochs')} does not apply to {flag('task')} ppo: "
                            f"{flag('env_steps')} sets the run's length")
        if config.schedule.max_steps not in (None, options["max_steps"]):
            raise UserError(f"{flag('max_steps')} does not apply to {flag('task')} ppo: "
                            f"{flag('env_steps')} sets the run's length")
        if "batch_size" in given and config.batching.batch_size != options["batch_size"]:
            raise UserError(f"{flag('batch_size')} does not apply to {flag('task')} ppo: a "
                            f"step's minibatch is the rollout ({flag('num_envs')} x "
                            f"{flag('rollout_steps')}) over {flag('minibatches')}")
        if getattr(config.batching, "micro_batch_size", None) == "auto":
            raise UserError(f"{flag('micro_batch_size')} auto does not apply to {flag('task')} "
                            f"ppo: a step's minibatch is {options['batch_size']} transitions; "
                            f"give {flag('micro_batch_size')} N (a divisor of it) or leave it out")
        if hasattr(config, "model") and "model" in given:
            self.task.model_spec = str(config.model)
        elif hasattr(config, "model"):
            options["model"] = DEFAULT_MODEL  # (cnn, for images) -> the built-in actor-critic
        # The recipe's lr, linear annealing, Adam without weight decay and clipping,
        # unless the user gave their own.
        recipe = {"lr": s["lr"], "scheduler": "linear", "weight_decay": 0.0,
                  "clip_grad_norm": s["clip_grad_norm"]}
        options.update({k: v for k, v in recipe.items() if k not in given})
        if "eval_every" not in given:
            options["eval_every"] = per_update * max(1, updates // EVALUATIONS)
        return options


class PpoLogKeys(LogKeys):
    """The rollouts' episode return on the console, environment steps per second."""

    shown_fields = ("episode_return",)
    speed_units = MappingProxyType({"env_steps_per_s": "env steps/s"})

    def __init__(self, task: PpoTask) -> None:
        self.task = task


    def throughput(self, samples_per_s: float | None) -> dict[str, float]:
        """Environment steps per second: each transition is trained ``update_epochs``
        times, so the rollout's steps are the samples over the epochs."""
        if samples_per_s is None or not self.task.settings:
            return {}
        return {"env_steps_per_s": samples_per_s / self.task.settings["update_epochs"]}


class PpoDiagnosis(Diagnosis):
    """One loss; the critic's path carries the value loss."""

    def __init__(self, task: PpoTask) -> None:
        self.task = task


    def loss_paths(self) -> dict[str, str]:
        """The critic carries the value loss, whose gradient grows with the returns."""
        returns = self.task.rollout.returns if self.task.rollout is not None else None
        largest = float(returns.abs().max()) if returns is not None else None
        size = f", returns up to |{largest:.3g}|" if largest is not None else ""
        scaled = "normalised rewards" if self.task.env is not None and self.task.env.normalise \
            else "unnormalised rewards"
        return {VALUE_PATH: f"the value loss ({scaled}{size}; its gradient grows with the "
                            f"returns)"}


class PpoChecks(DataChecks):
    """gym: data only; models() checks the actor-critic interface."""


    def check_data(self, data: Any, keyword: str) -> None:
        if getattr(data, "env", None) is None:
            raise UserError(f"{flag('task')} ppo trains on environments: {keyword} must be "
                            f"the rollout of gym: data ({flag('data')} gym:ENV_ID, or "
                            f"amptrain.data.build_data('gym:ENV_ID').train)")

    def check_outputs(self, outputs: torch.Tensor | None, targets: Any, *,
                      model_name: str | None, all_targets: torch.Tensor | None) -> None:
        return None  # models() checked the actor-critic interface on an observation batch


class PpoReports(Reports):
    """The deterministic episodes' returns and lengths, and the critic's error."""


    def report(self, result: EvalResult) -> dict[str, Any]:
        d = result.details
        lengths = d.get("lengths") or []
        return {"env": d.get("env"), "episodes": result.samples,
                "episodes_cut": d.get("episodes_cut", 0),
                "episodes_cut_at": ppo_eval.MAX_EPISODE_STEPS,
                "return_mean": result.metrics["return"],
                "return_std": d.get("return_std"), "return_iqm": result.metrics["return_iqm"],
                "length_mean": float(np.mean(lengths)) if lengths else None,
                "returns": d.get("returns"), "lengths": lengths,
                "policy": "deterministic (most likely action / Gaussian mean)",
                "value_loss": result.loss,
                "value_loss_meaning": "squared error of the critic's value of each start "
                                      "against the episode's discounted return (in the "
                                      "reward scale it learnt)"}

    def report_text(self, result: EvalResult) -> tuple[str, str]:
        r = self.report(result)
        lines = [f"PPO report: {r['episodes']} deterministic episodes of {r['env']}", "",
                 f"  return mean  {r['return_mean']:.2f}",
                 f"  return std   {r['return_std']:.2f}",
                 f"  return IQM   {r['return_iqm']:.2f}",
                 f"  length mean  {r['length_mean']:.1f}", "",
                 "  returns: " + " ".join(f"{x:.1f}" for x in r["returns"])]
        return "ppo_report.txt", "\n".join(lines + [""])


__all__ = ["DEFAULT_MODEL", "EVALUATIONS", "VALUE_PATH", "PpoChecks", "PpoDiagnosis",
           "PpoIteration", "PpoLogKeys", "PpoReports"]
