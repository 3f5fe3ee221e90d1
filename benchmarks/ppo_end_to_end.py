"""A whole PPO run, start to finish: ``amptrain train`` against a plain single-file loop.

Issue 47 item 2: ``amptrain train --data gym:CartPole-v1 --env-steps N`` (start-up, the
run's evaluations, its logs, metrics and checkpoints included) against
``benchmarks/ppo_reference.py`` doing the same work: the same environments (4 x 128 steps
per rollout, CleanRL's discrete recipe), the same number of updates, the same evaluations
(``--eval-episodes`` deterministic episodes, 20 evaluations plus a final one at amptrain's
cadence). Each is a fresh process with one intra-op thread, timed by the CPU time it
used (user + system, from the operating system's accounting of the finished child: a
shared machine's other work stretches wall clock 2x, CPU time far less); the two take
turns (in a random order each round) so drift of a shared machine hits both alike.
Ratio = plain time / amptrain time (amptrain's speed relative to the plain loop; goal
>= 0.95), the median over rounds, with the per-round values. A second plain
run per round gives the A/A control: how far apart two identical loops measure.

    python benchmarks/ppo_end_to_end.py [--env-steps 100000] [--rounds 3] [--record]
"""
from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib as bl

HERE = Path(__file__).resolve().parent


def _cpu_of_children() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one run of ``command``."""
    cpu, started = _cpu_of_children(), time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - started, _cpu_of_children() - cpu
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return cpu, wall


def commands(env_id: str, env_steps: int, episodes: int, seed: int, out: Path
             ) -> dict[str, list[str]]:
    """The lanes' command lines (``plain #2`` is the A/A control)."""
    amptrain = [sys.executable, "-m", "amptrain", "train", "--data", f"gym:{env_id}",
                "--env-steps", str(env_steps), "--eval-episodes", str(episodes),
                "--seed", str(seed), "--out", str(out), "--no-progress"]
    plain = [sys.executable, str(HERE / "ppo_reference.py"), "--env", env_id,
             "--env-steps", str(env_steps), "--evaluations", "20",
             "--eval-episodes", str(episodes), "--seed", str(seed), "--threads", "1"]
    return {"amptrain": amptrain, "plain": plain, "plain #2": plain}


def measure(env_id: str, env_steps: int, episodes: int, rounds: int, seed: int
            ) -> dict[str, list[float]]:
    """CPU seconds per whole run of each lane, ``rounds`` times, in turns."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    times: dict[str, list[float]] = {"amptrain": [], "plain": [], "plain #2": []}
    order = random.Random(seed)
    with tempfile.TemporaryDirectory() as scratch:
        for r in range(rounds):
            lanes = commands(env_id, env_steps, episodes, seed, Path(scratch) / f"run{r}")
            names = list(lanes)
            order.shuffle(names)
            for name in names:
                cpu, wall = _timed(lanes[name], env)
                times[name].append(cpu)
                print(f"round {r + 1}: {name} {cpu:.1f} CPU s ({wall:.1f} s wall)", flush=True)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--env-steps", type=int, default=100_000)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--record", action="store_true",
                        help="append the result table to benchmarks/RESULTS.md")
    args = parser.parse_args()
    m = bl.machine()
    times = measure(args.env, args.env_steps, args.eval_episodes, args.rounds, args.seed)
    plain = [(a + b) / 2 for a, b in zip(times["plain"], times["plain #2"])]
    ratios = [p / a for p, a in zip(plain, times["amptrain"])]
    control = [b / a for a, b in zip(times["plain"], times["plain #2"])]
    ratio = bl.median(ratios)
    table = bl.markdown_table(
        ["env", "env steps", "plain CPU s/run", "amptrain CPU s/run", "amptrain / plain (speed)",
         "rounds", "A/A control", ">= 0.95"],
        [[args.env, args.env_steps, f"{bl.median(plain):.1f}",
          f"{bl.median(times['amptrain']):.1f}", f"**{ratio:.3f}**", bl.span(ratios),
          bl.span(control), "ok" if ratio >= 0.95 else "MISS"]])
    bl.report("PPO end to end: amptrain train vs a plain single-file loop", m, table,
              [f"Whole runs (start-up, {args.eval_episodes}-episode evaluations x 20 + the "
               f"final one, logs, checkpoints), each a fresh process on one thread, in turns "
               f"in a random order per round; CPU time (user + system) of each process. "
               f"Ratio = plain seconds / amptrain seconds, median over {args.rounds} "
               f"rounds. A/A control = plain #2 / plain."],
              record=args.record)


if __name__ == "__main__":
    main()
