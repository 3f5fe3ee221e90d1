"""The ``ppo`` task: proximal policy optimisation (Schulman et al. 2017) on ``gym:``
environments (:mod:`amptrain.data.gym`), the recipe of CleanRL's single-file ``ppo.py``
(discrete actions) and ``ppo_continuous_action.py`` (continuous actions).

The task owns its loop (its iteration part, :class:`.ppo_parts.PpoIteration`), as CleanRL's
reads: for each update it collects a rollout (``num_envs x rollout_steps`` transitions per
process) with the policy under the precision's autocast and without gradients, computes
advantages (GAE) and returns in fp32, then runs ``update_epochs`` epochs of ``minibatches``
steps over it. A step is one optimizer step, as everywhere in amptrain: one minibatch update
through the step context (autocast, backward with loss scaling, clipping, the optimizer
step). The minibatches come from the run's data order: the training split is the rollout's
slot indices (data/gym.py), shuffled per epoch by the run's seed. Between steps the Trainer
logs, evaluates, checkpoints and stops as in any run (:mod:`amptrain.trainer.loop`).

The run's length is ``--env-steps``: ``env_steps // (rollout x processes)`` updates
(its iteration part's ``run_options``, :mod:`.ppo_parts`, sets ``--max-steps`` and the
minibatch as ``--batch-size``).
Evaluation plays ``--eval-episodes`` deterministic episodes (the policy's most likely
action, or the Gaussian's mean); ``val_return`` is their mean return (the primary metric,
higher is better) and ``val_return_iqm`` their interquartile mean.
"""
from __future__ import annotations

import logging
from dataclasses import fields
from typing import Any

import numpy as np
import torch
from torch import nn

from ..common.errors import UserError, flag
from . import ppo_eval
from .base import EvalResult, EvalSums, EvaluationStopped, Metric, Metrics, Task, Verdict, Wording
from .gan import unwrap
from .ppo_model import actor_critic_of
from .ppo_options import PpoOptions
from .ppo_parts import (DEFAULT_MODEL, EVALUATIONS, VALUE_PATH, PpoChecks, PpoDiagnosis,
                        PpoIteration, PpoLogKeys, PpoReports)
from .step import StepContext, TrainLoop
from .rollout import (LossSettings, Rollout, distribution, explained_variance,
                      log_prob, log_prob_entropy, ppo_loss)

log = logging.getLogger("amptrain")

#: CleanRL's defaults: ppo.py (discrete) and ppo_continuous_action.py (continuous).
RECIPES: dict[str, dict[str, Any]] = {
    "discrete": {"lr": 2.5e-4, "minibatches": 4, "update_epochs": 4, "ent_coef": 0.01},
    "continuous": {"lr": 3e-4, "minibatches": 32, "update_epochs": 10, "ent_coef": 0.0},
}
SHARED = {"gamma": 0.99, "gae_lambda": 0.95, "clip_coef": 0.2, "vf_coef": 0.5,
          "clip_grad_norm": 0.5, "adam_eps": 1e-5}
#: The hyper-parameters a run may set: the options declared in ppo_options.py's PpoOptions
#: (flags of the same names), but the run's length.
SETTINGS = tuple(f.name for f in fields(PpoOptions) if f.name != "env_steps")


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
    metrics = Metrics(Metric("return", "episode return", higher_is_better=True),
                      Metric("return_iqm", "episode return IQM", higher_is_better=True))
    #: RL returns vary widely between seeds: compare judges the IQM over seeds with
    #: stratified-bootstrap intervals (compare/seeds.py), not the mean of two runs. A
    #: return within 5 % of the baseline's counts as the same: the shared 2 % is tighter
    #: than five seeds of PPO resolve (CartPole, 5 seeds: a 95 % interval of about ±5 %).
    verdict = Verdict(unit="rel", default_tolerance=0.05, seed_statistic="iqm")
    wording = Wording(data_holds="environment transitions",
                      data_needs="ppo needs a Gymnasium environment (--data gym:ENV_ID)",
                      output_noun="actions")
    checks = PpoChecks()
    reports = PpoReports()

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
        self.iteration = PpoIteration(self)
        self.logs = PpoLogKeys(self)
        self.diagnosis = PpoDiagnosis(self)

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


__all__ = ["DEFAULT_MODEL", "EVALUATIONS", "PpoTask", "RECIPES", "VALUE_PATH", "actor_critic_of",
           "iqm"]
