"""The ``ppo`` task: proximal policy optimisation (Schulman et al. 2017) on ``gym:``
environments (:mod:`amptrain.data.gym`), the recipe of CleanRL's single-file ``ppo.py``
(discrete actions) and ``ppo_continuous_action.py`` (continuous actions).

The task owns its loop (:meth:`PpoTask.iterate`), as CleanRL's reads: for each update it
collects a rollout (``num_envs x rollout_steps`` transitions per process) with the policy
under the precision's autocast and without gradients, computes advantages (GAE) and
returns in fp32, then runs ``update_epochs`` epochs of ``minibatches`` steps over it. A
step is one optimizer step, as everywhere in amptrain: one minibatch update through the
step context (autocast, backward with loss scaling, clipping, the optimizer step). The
minibatches come from the run's data order: the training split is the rollout's slot
indices (data/gym.py), shuffled per epoch by the run's seed. Between steps the Trainer
logs, evaluates, checkpoints and stops as in any run (:mod:`amptrain.trainer.loop`).

The run's length is ``--env-steps``: ``env_steps // (rollout x processes)`` updates
(:meth:`PpoTask.run_options` sets ``--max-steps`` and the minibatch as ``--batch-size``).
Evaluation plays ``--eval-episodes`` deterministic episodes (the policy's most likely
action, or the Gaussian's mean); ``val_return`` is their mean return (the primary metric,
higher is better) and ``val_return_iqm`` their interquartile mean.
"""
from __future__ import annotations

import logging
import itertools
from dataclasses import fields
from types import MappingProxyType
from typing import Any

import numpy as np
import torch
from torch import nn

from ..config import given_options
from ..config.run import PpoOptions
from ..data.gym import process_world
from ..common.errors import UserError, flag
from . import ppo_eval
from .base import EvalResult, EvalSums, EvaluationStopped, Metric, Task
from .gan import unwrap
from .ppo_model import actor_critic_of
from .step import StepContext, TrainLoop
from .rollout import (LossSettings, Rollout, distribution, explained_variance,
                      log_prob, log_prob_entropy, ppo_loss)

log = logging.getLogger("amptrain")

#: The model a ppo run trains when ``--model`` is left at its default (the image default,
#: cnn, cannot act): the built-in policy and value MLPs (models/actor_critic.py).
DEFAULT_MODEL = "actor-critic"

#: The built-in actor-critic's value path (models/actor_critic.py), trained by the value
#: loss alone: diagnose names a gradient overflow there as the value loss's.
VALUE_PATH = "critic"

#: CleanRL's defaults: ppo.py (discrete) and ppo_continuous_action.py (continuous).
RECIPES: dict[str, dict[str, Any]] = {
    "discrete": {"lr": 2.5e-4, "minibatches": 4, "update_epochs": 4, "ent_coef": 0.01},
    "continuous": {"lr": 3e-4, "minibatches": 32, "update_epochs": 10, "ent_coef": 0.0},
}
SHARED = {"gamma": 0.99, "gae_lambda": 0.95, "clip_coef": 0.2, "vf_coef": 0.5,
          "clip_grad_norm": 0.5, "adam_eps": 1e-5}
#: The hyper-parameters a run may set: the options declared in config/run.py's PpoOptions
#: (flags of the same names), but the run's length.
SETTINGS = tuple(f.name for f in fields(PpoOptions) if f.name != "env_steps")
#: Evaluations in a run when --eval-every is not given.
EVALUATIONS = 20


def iqm(values: np.ndarray) -> float:
    """The interquartile mean: the mean of the middle 50 % (25 % trimmed from each end,
    as ``scipy.stats.trim_mean(x, 0.25)`` and rliable compute it)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    cut = int(len(x) * 0.25)
    middle = x[cut:len(x) - cut] if len(x) > 2 * cut else x
    return float(middle.mean()) if len(middle) else float("nan")


class _Episodes(EvalSums):
    """Deterministic evaluation episodes, played on the host, one per validation sample;
    a batch's episodes side by side (:func:`~.ppo_eval.play_episodes`)."""

    def __init__(self, task: PpoTask, device: torch.device) -> None:
        self.task, self.device = task, device
        self.returns: list[float] = []
        self.lengths: list[float] = []
        self.value_errors: list[float] = []
        self.cut = 0

    def update(self, outputs: torch.Tensor | None, targets: Any) -> None:
        return None  # the episodes are played in update_batch

    def update_batch(self, model: Any, batch: Any) -> None:
        gamma = self.task.settings.get("gamma", SHARED["gamma"])
        # Episodes may be long (10,000 steps): a stop request is heard between steps.
        episodes = ppo_eval.play_episodes(self.task.env, model, batch[-1].tolist(),
                                          self.device, gamma=gamma, stopping=self.stopping)
        if self.stopping():
            raise EvaluationStopped
        for episode in episodes:
            self.cut += episode.cut
            self.returns.append(episode.total)
            self.lengths.append(float(episode.length))
            self.value_errors.append(episode.value_error)


