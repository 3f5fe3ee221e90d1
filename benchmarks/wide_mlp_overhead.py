"""Trainer vs the plainest hand-written loop on a compute-light wide MLP (issue 18, part 3).

The model: three Linear layers of width 2048 with GELU (4.3 M parameters) on sklearn's
8x8 digits, batch 512, AdamW. It is also reachable from the CLI as
``PYTHONPATH=benchmarks amptrain train --model module:wide_mlp_overhead.wide_mlp --data digits
--batch-size 512``.

The hand-written loop is what a user would write first: ``torch.optim.AdamW`` with its
defaults (foreach, not fused), ``torch.autocast`` (a GradScaler for fp16), random indices
into the in-memory tensors, no schedule, no logging, no checks. The Trainer runs its real
loop (``Trainer.run``) as built from its defaults: fused AdamW, cosine schedule, the
per-step inf/NaN check, metrics read every ``--log-every`` (10) steps, the step-start
snapshot, its own shuffled windows (an epoch of digits is 512 + 512 + 413 samples). No
validation data and no output directory: the hand loop neither evaluates nor saves, and
what epoch-end evaluation and checkpoints cost the CLI is measured separately
(``--cli-lane``).

Two measurements per precision, each in one process with the loops interleaved (a
second, identical hand-written loop is the A/A control):

* end-to-end: ``benchlib.Relay`` alternates the loops after every step, in a random
  order per round, and times everything between two batches (data path, forward,
  backward, optimizer, schedule, logging, bookkeeping). A round is ``--log-every`` steps
  of each loop; samples/s per round uses the samples each loop really trained.
* step-only: ``train_step`` + ``finish_step`` on a ready window against the hand loop's
  step on a ready batch, alternating in a random order; no data path, no logging.

Ratios are Trainer / hand samples/s per round (> 1: the Trainer is faster); the table
gives their median, the interquartile half-spread and the A/A control's median.

    python benchmarks/wide_mlp_overhead.py [--precisions 32-true,bf16-mixed,16-mixed]
        [--rounds 12] [--threads 1] [--cli-lane] [--record]
"""
from __future__ import annotations

import argparse
import io
import itertools
import math
import random
import tempfile
import time
from typing import Any, Callable, Iterable, Iterator

import benchlib as bl
import torch
from torch import nn
from torch.nn import functional as F

from amptrain.data import DataOptions, TensorData, build_data
from amptrain.trainer import Trainer

WIDTH, BATCH = 2048, 512


