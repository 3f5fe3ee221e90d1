"""What checkpoints cost a run: saving every 5 steps vs saving once (issue 26, part 2).

The model: an MLP 512-2048x5-10 with GELU (17.8 M parameters; a checkpoint of weights
and AdamW moments is 214 MB), batch 64, AdamW, on random features; one epoch of
``--steps`` steps, no validation, an output directory. Three lanes, each a fresh Trainer
running ``Trainer.run`` (set-up not timed). The ratio that counts is the wall clock's (the
write runs on another thread, which the training thread's CPU time would not see); the
training thread's CPU time and the process's CPU time are shown beside it, since on a
machine without an idle core the writer's CPU work is paid for in wall time whichever
thread does it:

* once: no ``--save-every``: the one checkpoint at the end of the run;
* every-5: ``--save-every 5``: the loop's saves go to the background writer, which copies
  the optimizer's parameters and state on its own thread (the next ``step()`` waits for
  that copy) and writes without zip CRC-32s;
* every-5-eager: the same, but the whole state copied on the training thread before the
  save returns (the writer as it was before the deferred copy), which shows what the
  deferred copy takes off the loop;
* every-5-blocking: the same saves written on the training thread (as before the
  background writer), the control that shows what the background takes off the loop.

Each round runs the lanes in a fresh random order; the table gives the median over
rounds of every-5 / once (wall time, same round) and its interquartile half-spread.

    python benchmarks/checkpoint_stall.py [--rounds 5] [--steps 30] [--threads 1]
        [--lanes once,every-5,...] [--dir /tmp] [--record]

The runs' output directories go to ``--dir`` (default: the system's temporary directory);
it must be on the disk whose speed you want in the numbers, not a RAM disk.
"""
from __future__ import annotations

import argparse
import io
import random
import tempfile
import time
from typing import Any

import benchlib as bl
import torch
from torch import nn
from torch.utils.data import TensorDataset

from amptrain.trainer import Trainer

WIDTH, DEPTH, FEATURES, CLASSES, BATCH = 2048, 5, 512, 10, 64


def model() -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(FEATURES, WIDTH), nn.GELU()]
    for _ in range(DEPTH - 1):
        layers += [nn.Linear(WIDTH, WIDTH), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, CLASSES))


class BlockingSaves(Trainer):
    """The loop's saves written on the training thread (the behaviour before)."""

    def _save(self, path: Any = None, *, background: bool) -> Any:
        return super()._save(path, background=False)


class EagerCopy(Trainer):
    """Background saves whose whole state is copied on the training thread (no deferred
    copy of the optimizer's parameters and state)."""

    def setup(self, *args: Any, **kwargs: Any) -> None:
        super().setup(*args, **kwargs)  # the checkpointer is one of the parts set up
        writes = self.checkpointer.writes
        submit = writes.submit

        def eager(state: Any, write: Any, directory: Any, defer: Any = ()) -> None:
            submit(state, write, directory)

        writes.submit = eager  # type: ignore[method-assign]


LANES: dict[str, tuple[type[Trainer], int | None]] = {
    "once": (Trainer, None), "every-5": (Trainer, 5), "every-5-eager": (EagerCopy, 5),
    "every-5-blocking": (BlockingSaves, 5)}


