"""Trainer vs a hand-written torch.amp loop with the same maths: step-time ratio per precision.

Both train a copy of the same model on the same in-memory data (kept on the device,
reshuffled every epoch), with fused AdamW, a cosine schedule, no accumulation and no
clipping, and read loss, lr, loss scale and gradient norm every ``--log-every`` steps.
The Trainer goes through its real loop (``Trainer.run``); the hand-written loop is
:class:`benchlib.RawLoop`. The loops run in one process and alternate after every step
on a CPU (in turns of ``--log-every`` steps on a GPU; see :class:`benchlib.Relay`); a
round is ``--log-every`` steps of each, ``--warmup`` rounds are excluded and the ratio is
the median of the per-round ratios. A second hand-written loop gives an
A/A control: how far apart two identical loops measure. Target: Trainer / hand-written
<= 1.02.

What the Trainer does that the plain recipe does not: in 32-true and bf16-mixed it
checks the gradients for inf/NaN every step (one read of all gradients, so a non-finite
step is skipped instead of reaching the weights). For a model with many parameters and
little compute per parameter (the MLP) that read is a few percent of the step.

16-mixed on a CPU: PyTorch's own fp16 convolution backward is ~100x slower than fp32 on
CPUs without AMX-FP16, and amptrain replaces it (fp16 forward, fp32 backward rounded to
fp16). The hand-written loop uses the same replacement, so the ratio compares the loops,
not two different convolution kernels.

    python benchmarks/trainer_vs_raw.py [--models mlp,cnn,transformer] \
        [--precisions 32-true,bf16-mixed,16-mixed] [--rounds 15] [--threads 1] [--record]
"""
from __future__ import annotations

import argparse

import benchlib as bl
import torch


def measure(workload: bl.Workload, precision: str, rounds: int, warmup: int, log_every: int,
            device: torch.device, check_lane: bool = False) -> dict:
    model, data = workload.build()
    # Each timed unit is log_every steps of every loop: exactly one log step each.
    block, group = bl.turn_plan(device, log_every)
    total = (warmup + rounds) * log_every + 1
    common = dict(precision=precision, batch_size=workload.batch_size, total_steps=total,
                  device=device, log_every=log_every)
    loops = {"trainer": bl.TrainerLoop(bl.fresh_copy(model), data, **common),
             "raw": bl.RawLoop(bl.fresh_copy(model), data, **common),
             # A second, identical hand-written loop: raw2 / raw is the measurement's own
             # noise (an A/A control), printed next to each ratio.
             "raw2": bl.RawLoop(bl.fresh_copy(model), data, **common)}
    if check_lane:  # what the Trainer costs without its per-step gradient check
        loops["unchecked"] = bl.TrainerLoop(bl.fresh_copy(model), data, **common)
        bl.without_gradient_check(loops["unchecked"].trainer)
    times = {k: v[warmup:] for k, v in bl.relay(loops, block, device, group).items()}
    ratios = [t / ((a + b) / 2) for t, a, b in zip(times["trainer"], times["raw"], times["raw2"])]
    control = bl.pair_ratios(times["raw2"], times["raw"])
    raw = [(a + b) / 2 for a, b in zip(times["raw"], times["raw2"])]
    unchecked = [t / ((a + b) / 2) for t, a, b in
                 zip(times.get("unchecked", []), times["raw"], times["raw2"])]
    return {"model": workload.name, "precision": precision,
            "unchecked": bl.median(unchecked) if unchecked else None,
            "raw_ms": bl.median(raw) / log_every * 1e3,
            "trainer_ms": bl.median(times["trainer"]) / log_every * 1e3,
            "ratio": bl.median(ratios), "spread": bl.spread(ratios),
            "control": bl.median(control)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn,transformer",
                        help=f"comma-separated, from {', '.join(bl.CPU_WORKLOADS)}")
    parser.add_argument("--precisions", default="32-true,bf16-mixed,16-mixed")
    parser.add_argument("--rounds", type=int, default=15,
                        help="measured rounds of --log-every steps per loop and repeat")
    parser.add_argument("--warmup", type=int, default=2, help="rounds not measured")
    parser.add_argument("--repeats", type=int, default=3,
                        help="independent repeats (fresh models, optimizers and memory)")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--check-lane", action="store_true",
                        help="also time a Trainer without the per-step inf/NaN check of the "
                             "gradients (32-true, bf16-mixed), to show what that check costs")
    parser.add_argument("--device", default="cpu")
    bl.add_common_args(parser)
    args = parser.parse_args()
    bl.apply_threads(args.threads)
    device = torch.device(args.device)
    machine = bl.machine()
    rows = []
    for name in args.models.split(","):
        workload = bl.CPU_WORKLOADS[name]
        for precision in args.precisions.split(","):
            check_lane = args.check_lane and precision in ("32-true", "bf16-mixed")
            runs = [measure(workload, precision, args.rounds, args.warmup, args.log_every, device,
                            check_lane) for _ in range(args.repeats)]
            unchecked = [r["unchecked"] for r in runs if r["unchecked"] is not None]
            ratio = bl.median([r["ratio"] for r in runs])
            verdict = "ok" if ratio <= 1.02 else "MISS"
            rows.append([workload.name, precision,
                         f"{bl.median([r['raw_ms'] for r in runs]):.2f}",
                         f"{bl.median([r['trainer_ms'] for r in runs]):.2f}",
                         f"**{ratio:.3f}**", bl.span([r["ratio"] for r in runs]),
                         bl.span([r["control"] for r in runs]),
                         f"{bl.median(unchecked):.3f}" if unchecked else "-", verdict])
            print(" | ".join(map(str, rows[-1])), flush=True)
    table = bl.markdown_table(["model", "precision", "hand-written ms/step", "Trainer ms/step",
                               "Trainer / hand-written", "repeats", "A/A control",
                               "without grad check", "<= 1.02"],
                              rows)
    turns = _turns(device, args.log_every)
    notes = ["Workloads: " + "; ".join(f"{bl.CPU_WORKLOADS[n].name} = "
                                        f"{bl.CPU_WORKLOADS[n].note}, batch "
                                        f"{bl.CPU_WORKLOADS[n].batch_size}"
                                        for n in args.models.split(",")) + ".",
             f"The Trainer and two identical hand-written loops alternate ({turns}, in a "
             f"random order every round), timed by {bl.clock_name(device)}; a round is "
             f"{args.log_every} steps of each loop (one log step each); {args.rounds} "
             f"measured rounds after {args.warmup} warm-up rounds; {args.repeats} repeats "
             f"with fresh models and optimizers. Ratio = median over repeats of the median "
             f"over rounds of Trainer / mean of the two hand-written loops ('repeats' lists "
             f"each repeat's ratio). "
             f"A/A control = hand-written #2 / #1 per repeat: the resolution of the "
             f"measurement. 'without grad check': the same ratio for a Trainer whose "
             f"per-step inf/NaN check of the gradients is switched off (--check-lane; for "
             f"measuring only, not an option of amptrain)."]
    bl.report("Trainer vs hand-written loop", machine, table, notes, record=args.record)


def _turns(device: torch.device, log_every: int) -> str:
    block, _ = bl.turn_plan(device, log_every)
    return "after every step" if block == 1 else f"in turns of {block} steps"


if __name__ == "__main__":
    main()