def wide_mlp(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    """Flatten, Linear(in, 2048), GELU, Linear(2048, 2048), GELU, Linear(2048, classes)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), WIDTH), nn.GELU(),
                         nn.Linear(WIDTH, WIDTH), nn.GELU(), nn.Linear(WIDTH, num_classes))


class PlainLoop:
    """The hand-written loop: default AdamW, autocast, random indices, nothing else."""

    def __init__(self, model: nn.Module, data: TensorData, precision: str,
                 total_steps: int, seed: int = 0) -> None:
        self.model = model.train()
        self.dtype = bl.AUTOCAST_DTYPE[precision]
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        self.scaler = torch.amp.GradScaler("cpu", enabled=self.dtype is torch.float16)
        self.x, self.y = data.tensors
        self.total_steps = total_steps
        self.generator = torch.Generator().manual_seed(seed)

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.randint(0, len(self.x), (BATCH,), generator=self.generator)
        return self.x[index], self.y[index]

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.autocast("cpu", dtype=self.dtype or torch.bfloat16,
                            enabled=self.dtype is not None):
            loss = F.cross_entropy(self.model(x), y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    def run(self, feed: Callable[[Iterable[Any]], Iterable[Any]] = iter) -> None:
        batches = (self.batch() for _ in range(self.total_steps))
        for x, y in feed(batches):
            self.step(x, y)


def make_trainer(model: nn.Module, data: Any, precision: str, total_steps: int,
                 val: Any = None, out: str | None = None) -> Trainer:
    """A Trainer with the CLI's defaults (fused AdamW, cosine, --log-every 10)."""
    trainer = Trainer(precision=precision, batch_size=BATCH, epochs=10 ** 6,
                      max_steps=total_steps, device="cpu", no_progress=True, out=out)
    trainer.setup(model, data, val)
    trainer.logger.stream = io.StringIO()  # its lines, not the terminal's
    return trainer


class TrainerRun:
    """``Trainer.run`` with its windows passed through the relay's ``feed``."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def run(self, feed: Callable[[Iterable[Any]], Iterable[Any]] = iter) -> None:
        t = self.trainer
        inner = t.train_windows
        t.train_windows = bl._FedWindows(inner, feed)
        try:
            t.run()
        finally:
            t.train_windows = inner


def end_to_end(precision: str, data: Any, val: Any, rounds: int, warmup: int,
               log_every: int, cli_lane: bool) -> dict[str, list[float]]:
    """Samples/s per round of each loop (Relay, one step per turn)."""
    total = (warmup + rounds) * log_every + 1
    model = build(data)
    loops: dict[str, Any] = {
        "trainer": TrainerRun(make_trainer(bl.fresh_copy(model), data, precision, total)),
        "hand": PlainLoop(bl.fresh_copy(model), data, precision, total),
        "hand2": PlainLoop(bl.fresh_copy(model), data, precision, total)}
    tmp = tempfile.TemporaryDirectory() if cli_lane else None
    if tmp is not None:  # what `amptrain train` adds: evaluation and a checkpoint per epoch
        loops["cli"] = TrainerRun(make_trainer(bl.fresh_copy(model), data, precision, total,
                                               val=val, out=tmp.name))
    samples: dict[str, list[int]] = {name: [] for name in loops}
    relay = bl.Relay(list(loops), 1, torch.device("cpu"))

    def counted(name: str, items: Iterable[Any]) -> Iterator[Any]:
        for item in relay.feed(name, items):
            samples[name].append(getattr(item, "global_samples", BATCH))
            yield item

    def runner(name: str, loop: Any) -> Callable[[], None]:
        return lambda: loop.run(lambda items: counted(name, items))

    try:
        times = relay.run({name: runner(name, loop) for name, loop in loops.items()})
    finally:
        if tmp is not None:
            tmp.cleanup()
    speed = {}
    for name, turns in times.items():
        groups = range(0, len(turns) - log_every + 1, log_every)
        speed[name] = [sum(samples[name][i:i + log_every]) / sum(turns[i:i + log_every])
                       for i in groups][warmup:]
    return speed


def step_only(precision: str, data: Any, rounds: int, warmup: int,
              log_every: int) -> dict[str, list[float]]:
    """Samples/s per round of ``log_every`` bare steps (ready batches), interleaved."""
    total = (warmup + rounds) * log_every + 2
    model = build(data)
    trainer = make_trainer(bl.fresh_copy(model), data, precision, total)
    windows = itertools.cycle([w for w in itertools.islice(trainer.train_windows.epoch(0), 2)])
    hands = {"hand": PlainLoop(bl.fresh_copy(model), data, precision, total),
             "hand2": PlainLoop(bl.fresh_copy(model), data, precision, total)}
    batches = {name: [h.batch() for _ in range(2)] for name, h in hands.items()}

    def trainer_step(i: int) -> int:
        window = next(windows)
        trainer.train_step(window)
        trainer.finish_step()
        return window.global_samples

    def hand_step(name: str) -> Callable[[int], int]:
        def run(i: int) -> int:
            hands[name].step(*batches[name][i % 2])
            return BATCH
        return run

    steps: dict[str, Callable[[int], int]] = {"trainer": trainer_step,
                                              "hand": hand_step("hand"),
                                              "hand2": hand_step("hand2")}
    clock = bl.default_clock(torch.device("cpu"))
    rng = random.Random(0)
    totals = {name: [0.0, 0.0] for name in steps}  # seconds, samples
    speed: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(warmup + rounds):
        for i in range(log_every):
            order = list(steps)
            rng.shuffle(order)
            for name in order:
                started = clock()
                n = steps[name](i)
                totals[name][0] += clock() - started
                totals[name][1] += n
        for name, (seconds, n) in totals.items():
            if r >= warmup:
                speed[name].append(n / seconds)
            totals[name] = [0.0, 0.0]
    return speed


def build(data: TensorData) -> nn.Module:
    torch.manual_seed(0)
    return wide_mlp(10, tuple(data.tensors[0].shape[1:]))


def summary(speed: dict[str, list[float]], lane: str) -> tuple[float, str, float]:
    """(median ratio lane / hand, its spread, A/A control median)."""
    hand = [(a + b) / 2 for a, b in zip(speed["hand"], speed["hand2"])]
    ratios = [t / h for t, h in zip(speed[lane], hand)]
    return (bl.median(ratios), bl.spread(ratios),
            bl.median(bl.pair_ratios(speed["hand2"], speed["hand"])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", default="32-true,bf16-mixed,16-mixed")
    parser.add_argument("--rounds", type=int, default=12, help="measured rounds per lane")
    parser.add_argument("--warmup", type=int, default=2, help="rounds not measured")
    parser.add_argument("--log-every", type=int, default=10,
                        help="the Trainer's --log-every (its default); also the round length")
    parser.add_argument("--cli-lane", action="store_true",
                        help="also time a Trainer with validation data and an output "
                             "directory (evaluation and a checkpoint every epoch, as "
                             "`amptrain train` does)")
    bl.add_common_args(parser)
    args = parser.parse_args()
    bl.apply_threads(args.threads)
    machine = bl.machine()
    bundle = build_data("digits", DataOptions(seed=0))
    rows = []
    for precision in args.precisions.split(","):
        started = time.perf_counter()
        e2e = end_to_end(precision, bundle.train, bundle.val, args.rounds, args.warmup,
                         args.log_every, args.cli_lane)
        steps = step_only(precision, bundle.train, args.rounds, args.warmup, args.log_every)
        ratio, spread, control = summary(e2e, "trainer")
        s_ratio, s_spread, s_control = summary(steps, "trainer")
        cli = f"{summary(e2e, 'cli')[0]:.3f}" if "cli" in e2e else "-"
        rows.append([precision, f"{bl.median(e2e['hand']):.0f}",
                     f"{bl.median(e2e['trainer']):.0f}", f"**{ratio:.3f}** ({spread})",
                     f"{control:.3f}", f"**{s_ratio:.3f}** ({s_spread})", f"{s_control:.3f}",
                     cli, "ok" if ratio >= 0.98 and s_ratio >= 0.98 else "MISS"])
        print(" | ".join(map(str, rows[-1])), f"({time.perf_counter() - started:.0f} s)",
              flush=True)
    table = bl.markdown_table(
        ["precision", "hand samples/s", "Trainer samples/s", "end-to-end Trainer / hand",
         "A/A", "step-only Trainer / hand", "A/A (step)", "CLI-like / hand", ">= 0.98"], rows)
    notes = [f"Wide MLP 64-{WIDTH}-{WIDTH}-10 with GELU (4.3 M parameters) on digits "
             f"(1437 training images of 1x8x8), batch {BATCH}. Hand-written: default "
             f"torch.optim.AdamW (foreach), autocast, random indices, nothing else. Trainer: "
             f"its defaults (fused AdamW, cosine, inf/NaN check, --log-every "
             f"{args.log_every}), no validation data, no --out.",
             f"Ratios: Trainer / hand samples/s per round of {args.log_every} steps (> 1: "
             f"the Trainer is faster), median over {args.rounds} rounds after "
             f"{args.warmup} warm-up rounds, (+-half the interquartile range); loops "
             f"alternate after every step in a random order, timed by "
             f"{bl.clock_name(torch.device('cpu'))}. A/A: hand-written #2 / #1. CLI-like: "
             f"a Trainer that also evaluates and saves a checkpoint at every epoch end (3 "
             f"steps here), as `amptrain train` does (--cli-lane)."]
    bl.report("Trainer vs plain loop: wide MLP", machine, table, notes, record=args.record)


if __name__ == "__main__":
    main()
