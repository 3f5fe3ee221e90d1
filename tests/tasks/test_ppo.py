"""The ppo task through the Trainer: the run's length from --env-steps, the actor-critic
check, an fp16 step with an injected inf, resume, evaluation episodes, DDP ranks' seeds
(real gloo processes) and one short end-to-end CLI run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from amptrain.config import RunConfig
from amptrain.data import DataOptions, GymOptions, build_data
from amptrain.common.errors import UserError
from amptrain.models.actor_critic import ActorCritic
from amptrain.workflows.runner import assemble
from amptrain.tasks.ppo import PpoTask, iqm
from amptrain.trainer import Trainer

pytest.importorskip("gymnasium")

#: 2 environments x 16 steps = 32 transitions, 2 minibatches of 16, 2 epochs: 4 steps.
ROLLOUT = dict(num_envs=2, rollout_steps=16, eval_episodes=2)


class Poisoned(ActorCritic):
    """The built-in actor-critic whose value turns infinite on demand."""

    poison = False

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, value = super().forward(obs)
        return logits, value * float("inf") if self.poison else value


def _run(tmp_path: Path | None = None, *, precision: str = "32-true", steps: int = 8,
         model: nn.Module | None = None, **options):
    data = build_data("gym:CartPole-v1", DataOptions(seed=0, gym=GymOptions(**ROLLOUT)))
    torch.manual_seed(0)
    model = model if model is not None else ActorCritic(4, 2, continuous=False)
    trainer = Trainer(precision=precision, max_steps=steps, batch_size=16, scheduler="none",
                      weight_decay=0.0, clip_grad_norm=0.5, no_progress=True, logger="none",
                      out=str(tmp_path) if tmp_path else None, **options)
    return trainer, model, data, PpoTask(minibatches=2, update_epochs=2)


def test_env_steps_set_the_runs_length_and_the_recipe_its_optimizer():
    config = RunConfig.from_options(data="gym:CartPole-v1", model="actor-critic",
                                    env_steps=2048)
    decided = assemble(config).config
    # 2048 // (4 x 128) = 4 updates of 4 minibatches x 4 epochs.
    assert decided.schedule.max_steps == 64 and decided.batching.batch_size == 128
    assert (decided.schedule.lr, decided.schedule.scheduler, decided.schedule.weight_decay,
            decided.schedule.clip_grad_norm) == (2.5e-4, "linear", 0.0, 0.5)
    with pytest.raises(UserError, match="max_steps does not apply to task ppo"):
        assemble(config.with_options(max_steps=10))
    with pytest.raises(UserError, match="minibatches 3 does not divide the rollout of 512"):
        assemble(config.with_options(minibatches=3))


def test_gym_data_without_a_model_trains_the_built_in_actor_critic():
    # What `amptrain train|compare|diagnose --data gym:CartPole-v1` assemble (no --model).
    run = assemble(RunConfig.from_options(data="gym:CartPole-v1", env_steps=512))
    assert run.task.name == "ppo" and run.config.model == "actor-critic"
    assert isinstance(run.model, ActorCritic)
    # A model the user named is theirs, even spelt as the default (cnn cannot act:
    # refused, naming the fit): the given options are carried, not guessed.
    for named in ("cnn", "cnn:width=8"):
        with pytest.raises(UserError, match="try --model actor-critic"):
            assemble(RunConfig.from_options(data="gym:CartPole-v1", env_steps=512,
                                            model=named))


def test_a_model_that_is_not_an_actor_critic_is_refused():
    trainer, _, data, task = _run()
    mlp = nn.Sequential(nn.Linear(4, 2))
    with pytest.raises(UserError, match="ppo needs an actor-critic.*returns Tensor"):
        trainer.fit(mlp, data.train, data.val, task=task)
    pendulum = build_data("gym:Pendulum-v1",
                          DataOptions(gym=GymOptions(num_envs=1, rollout_steps=32)))
    no_log_std = ActorCritic(3, 1, continuous=False)
    with pytest.raises(UserError, match="log_std"):
        Trainer(max_steps=1, batch_size=16, no_progress=True, logger="none").fit(
            no_log_std, pendulum.train, pendulum.val, task=PpoTask(minibatches=2))


def test_fp16_step_with_an_injected_inf_leaves_actor_critic_and_optimizer_untouched():
    model = Poisoned(4, 2, continuous=False)
    trainer, model, data, task = _run(precision="16-mixed", model=model, init_scale=256.0)
    trainer.setup(model, data.train, data.val, task=task)
    windows = list(trainer.train_windows.epoch(0))
    trainer.train_step(windows[0])        # collects the rollout, first minibatch
    trainer.finish_step()
    optimizer = trainer.optimizer
    skipped = trainer.precision.skipped_steps_of(optimizer)
    assert skipped == 0 and optimizer.state  # a real step: there is state to keep
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    state = {i: {k: v.clone() for k, v in s.items()}
             for i, s in enumerate(optimizer.state.values())}
    scale = trainer.precision.loss_scale
    model.poison = True
    trainer.train_step(windows[1])        # the same rollout: an infinite value loss
    trainer.finish_step()
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(state[i][k], v) for i, s in enumerate(optimizer.state.values())
               for k, v in s.items())
    assert trainer.precision.skipped_steps_of(optimizer) == skipped + 1
    assert trainer.precision.loss_scale < scale


def test_resume_at_an_update_boundary_restores_the_state_and_repeats(tmp_path):
    trainer, model, data, task = _run(tmp_path / "run", steps=12, save_every=4, keep_last=10)
    trainer.fit(model, data.train, data.val, task=task)
    saved = torch.load(tmp_path / "run" / "checkpoints" / "step-8.pt", weights_only=False)
    finals = []
    for attempt in range(2):
        again, fresh, data, task = _run(tmp_path / f"resumed{attempt}", steps=12,
                                        resume=str(tmp_path / "run/checkpoints/step-8.pt"))
        again.setup(fresh, data.train, data.val, task=task)
        assert again.step == 8
        assert all(torch.equal(saved["model"][k], v) for k, v in fresh.state_dict().items())
        again.run()
        finals.append({k: v.clone() for k, v in fresh.state_dict().items()})
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])
    assert not all(torch.equal(finals[0][k], saved["model"][k]) for k in finals[0])


def test_checkpoints_are_written_at_the_end_of_each_update_not_of_each_epoch(tmp_path):
    # minibatches=2 x update_epochs=2: an update is 4 steps, an epoch 2. A checkpoint at an
    # epoch inside an update cannot be resumed bitwise (a fresh rollout) and costs a stall.
    trainer, model, data, task = _run(tmp_path / "run", steps=12, keep_last=10)
    trainer.fit(model, data.train, data.val, task=task)
    saved = sorted(int(p.stem.split("-")[1])
                   for p in (tmp_path / "run" / "checkpoints").glob("step-*.pt"))
    assert saved == [4, 8, 12]


def test_evaluation_plays_deterministic_episodes(tmp_path):
    trainer, model, data, task = _run(tmp_path / "run", steps=4)
    trainer.fit(model, data.train, data.val, task=task)
    first = trainer.evaluate()
    second = trainer.evaluate(write_dir=tmp_path / "eval")
    assert first.metrics == second.metrics and first.samples == 2
    assert first.metrics["return"] == pytest.approx(sum(first.details["returns"]) / 2)
    assert first.metrics["return"] >= 8  # CartPole lasts at least 8 steps
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["episodes"] == 2 and report["env"] == "gym:CartPole-v1"
    assert "return IQM" in (tmp_path / "eval" / "ppo_report.txt").read_text()
    records = [json.loads(line) for line in
               (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    keys = set().union(*records)
    assert {"episode_return", "approx_kl", "clip_frac", "entropy", "explained_variance",
            "env_steps_per_s", "val_return", "val_return_iqm"} <= keys


def test_eval_episodes_refused_for_a_checkpoint_of_samples(tmp_path):
    from amptrain.workflows.runner import run_evaluation, run_training

    run_training(RunConfig.from_options(model="mlp", data="digits", max_steps=1,
                                        batch_size=16, no_progress=True, logger="none",
                                        out=str(tmp_path / "cls")))
    with pytest.raises(UserError, match="--episodes applies to checkpoints of gym: runs"):
        run_evaluation(checkpoint_path=str(tmp_path / "cls"), data="digits",
                       precision="32-true", out=str(tmp_path / "ev"), episodes=3)


def test_iqm_is_the_mean_of_the_middle_half():
    assert iqm([1, 2, 3, 4, 100, -100, 5, 6]) == pytest.approx(3.5)
    assert iqm([7.0]) == 7.0


RANK_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch.distributed as dist
    dist.init_process_group("gloo")
    from amptrain.data import DataOptions, GymOptions, build_data
    from amptrain.data.gym import process_world
    data = build_data("gym:CartPole-v1",
                      DataOptions(seed=5, gym=GymOptions(num_envs=3, rollout_steps=8)))
    stepper = data.train.env.stepper(*process_world())
    seeds = [None, None]
    dist.all_gather_object(seeds, stepper.seeds)
    if dist.get_rank() == 0:
        print(json.dumps({"seeds": seeds, "slots": len(data.train)}))
    dist.destroy_process_group()
""")


