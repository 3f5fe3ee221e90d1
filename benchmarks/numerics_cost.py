"""What ``--numerics`` costs: step time with the telemetry off, at its default (``auto``)
and every 4th step (``4``: what one sampled step costs), on the cnn and the gpt.

The three Trainers train the same model on the same data, taking one step each in turn
(off, auto, 4, off, auto, 4, ...), each step followed by the callbacks' step end (where
the telemetry attaches, reads and writes). Each Trainer runs on its own clock, which
advances only while that Trainer steps: ``auto`` times its own plain and sampled steps
as it would alone, not the other two Trainers' steps between its own.

Timed from step 2 (step 1 warms up) for ``--steps`` steps, so ``auto``'s first sample
(step 10) and every later one are inside the window. Reported per workload: the median
plain step (off), what one sampled step costs (``4``'s sampled steps over ``off``'s same
steps), the period ``auto`` chose, and auto's cost two ways -- the extra time of its
sampled steps over its own median plain step, as a share of its whole run ("counted"),
and its mean paired difference to ``off`` per step ("paired", noisier).

    python benchmarks/numerics_cost.py [--steps 400] [--threads 1]
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import benchlib as bl
import torch

from amptrain.common import clock
from amptrain.data import TensorData
from amptrain.models import ModelInputs, build_model
from amptrain.trainer import Trainer, seed_everything

VARIANTS = ("off", "auto", "4")


def _gpt(seq_len: int = 64, samples: int = 512) -> tuple[torch.nn.Module, TensorData, str]:
    seed_everything(0)
    model = build_model("gpt:layers=2,width=128,heads=4",
                        ModelInputs(256, (seq_len,), "lm", vocab_size=256))
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (samples, seq_len + 1), generator=g)
    return model, TensorData(tokens[:, :-1].clone(), tokens[:, 1:].clone()), "lm"


def _cnn() -> tuple[torch.nn.Module, TensorData, str]:
    model, data = bl.CPU_WORKLOADS["cnn"].build()
    return model, data, "auto"


class OwnClock:
    """A clock that advances only inside :meth:`running`: one Trainer's time alone."""

    def __init__(self) -> None:
        self.spent = 0.0
        self.since: float | None = None

    def __call__(self) -> float:
        now = time.perf_counter()
        return self.spent + (now - self.since if self.since is not None else 0.0)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        self.since = time.perf_counter()
        try:
            with clock.use(self):
                yield
        finally:
            self.spent += time.perf_counter() - self.since
            self.since = None


def measure(name: str, model: torch.nn.Module, data: TensorData, task: str, *,
            batch_size: int, precision: str, steps: int) -> dict[str, Any]:
    trainers: dict[str, Trainer] = {}
    clocks = {variant: OwnClock() for variant in VARIANTS}
    outs = []
    for variant in VARIANTS:
        out = tempfile.TemporaryDirectory()
        outs.append(out)
        trainer = Trainer(precision=precision, batch_size=batch_size, epochs=1000,
                          log_every=1000, no_progress=True, device="cpu", numerics=variant,
                          task=task, logger="none", out=out.name, scheduler="none")
        trainer.setup(copy.deepcopy(model), data)
        with clocks[variant].running():
            trainer.reporter.emit(trainer, "on_fit_start")
        trainers[variant] = trainer
    windows = {v: bl._windows_forever(t) for v, t in trainers.items()}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for step in range(1, steps + 2):
        for variant, trainer in trainers.items():
            window = next(windows[variant])
            started = time.perf_counter()
            with clocks[variant].running():
                trainer.train_step(window)
                trainer.position.advance()
                trainer.reporter.emit(trainer, "on_step_end")  # the telemetry's step end
            if step >= 2:   # step 1 warms up
                times[variant].append(time.perf_counter() - started)
    schedule = trainers["auto"].callbacks[0].session.schedule
    plain = statistics.median(times["off"])
    first = 2
    # The steps "4" sampled (every 4th of the run's steps) against "off"'s same steps.
    sampled = statistics.median(t for i, t in enumerate(times["4"]) if (first + i) % 4 == 0)
    off_same = statistics.median(t for i, t in enumerate(times["off"]) if (first + i) % 4 == 0)
    auto_steps = sorted({int(s) for s in _sampled(trainers["auto"])})
    auto_plain = statistics.median(t for i, t in enumerate(times["auto"])
                                   if first + i not in auto_steps)
    counted = sum(times["auto"][s - first] - auto_plain for s in auto_steps if s >= first)
    result = {
        "workload": name,
        "ms": {v: (statistics.median(t) * 1e3, statistics.mean(t) * 1e3)
               for v, t in times.items()},
        "plain_ms": plain * 1e3,
        "sampled_ms": sampled * 1e3,
        "sampled_over_plain": sampled / off_same,
        "auto_period": schedule.period,
        "auto_sampled_steps": auto_steps,
        "auto_counted": counted / sum(times["auto"]),
        "auto_paired": statistics.mean(a - o for a, o in zip(times["auto"], times["off"]))
        / statistics.mean(times["off"]),
    }
    for out in outs:
        out.cleanup()
    return result


def _sampled(trainer: Trainer) -> list[int]:
    return [r["step"] for r in trainer.callbacks[0].session.log.records]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = bl.machine_line(bl.machine())
    print(f"numerics cost, {args.precision}, steps 2-{args.steps + 1} timed (interleaved "
          f"off/auto/4, each on its own clock; {torch.get_num_threads()} threads; {machine}):")
    for name, build, batch in (("cnn", _cnn, 64), ("gpt", _gpt, 16)):
        model, data, task = build()
        r = measure(name, model, data, task, batch_size=batch, precision=args.precision,
                    steps=args.steps)
        ms = "  ".join(f"{v}: {m:.1f} ms median / {a:.1f} mean" for v, (m, a) in r["ms"].items())
        print(f"  {name}: {ms}")
        print(f"    a sampled step takes {r['sampled_ms']:.1f} ms, "
              f"{r['sampled_over_plain']:.2f}x a plain one; auto chose every "
              f"{r['auto_period']} steps, sampled steps {r['auto_sampled_steps']}; auto's "
              f"cost: counted {r['auto_counted'] * 100:.2f} %, paired vs off "
              f"{r['auto_paired'] * 100:+.2f} %")


if __name__ == "__main__":
    main()
