"""amptrain's PPO against the plain single-file loop: environment steps/s, side by side.

Both sides train PPO on the same environments with the same batch (CartPole-v1, 4
environments x 128 steps, CleanRL's discrete recipe: 4 minibatches x 4 epochs) in one
process on one thread, taking turns update by update: a round is one update (a rollout
plus its minibatch epochs) of each lane, in a rotated order, timed with
``time.perf_counter`` around it. The lanes:

* ``amptrain``: a Trainer set up as ``amptrain train --data gym:CartPole-v1`` sets it up
  (the ppo task, the built-in actor-critic), run one update at a time by the task's own
  loop (``PpoIteration.iterate`` on a bare ``TaskLoop``: a rollout, then its minibatch steps),
  as ``compare`` times it; the loop's own bookkeeping (console lines, evaluations,
  checkpoints) is not part of it.
* ``reference`` and ``reference #2``: :func:`ppo_reference.iterate` (yields after each
  update); two identical loops, whose ratio is the A/A control (the measurement's own
  resolution).

Env steps/s = the rollout's transitions (num_envs x rollout_steps) / median update time;
the ratio is the median over rounds of amptrain / the mean of the two reference loops,
with its spread; warm-up rounds are excluded. The shares of time: in the environments
(Gymnasium's vector ``step``), acting (the rest of the rollout: the policy's forward
passes, the rollout buffers; amptrain computes GAE there too) and updating (the minibatch
epochs; the reference's GAE). Goal: amptrain / reference >= 0.95.

    python benchmarks/ppo_speed.py [--env CartPole-v1] [--num-envs 4] [--rollout-steps 128]
        [--precisions 32-true[,bf16-mixed,16-mixed]] [--rounds 20] [--warmup 3]
        [--threads 1] [--record]
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import benchlib as bl
import ppo_reference

from amptrain.config import RunConfig
from amptrain.workflows.runner import assemble
from amptrain.trainer import Trainer
from amptrain.trainer.loop import TaskLoop

GOAL = 0.95


def _timed(call: Callable[..., Any], clock: dict[str, float], key: str) -> Callable[..., Any]:
    """``call`` adding its seconds to ``clock[key]``."""
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            clock[key] += time.perf_counter() - started
    return timed


class AmptrainPpo:
    """amptrain's ppo run, one update per :meth:`update` (a rollout and its minibatch
    steps), with the seconds spent in the environments and in the rollouts counted."""

    def __init__(self, env_id: str, num_envs: int, rollout_steps: int, updates: int,
                 precision: str, seed: int) -> None:
        config = RunConfig.from_options(
            data=f"gym:{env_id}", num_envs=num_envs, rollout_steps=rollout_steps,
            env_steps=updates * num_envs * rollout_steps, precision=precision, seed=seed,
            no_progress=True, logger="none")
        run = assemble(config)
        self.trainer = Trainer(run.config)
        self.trainer.setup(run.model, run.data.train, task=run.task)
        task = self.trainer.task
        self.unit = task.iteration.timed_unit()
        self.transitions = num_envs * rollout_steps
        self.clock = {"env": 0.0, "rollout": 0.0}
        # Instrumentation (measuring only): the vector environment's step, and the rollout.
        source = run.data.train.env
        make_stepper = source.stepper

        def stepper(*args: Any, **kwargs: Any) -> Any:
            made = make_stepper(*args, **kwargs)
            made.envs.step = _timed(made.envs.step, self.clock, "env")
            return made
        source.stepper = stepper
        task.collect = _timed(task.collect, self.clock, "rollout")

    def update(self) -> None:
        """One PPO update: the rollout and its minibatch steps."""
        self.trainer.task.iteration.iterate(TaskLoop(self.trainer, bare_steps=self.unit))

    def shares(self, total_s: float) -> dict[str, float]:
        env, rollout = self.clock["env"], self.clock["rollout"]
        return {"env": env / total_s, "act": (rollout - env) / total_s,
                "update": (total_s - rollout) / total_s}


class ReferencePpo:
    """:func:`ppo_reference.iterate`, one update per :meth:`update`."""

    def __init__(self, env_id: str, num_envs: int, rollout_steps: int, updates: int,
                 precision: str, seed: int) -> None:
        self.loop = ppo_reference.iterate(env_id, num_envs, rollout_steps,
                                          updates * num_envs * rollout_steps, seed, precision)
        self.transitions = num_envs * rollout_steps
        self.last: dict[str, Any] = {}

    def update(self) -> None:
        self.last = next(self.loop)

    def shares(self, total_s: float) -> dict[str, float]:
        env, act = self.last["env_time_s"], self.last["act_time_s"]  # its running clocks
        return {"env": env / total_s, "act": act / total_s,
                "update": (total_s - env - act) / total_s}


def measure(env_id: str, num_envs: int, rollout_steps: int, precision: str, rounds: int,
            warmup: int, seed: int = 1) -> dict[str, Any]:
    """Update times per lane (rounds after ``warmup``), the ratios and the time shares."""
    updates = warmup + rounds
    lanes: dict[str, Any] = {
        "amptrain": AmptrainPpo(env_id, num_envs, rollout_steps, updates, precision, seed),
        "reference": ReferencePpo(env_id, num_envs, rollout_steps, updates, precision, seed),
        "reference #2": ReferencePpo(env_id, num_envs, rollout_steps, updates, precision,
                                     seed)}
    names = list(lanes)
    times: dict[str, list[float]] = {name: [] for name in names}
    total = dict.fromkeys(names, 0.0)
    for r in range(updates):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            started = time.perf_counter()
            lanes[name].update()
            elapsed = time.perf_counter() - started
            total[name] += elapsed
            if r >= warmup:
                times[name].append(elapsed)
    ours, ref, ref2 = times["amptrain"], times["reference"], times["reference #2"]
    ratios = [(a + b) / 2 / t for t, a, b in zip(ours, ref, ref2)]  # speed: time inverted
    control = bl.pair_ratios(ref, ref2)
    transitions = num_envs * rollout_steps
    return {"precision": precision,
            "amptrain_sps": transitions / bl.median(ours),
            "reference_sps": transitions / bl.median([(a + b) / 2 for a, b in zip(ref, ref2)]),
            "ratio": bl.median(ratios), "spread": bl.spread(ratios),
            "control": bl.median(control), "control_spread": bl.spread(control),
            "amptrain_shares": lanes["amptrain"].shares(total["amptrain"]),
            "reference_shares": lanes["reference"].shares(total["reference"])}


def _shares(s: dict[str, float]) -> str:
    return f"{s['env']:.0%} / {s['act']:.0%} / {s['update']:.0%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--rollout-steps", type=int, default=128)
    parser.add_argument("--precisions", default="32-true")
    parser.add_argument("--rounds", type=int, default=20, help="measured updates per lane")
    parser.add_argument("--warmup", type=int, default=3, help="updates per lane not measured")
    parser.add_argument("--seed", type=int, default=1)
    bl.add_common_args(parser)
    parser.set_defaults(threads=1)
    args = parser.parse_args()
    bl.apply_threads(args.threads)
    machine = bl.machine()
    rows = []
    for precision in args.precisions.split(","):
        m = measure(args.env, args.num_envs, args.rollout_steps, precision, args.rounds,
                    args.warmup, args.seed)
        rows.append([precision, f"{m['reference_sps']:,.0f}", f"{m['amptrain_sps']:,.0f}",
                     f"**{m['ratio']:.3f}**", m["spread"],
                     f"{m['control']:.3f} {m['control_spread']}",
                     _shares(m["reference_shares"]), _shares(m["amptrain_shares"]),
                     "ok" if m["ratio"] >= GOAL else "MISS"])
        print(" | ".join(map(str, rows[-1])), flush=True)
    table = bl.markdown_table(
        ["precision", "reference env steps/s", "amptrain env steps/s", "amptrain / reference",
         "spread", "A/A control", "reference: envs / acting / updates",
         "amptrain: envs / acting / updates", f">= {GOAL}"], rows)
    notes = [f"{args.env}, {args.num_envs} environments x {args.rollout_steps} steps per "
             f"update, CleanRL's recipe on both sides; amptrain's ppo task (a Trainer stepped "
             f"one update at a time) and two identical plain single-file loops "
             f"(benchmarks/ppo_reference.py) take turns update by update in a rotated order; "
             f"{args.rounds} measured updates each after {args.warmup} warm-up updates. "
             f"Env steps/s = transitions per update / median update time; ratio = median "
             f"over rounds of amptrain's speed / the two reference loops' mean, spread = "
             f"half its interquartile range; A/A control = reference / reference #2. Shares "
             f"of all updates' time (warm-up included): Gymnasium's vector step / the rest "
             f"of the rollout (acting; amptrain's GAE) / the updates (the reference's GAE)."]
    bl.report("PPO: amptrain vs a plain single-file loop", machine, table, notes,
              record=args.record)


if __name__ == "__main__":
    main()