def test_ddp_ranks_use_disjoint_environment_seeds(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(RANK_SCRIPT)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29_000 + os.getpid() % 999),
           "WORLD_SIZE": "2", "PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""),
                                                            str(Path.cwd())])}
    ranks = [subprocess.Popen([sys.executable, str(script)], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outputs = [p.communicate(timeout=240) for p in ranks]
    assert all(p.returncode == 0 for p in ranks), outputs
    report = json.loads(outputs[0][0])
    zero, one = report["seeds"]
    assert zero == [5, 6, 7] and one == [8, 9, 10] and not set(zero) & set(one)
    assert report["slots"] == 2 * 3 * 8  # the global rollout: each rank its own envs


@pytest.mark.slow
def test_cli_train_then_eval_on_cartpole(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    train = subprocess.run(  # no --model: gym: data trains the built-in actor-critic
        [sys.executable, "-m", "amptrain", "train", "--data", "gym:CartPole-v1",
         "--env-steps", "2048", "--num-envs", "2", "--rollout-steps", "64",
         "--eval-episodes", "3", "--precision", "bf16-mixed", "--out", str(run),
         "--no-progress", "--logger", "none"],
        capture_output=True, text=True, env=env, timeout=600)
    assert train.returncode == 0, train.stderr
    done = [line for line in train.stdout.splitlines() if line.startswith("done:")]
    assert done and "val_return" in done[0]
    assert json.loads((run / "model.json").read_text())["model"] == "actor-critic"
    evaluated = subprocess.run(
        [sys.executable, "-m", "amptrain", "eval", "--checkpoint", str(run), "--out",
         str(tmp_path / "eval"), "--episodes", "4", "--no-progress"],
        capture_output=True, text=True, env=env, timeout=300)
    assert evaluated.returncode == 0, evaluated.stderr
    assert "episode return IQM" in evaluated.stdout and "on 4 samples" in evaluated.stdout
    report = json.loads((tmp_path / "eval" / "eval" / "report.json").read_text())
    assert report["episodes"] == 4 and len(report["returns"]) == 4


# ------------------------------------------------ the task owns its loop (issue 43, item 2)
def _counting(task: PpoTask) -> list[tuple[int, int]]:
    """(update, optimizer steps done) at each rollout the task collects."""
    seen: list[tuple[int, int]] = []
    collect = task.collect

    def counted(ctx, update=0):
        seen.append((update, ctx.step_number))
        return collect(ctx, update)
    task.collect = counted
    return seen


def test_each_update_collects_one_rollout_then_runs_its_minibatch_epochs():
    trainer, model, data, task = _run(steps=12)
    seen = _counting(task)
    trainer.fit(model, data.train, data.val, task=task)
    # 2 minibatches x 2 epochs: a rollout before steps 1, 5 and 9, none inside an update.
    assert seen == [(0, 0), (1, 4), (2, 8)] and trainer.step == 12
    assert trainer.epoch == 6  # the run's data epochs: 2 per update
    logged = [r for r in trainer.history if "loss" in r]
    # A rollout's return is logged between steps and joins the next step's record.
    assert {"episode_return", "policy_loss"} <= set(logged[-2])


def test_a_run_resumed_inside_an_update_acts_afresh_and_finishes_that_update(tmp_path):
    trainer, model, data, task = _run(tmp_path / "run", steps=12, save_every=6, keep_last=10)
    trainer.fit(model, data.train, data.val, task=task)
    again, fresh, data, task = _run(tmp_path / "again", steps=12,
                                    resume=str(tmp_path / "run/checkpoints/step-6.pt"))
    seen = _counting(task)
    again.fit(fresh, data.train, data.val, task=task)
    # Step 6 is inside update 1 (steps 5-8): a fresh rollout for its last 2 steps (its
    # second epoch), then update 2 as usual.
    assert seen == [(1, 6), (2, 8)] and again.step == 12 and again.epoch == 6
