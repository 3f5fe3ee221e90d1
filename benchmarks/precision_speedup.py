"""Speedup of each precision over 32-true on this machine, through the Trainer and in a
hand-written loop, for the CNN (NCHW and channels_last) and transformers.

For each model, every combination of loop (amptrain Trainer, hand-written
:class:`benchlib.RawLoop`), precision and memory format trains its own copy of the same
model on the same data, all in one process, alternating after every step (see
:class:`benchlib.Relay`); a round is ``--block`` steps of each. Speedup = median over
rounds of (32-true NCHW time of the same loop) / (this variant's time). Targets on a CPU
with AMX: bf16-mixed >= 2.0x for the CNN, >= 3x with channels_last, >= 1.6x for the
transformer.

16-mixed on a CPU without AMX-FP16 (this one): PyTorch's fp16 convolution backward runs
~100x slower than fp32 there; the Trainer replaces it (fp16 forward, fp32 backward rounded
to fp16), and the hand-written loop here uses the same replacement. ``--plain-fp16``
also times one step of the hand-written loop with plain fp16 autocast, for scale.

    python benchmarks/precision_speedup.py [--models cnn,transformer,transformer-base] \
        [--rounds 6] [--threads 1] [--record]
"""
from __future__ import annotations

import argparse

import benchlib as bl
import torch

PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
TARGETS = {("cnn", "bf16-mixed", False): 2.0, ("cnn", "bf16-mixed", True): 3.0,
           ("cnn-wide", "bf16-mixed", False): 2.0, ("cnn-wide", "bf16-mixed", True): 3.0,
           ("transformer", "bf16-mixed", False): 1.6,
           ("transformer-base", "bf16-mixed", False): 1.6,
           ("transformer-nodrop", "bf16-mixed", False): 1.6,
           ("transformer-base-nodrop", "bf16-mixed", False): 1.6}


def measure(workload: bl.Workload, precisions: list[str], rounds: int, warmup: int, block: int,
            device: torch.device) -> list[dict]:
    model, data = workload.build()
    layouts = (False, True) if workload.name.startswith("cnn") else (False,)
    total = (warmup + rounds) * block + 1
    loops = {}
    for kind in ("trainer", "raw"):
        for precision in precisions:
            for channels_last in layouts:
                common = dict(precision=precision, batch_size=workload.batch_size,
                              total_steps=total, device=device, log_every=block,
                              channels_last=channels_last)
                cls = bl.TrainerLoop if kind == "trainer" else bl.RawLoop
                loops[(kind, precision, channels_last)] = cls(bl.fresh_copy(model), data, **common)
    turn, group = bl.turn_plan(device, block)
    times = {k: v[warmup:] for k, v in bl.relay(loops, turn, device, group).items()}
    rows = []
    for precision in precisions:
        for channels_last in layouts:
            row = {"model": workload.name, "precision": precision, "channels_last": channels_last}
            for kind in ("trainer", "raw"):
                t = times[(kind, precision, channels_last)]
                base = times[(kind, "32-true", False)]
                row[f"{kind}_ms"] = bl.median(t) / block * 1e3
                row[f"{kind}_speedup"] = bl.median(bl.pair_ratios(base, t))
            row["ratio"] = bl.median(bl.pair_ratios(times[("trainer", precision, channels_last)],
                                                    times[("raw", precision, channels_last)]))
            rows.append(row)
    return rows


def plain_fp16_step(workload: bl.Workload, device: torch.device) -> tuple[float, float]:
    """Seconds for one hand-written 16-mixed step with and without amptrain's conv fix."""
    model, data = workload.build()
    result = []
    for fix in (True, False):
        loop = bl.RawLoop(bl.fresh_copy(model), data, precision="16-mixed",
                          batch_size=workload.batch_size, total_steps=2, device=device,
                          fp16_conv_fix=fix)
        batches = loop.batches()
        loop.train_step(*next(batches))  # warm-up
        clock = bl.default_clock(device)
        started = clock()
        loop.train_step(*next(batches))
        result.append(clock() - started)
    return result[0], result[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="cnn,transformer,transformer-base",
                        help=f"comma-separated, from {', '.join(bl.CPU_WORKLOADS)}")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--rounds", type=int, default=6, help="measured turns per variant")
    parser.add_argument("--warmup", type=int, default=1, help="turns per variant not measured")
    parser.add_argument("--block", type=int, default=5,
                        help="steps of each variant per round (and the log interval)")
    parser.add_argument("--plain-fp16", action="store_true",
                        help="also time one CNN step with plain fp16 autocast (~30 s here)")
    parser.add_argument("--device", default="cpu")
    bl.add_common_args(parser)
    args = parser.parse_args()
    bl.apply_threads(args.threads)
    device = torch.device(args.device)
    precisions = args.precisions.split(",")
    if "32-true" not in precisions:
        precisions.insert(0, "32-true")
    machine = bl.machine()
    table_rows = []
    for name in args.models.split(","):
        workload = bl.CPU_WORKLOADS[name]
        for r in measure(workload, precisions, args.rounds, args.warmup, args.block, device):
            target = TARGETS.get((r["model"], r["precision"], r["channels_last"]))
            verdict = "-" if target is None else \
                (f">= {target:g}x ok" if r["trainer_speedup"] >= target else f">= {target:g}x MISS")
            layout = "channels_last" if r["channels_last"] else \
                ("NCHW" if name.startswith("cnn") else "-")
            table_rows.append([r["model"], r["precision"], layout, f"{r['trainer_ms']:.1f}",
                               f"**{r['trainer_speedup']:.2f}x**", f"{r['raw_ms']:.1f}",
                               f"{r['raw_speedup']:.2f}x", f"{r['ratio']:.3f}", verdict])
            print(" | ".join(table_rows[-1]), flush=True)
    table = bl.markdown_table(["model", "precision", "layout", "Trainer ms/step",
                               "Trainer speedup", "hand-written ms/step",
                               "hand-written speedup", "Trainer / hand-written", "target"],
                              table_rows)
    notes = ["Workloads: " + "; ".join(f"{bl.CPU_WORKLOADS[n].name} = {bl.CPU_WORKLOADS[n].note}, "
                                        f"batch {bl.CPU_WORKLOADS[n].batch_size}"
                                        for n in args.models.split(",")) + ".",
             f"Speedup = median over {args.rounds} rounds (after {args.warmup} warm-up) of "
             f"the same loop's 32-true NCHW time / this variant's; the variants alternate "
             f"after every step in a random order, a round is {args.block} steps of each, "
             f"timed by {bl.clock_name(device)}. 16-mixed: both loops "
             f"use amptrain's CPU fp16 convolution (fp16 forward, fp32 backward rounded to "
             f"fp16)."]
    if args.plain_fp16:
        fixed, plain = plain_fp16_step(bl.CPU_WORKLOADS["cnn"], device)
        notes.append(f"One hand-written 16-mixed CNN step with plain fp16 autocast: "
                     f"{plain:.1f} s, with amptrain's fp16 convolution {fixed * 1e3:.0f} ms "
                     f"({plain / fixed:.0f}x).")
    bl.report("Precision speedups over 32-true", machine, table, notes, record=args.record)


if __name__ == "__main__":
    main()