def run_lane(lane: str, data: TensorDataset, steps: int,
             directory: str | None = None) -> tuple[float, float, float]:
    """Wall, training-thread CPU and process CPU seconds of ``Trainer.run`` for one fresh
    run of ``lane``."""
    cls, save_every = LANES[lane]
    with tempfile.TemporaryDirectory(dir=directory) as out:
        trainer = cls(precision="32-true", batch_size=BATCH, epochs=1, max_steps=steps,
                      device="cpu", no_progress=True, out=f"{out}/run", save_every=save_every,
                      scheduler="none")
        trainer.setup(model(), data)
        trainer.logger.stream = io.StringIO()
        started = time.perf_counter(), time.thread_time(), time.process_time()
        trainer.run()
        ended = time.perf_counter(), time.thread_time(), time.process_time()
        wall, thread, process = (b - a for a, b in zip(started, ended))
        return wall, thread, process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds")
    parser.add_argument("--warmup", type=int, default=1, help="rounds not measured")
    parser.add_argument("--steps", type=int, default=30, help="steps per run")
    parser.add_argument("--lanes", default=",".join(LANES),
                        help=f"comma-separated lanes of {', '.join(LANES)} ('once' always runs)")
    parser.add_argument("--dir", default=None,
                        help="where the runs write (default: the system's temporary directory)")
    bl.add_common_args(parser)
    args = parser.parse_args()
    bl.apply_threads(args.threads)
    machine = bl.machine()
    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(BATCH * args.steps, FEATURES, generator=generator),
                         torch.randint(0, CLASSES, (BATCH * args.steps,), generator=generator))
    parameters = sum(p.numel() for p in model().parameters())
    rng = random.Random(0)
    lanes = ["once"] + [lane for lane in args.lanes.split(",") if lane in LANES and lane != "once"]
    unknown = [lane for lane in args.lanes.split(",") if lane not in LANES]
    if unknown:
        parser.error(f"unknown lane {unknown[0]!r} (lanes: {', '.join(LANES)})")
    times: dict[str, list[float]] = {lane: [] for lane in lanes}
    thread_cpu: dict[str, list[float]] = {lane: [] for lane in lanes}
    process_cpu: dict[str, list[float]] = {lane: [] for lane in lanes}
    for r in range(args.warmup + args.rounds):
        order = list(lanes)
        rng.shuffle(order)
        for lane in order:
            wall, thread, process = run_lane(lane, data, args.steps, args.dir)
            if r >= args.warmup:
                times[lane].append(wall)
                thread_cpu[lane].append(thread)
                process_cpu[lane].append(process)
        print(f"round {r + 1}: " + ", ".join(f"{lane} {times[lane][-1]:.2f} s"
                                             for lane in lanes if times[lane]
                                             and r >= args.warmup), flush=True)
    rows = []
    for lane in lanes:
        ratios = bl.pair_ratios(times[lane], times["once"])
        thread = bl.median(bl.pair_ratios(thread_cpu[lane], thread_cpu["once"]))
        process = bl.median(bl.pair_ratios(process_cpu[lane], process_cpu["once"]))
        rows.append([lane, f"{bl.median(times[lane]):.2f}", bl.spread(times[lane]),
                     f"**{bl.median(ratios):.3f}** ({bl.spread(ratios)})", bl.span(ratios),
                     f"{thread:.3f}", f"{process:.3f}",
                     "-" if lane == "once" else "ok" if bl.median(ratios) <= 1.1 else "MISS"])
    table = bl.markdown_table(["lane", "median wall s per run", "spread", "wall / once",
                               "per round", "training-thread CPU / once",
                               "process CPU / once", "<= 1.1"], rows)
    notes = [f"MLP {FEATURES}-{WIDTH}x{DEPTH}-{CLASSES} with GELU ({parameters / 1e6:.1f} M "
             f"parameters; checkpoint of weights and AdamW moments "
             f"{parameters * 12 / 1e6:.0f} MB), batch {BATCH}, {args.steps} steps per run, "
             f"32-true, no validation. Wall time of Trainer.run; median over {args.rounds} "
             f"rounds after {args.warmup} warm-up, lanes in a random order each round; "
             f"ratio per round against the same round's 'once' run. every-5-eager: background "
             f"saves with the whole state copied on the training thread (before the deferred "
             f"copy); every-5-blocking: the same saves written on the training thread (before "
             f"the background writer)."]
    bl.report("Checkpoint stall: saving every 5 steps vs once", machine, table, notes,
              record=args.record)


if __name__ == "__main__":
    main()
