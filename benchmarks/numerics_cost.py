"""What ``--numerics`` costs: step time with the telemetry off, at its default (``auto``)
and every 4th step (``4``: what one sampled step costs), on the cnn and the gpt.

The three Trainers train the same model on the same data, taking one step each in turn
(off, auto, 4, off, auto, 4, ...), each step followed by the callbacks' step end (where
the telemetry attaches, reads and writes). The first ``--warmup`` rounds are not timed
(``auto`` samples step 10 then, after timing steps 2-9, and chooses its period).
Reported per variant: median and mean ms per step; for ``auto`` the period it chose
and the cost that period implies, (sampled - plain) / (period x plain); and the measured
mean step time of ``auto`` over ``off`` (unsampled steps should cost nothing).

    python benchmarks/numerics_cost.py [--steps 60] [--warmup 12] [--threads 2]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from typing import Any

import benchlib as bl
import torch

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


def measure(name: str, model: torch.nn.Module, data: TensorData, task: str, *,
            batch_size: int, precision: str, warmup: int, steps: int) -> dict[str, Any]:
    trainers: dict[str, Trainer] = {}
    outs = []
    for variant in VARIANTS:
        out = tempfile.TemporaryDirectory()
        outs.append(out)
        trainer = Trainer(precision=precision, batch_size=batch_size, epochs=1000,
                          log_every=1000, no_progress=True, device="cpu", numerics=variant,
                          task=task, logger="none", out=out.name, scheduler="none")
        trainer.setup(copy.deepcopy(model), data)
        trainer.reporter.emit(trainer, "on_fit_start")
        trainers[variant] = trainer
    windows = {v: bl._windows_forever(t) for v, t in trainers.items()}
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for step in range(warmup + steps):
        for variant, trainer in trainers.items():
            window = next(windows[variant])
            started = time.perf_counter()
            trainer.train_step(window)
            trainer.position.advance()
            trainer.reporter.emit(trainer, "on_step_end")  # the telemetry's step end
            if step >= warmup:
                times[variant].append(time.perf_counter() - started)
    schedule = trainers["auto"].callbacks[0].session.schedule
    plain = statistics.median(times["off"])
    # The steps "4" sampled (every 4th of the run's steps) against "off"'s same steps.
    sampled = statistics.median(t for i, t in enumerate(times["4"])
                                if (warmup + i + 1) % 4 == 0)
    period = schedule.period
    result = {
        "workload": name,
        "ms": {v: (statistics.median(t) * 1e3, statistics.mean(t) * 1e3)
               for v, t in times.items()},
        "sampled_ms": sampled * 1e3,
        "sampled_over_plain": sampled / plain,
        "auto_period": period,
        "auto_implied_cost": (sampled - plain) / (period * plain) if period else None,
        "auto_measured": statistics.mean(times["auto"]) / statistics.mean(times["off"]) - 1,
        "auto_sampled_steps": sorted({int(s) for s in _sampled(trainers["auto"])}),
    }
    for out in outs:
        out.cleanup()
    return result


def _sampled(trainer: Trainer) -> list[int]:
    return [r["step"] for r in trainer.callbacks[0].session.log.records]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=12)
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    machine = bl.machine_line(bl.machine())
    print(f"numerics cost, {args.precision}, {args.steps} timed steps after {args.warmup} "
          f"(interleaved off/auto/4; {torch.get_num_threads()} threads; {machine}):")
    for name, build, batch in (("cnn", _cnn, 64), ("gpt", _gpt, 16)):
        model, data, task = build()
        r = measure(name, model, data, task, batch_size=batch, precision=args.precision,
                    warmup=args.warmup, steps=args.steps)
        ms = "  ".join(f"{v}: {m:.1f} ms median / {a:.1f} mean" for v, (m, a) in r["ms"].items())
        print(f"  {name}: {ms}")
        implied = r["auto_implied_cost"]
        print(f"    a sampled step takes {r['sampled_ms']:.1f} ms, "
              f"{r['sampled_over_plain']:.2f}x a plain one; auto "
              f"chose every {r['auto_period']} steps (implied cost "
              f"{implied * 100 if implied is not None else float('nan'):.2f} %), sampled "
              f"steps {r['auto_sampled_steps']}; measured auto vs off: "
              f"{r['auto_measured'] * 100:+.1f} %")


if __name__ == "__main__":
    main()