class PpoTask(Task):
    """PPO on a ``gym:`` environment (module docstring)."""

    name = "ppo"
    metrics = (Metric("return", "episode return", higher_is_better=True),
               Metric("return_iqm", "episode return IQM", higher_is_better=True))
    delta_unit = "rel"
    tolerance_option = "tolerance_rel"
    data_holds = "environment transitions"
    data_needs = "ppo needs a Gymnasium environment (--data gym:ENV_ID)"
    output_noun = "actions"
    loss_names = {0: "loss"}
    batches_are_samples = False
    #: The task drives the run: a rollout, then epochs of minibatch steps (:meth:`iterate`).
    owns_loop = True
    shown_fields = ("episode_return",)
    speed_units = MappingProxyType({"env_steps_per_s": "env steps/s"})
    #: RL returns vary widely between seeds: compare judges the IQM over seeds with
    #: stratified-bootstrap intervals (compare/seeds.py), not the mean of two runs.
    seed_statistic = "iqm"
    #: A return within 5 % of the baseline's counts as the same: the shared 2 % is tighter
    #: than five seeds of PPO resolve (CartPole, 5 seeds: a 95 % interval of about ±5 %).
    default_tolerance_rel = 0.05

    def __init__(self, env_steps: int | None = None, obs_stats: dict[str, Any] | None = None,
                 reward_stats: dict[str, Any] | None = None, **settings: Any) -> None:
        self.env_steps = env_steps
        self.given = {k: settings[k] for k in SETTINGS if settings.get(k) is not None}
        self.settings: dict[str, Any] = {}
        self.saved_stats = (obs_stats, reward_stats)
        self.env: Any = None
        self.stepper: Any = None
        self.rollout: Rollout | None = None
        self.log_std_of: nn.Module | None = None
        self.model_spec: str | None = None  # the --model given, named by actor_critic_of

    # ------------------------------------------------------- learnt from data
    def recipe(self, env: Any) -> dict[str, Any]:
        """The settings for ``env``: CleanRL's recipe for its action space, then the given."""
        kind = "discrete" if env.discrete else "continuous"
        return {**SHARED, **RECIPES[kind], **self.given}

    def learn_from(self, train_data: Any) -> None:
        """Take the environments of ``gym:`` data (training or evaluation split) and the
        recipe for their action space; statistics a checkpoint kept are restored."""
        env = getattr(train_data, "env", None)
        if env is None:
            raise UserError(f"{flag('task')} ppo trains on environments: the data must be "
                            f"gym: data's ({flag('data')} gym:ENV_ID)")
        self.env = env
        self.settings = self.recipe(env)
        env.gamma = self.settings["gamma"]
        obs_stats, reward_stats = self.saved_stats
        if obs_stats:
            env.obs_stats.load(obs_stats)
        if reward_stats:
            env.reward_stats.load(reward_stats)

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"env_steps": self.env_steps, **self.given}
        if self.env is not None and self.env.normalise:
            state["obs_stats"] = self.env.obs_stats.state()
            state["reward_stats"] = self.env.reward_stats.state()
        return state

    def run_options(self, config: Any, data: Any) -> dict[str, Any]:
        """The run's length and minibatch from ``--env-steps`` and the rollout, and the
        recipe's optimizer settings for those the user did not give."""
        given = given_options(config)
        env = data.train.env
        s = self.recipe(env)
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
        env_steps = self.env_steps if self.env_steps is not None else 500_000
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
            self.model_spec = str(config.model)
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

    def loss_paths(self) -> dict[str, str]:
        """The critic carries the value loss, whose gradient grows with the returns."""
        returns = self.rollout.returns if self.rollout is not None else None
        largest = float(returns.abs().max()) if returns is not None else None
        size = f", returns up to |{largest:.3g}|" if largest is not None else ""
        scaled = "normalised rewards" if self.env is not None and self.env.normalise \
            else "unnormalised rewards"
        return {VALUE_PATH: f"the value loss ({scaled}{size}; its gradient grows with the "
                            f"returns)"}

    def timed_unit(self) -> int:
        """A whole update: its rollout and its ``minibatches x update_epochs`` steps."""
        return int(self.settings["minibatches"] * self.settings["update_epochs"])

    def throughput(self, samples_per_s: float | None) -> dict[str, float]:
        """Environment steps per second: each transition is trained ``update_epochs``
        times, so the rollout's steps are the samples over the epochs."""
        if samples_per_s is None or not self.settings:
            return {}
        return {"env_steps_per_s": samples_per_s / self.settings["update_epochs"]}

    # ------------------------------------------------------------------ parts
    def models(self, model: nn.Module) -> dict[str, nn.Module]:
        if self.env is None:
            raise UserError("the ppo task's learn_from(train_data) was not called before models()")
        module, continuous = actor_critic_of(model, self.env, self.model_spec)
        self.log_std_of = module if continuous else None
        return {"model": model}

    def build_optimizers(self, parts: dict[str, nn.Module], build: Any
                         ) -> dict[str, torch.optim.Optimizer]:
        """The run's optimizer with the recipe's Adam epsilon (1e-5)."""
        optimizers = super().build_optimizers(parts, build)
        for optimizer in optimizers.values():
            for group in optimizer.param_groups:
                if "eps" in group:
                    group["eps"] = self.settings.get("adam_eps", SHARED["adam_eps"])
        return optimizers

    def _log_std(self) -> torch.Tensor | None:
        return getattr(self.log_std_of, "log_std", None) if self.log_std_of is not None \
            else None

    # -------------------------------------------------------------- the step
    def collect(self, ctx: TrainLoop | StepContext, update: int = 0) -> None:
        """One rollout with the current policy (no gradients, under the autocast).
        ``update``: the run's update it starts (the first of a resumed run seeds the
        environments afresh from it)."""
        env, s = self.env, self.settings
        model = ctx.model()
        device = next(unwrap(model).parameters()).device
        if self.stepper is None:
            self.stepper = env.stepper(ctx.rank, ctx.world_size, restart=update)
        stepper = self.stepper
        rollout = Rollout(env.rollout_steps, env.num_envs, env.obs_shape, env.actions,
                          discrete=env.discrete, device=device)
        rewards = np.zeros((env.rollout_steps, env.num_envs), dtype=np.float32)
        ended = np.zeros((env.rollout_steps, env.num_envs), dtype=np.float32)
        log_std = self._log_std()
        with torch.no_grad():
            for t in range(env.rollout_steps):
                obs = torch.as_tensor(stepper.obs, dtype=torch.float32, device=device)
                with ctx.autocast():
                    out, value = model(obs)
                dist = distribution(out, log_std)
                action = dist.sample()
                rollout.put(t, obs, action, log_prob(dist, action), value)
                _, reward, done, finals = stepper.step(action.cpu().numpy())
                for i, final in finals.items():  # truncated: bootstrap the final value
                    with ctx.autocast():
                        _, v = model(torch.as_tensor(final[None], dtype=torch.float32,
                                                     device=device))
                    reward[i] += s["gamma"] * float(v.float().reshape(-1)[0])
                rewards[t], ended[t] = reward, done
            obs = torch.as_tensor(stepper.obs, dtype=torch.float32, device=device)
            with ctx.autocast():
                _, next_value = model(obs)
            rollout.finish(torch.from_numpy(rewards).to(device),
                           torch.from_numpy(ended).to(device),
                           next_value.float().reshape(env.num_envs), s["gamma"],
                           s["gae_lambda"])
        self.rollout = rollout
        finished = stepper.take_finished()
        count = len(finished)
        returns = torch.tensor(sum(r for r, _ in finished) / max(count, 1), device=device)
        lengths = torch.tensor(sum(n for _, n in finished) / max(count, 1), device=device)
        ctx.log("episode_return", returns, count)
        ctx.log("episode_length", lengths, count)
        assert rollout.returns is not None
        ctx.log("explained_variance",
                explained_variance(rollout.values.flatten(), rollout.returns.flatten()), 1)

    def iterate(self, loop: TrainLoop) -> None:
        """CleanRL's loop: for each update a rollout with the current policy, then
        ``update_epochs`` epochs of ``minibatches`` minibatch steps over it. The epochs are
        the run's data epochs of the rollout's slots (its seed decides the minibatches); a
        resumed run goes on inside the update it stopped in, on a fresh rollout; so a
        checkpoint is written at the end of an update, where a resume repeats the run
        exactly, not after each of its epochs (4 times as many files, each a stall)."""
        s = self.settings
        per_epoch, epochs = s["minibatches"], s["update_epochs"]
        per_update = per_epoch * epochs
        for update in itertools.count(loop.step_number // per_update):
            if loop.done:
                return
            self.collect(loop, update)
            done = loop.step_number - update * per_update   # > 0 only in a resumed update
            for epoch in range(done // per_epoch, epochs):
                start = done % per_epoch if epoch == done // per_epoch else 0
                for window in loop.epoch(update * epochs + epoch, start,
                                         saves=epoch == epochs - 1):
                    loop.step(window)

    def training_step(self, ctx: StepContext) -> None:
        """One minibatch update on the rollout held (a step driven alone, without
        :meth:`iterate`, acts first when no rollout is held)."""
        s = self.settings
        if self.rollout is None:
            self.collect(ctx)
        rollout = self.rollout
        assert rollout is not None
        model, log_std = ctx.model(), self._log_std()
        settings = LossSettings(clip_coef=s["clip_coef"], ent_coef=s["ent_coef"],
                                vf_coef=s["vf_coef"])
        for batch, n, share in ctx.micro():
            mb = rollout.minibatch(batch[0] % len(rollout))
            with ctx.autocast():
                out, value = model(mb["obs"])
            logp, entropy = log_prob_entropy(distribution(out, log_std), mb["actions"])
            loss, stats = ppo_loss(logp, entropy, value, old_logp=mb["logp"],
                                   advantages=mb["advantages"], old_value=mb["values"],
                                   returns=mb["returns"], settings=settings)
            ctx.backward(loss if share == 1 else loss * share)
            ctx.log("loss", loss.detach(), n)
            for key, value_ in stats.items():
                ctx.log(key, value_, n)
        ctx.step()

    def close(self) -> None:
        """The run's environments are closed (async workers exit) when a run ends."""
        if self.stepper is not None:
            self.stepper.close()
            self.stepper = None

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Nothing to learn from an evaluation episode's start alone: the generic pass's
        loss is 0 and the evaluation's ``val_loss`` is the critic's error, measured while
        the episodes are played (:meth:`play`)."""
        return torch.zeros((), device=outputs.device)

    # ------------------------------------------------------------------ checks
    def check_data(self, data: Any, keyword: str) -> None:
        if getattr(data, "env", None) is None:
            raise UserError(f"{flag('task')} ppo trains on environments: {keyword} must be "
                            f"the rollout of gym: data ({flag('data')} gym:ENV_ID, or "
                            f"amptrain.data.build_data('gym:ENV_ID').train)")

    def check_outputs(self, outputs: torch.Tensor | None, targets: Any, *,
                      model_name: str | None, all_targets: torch.Tensor | None) -> None:
        return None  # models() checked the actor-critic interface on an observation batch

    # -------------------------------------------------------------- evaluation
    def start_eval(self, device: torch.device) -> EvalSums:
        if self.env is None:
            raise UserError("the ppo task plays episodes of its environment: call "
                            "task.learn_from(data) before evaluating")
        return _Episodes(self, device)

    def finish_eval(self, sums: EvalSums, gather: Any, loss: float, samples: int) -> EvalResult:
        assert isinstance(sums, _Episodes)
        local = torch.tensor([sums.returns, sums.lengths, sums.value_errors],
                             dtype=torch.float64, device=sums.device).reshape(3, -1)
        rows = gather(local.t().contiguous()).reshape(-1, 3).cpu().numpy()
        returns, lengths, errors = rows[:, 0], rows[:, 1], rows[:, 2]
        if not len(returns):
            raise UserError("the ppo task's evaluation played no episode (--eval-episodes)")
        metrics = {"return": float(returns.mean()), "return_iqm": iqm(returns)}
        cut = int(gather(torch.tensor([float(sums.cut)], dtype=torch.float64,
                                      device=sums.device)).sum().item())
        if cut:
            log.warning("%d of %d evaluation episodes were cut at %d steps (the environment "
                        "has no time limit): val_return sums cut episodes; give it one, e.g. "
                        "%s %s,max_episode_steps=1000", cut, len(returns),
                        ppo_eval.MAX_EPISODE_STEPS, flag("data"),
                        self.env.spec if self.env is not None else "gym:ENV_ID")
        return EvalResult(loss=float(errors.mean()), samples=len(returns), metrics=metrics,
                          details={"episodes_cut": cut, "returns": returns.tolist(),
                                   "lengths": lengths.tolist(),
                                   "return_std": float(returns.std()),
                                   "env": self.env.spec if self.env is not None else None},
                          task=self)

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


__all__ = ["PpoTask", "RECIPES", "actor_critic_of", "iqm"]
