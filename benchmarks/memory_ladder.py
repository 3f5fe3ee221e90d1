"""The memory ladder, rung by rung: bytes per parameter, step time and accuracy.

Rungs: 32-true, bf16-mixed, bf16-master, bf16-true (plain), bf16-true + kahan,
bf16-true + stochastic, and bf16-true with --optimizer adamw8bit (plain, kahan, stochastic).
Each workload is one ``amptrain compare`` study (the library, not a copy of it): the
Trainers of all rungs are timed in one process with interleaved steps (medians, warm-up
excluded), the bytes are the exact sums of compare.json's memory ladder, and (for the
accuracy workload) every rung trains ``--seeds`` seeds from identical weights and data order.

Step time is reported relative to plain bf16-true (goal: <= 1.15x for the rules).
Acceptance on digits with the cnn: kahan, stochastic and adamw8bit in bf16-true within
0.5 pp of 32-true, adamw8bit's optimizer state <= 0.3x of 32-true's.

    python benchmarks/memory_ladder.py [--workloads cnn,transformer] [--epochs 10]
        [--seeds 2] [--timing-steps 60] [--threads 1] [--record]
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import benchlib as bl

from amptrain.compare import CompareOptions, run_compare
from amptrain.config import RunConfig

RUNGS = ("32-true", "bf16-mixed", "bf16-master", "bf16-true", "bf16-true+kahan",
         "bf16-true+stochastic", "bf16-true+adamw8bit", "bf16-true+kahan+adamw8bit",
         "bf16-true+stochastic+adamw8bit")
#: (model, data, batch size, trains for accuracy); gpt: a byte-level LM on this README.
WORKLOADS = {"cnn": ("cnn", "digits", 64, True),
             "transformer": ("transformer", "synthetic-seq", 64, False),
             "gpt": ("gpt", f"text:{bl.ROOT / 'README.md'}", 16, False)}


def study(name: str, args: argparse.Namespace, out: Path) -> dict:
    model, data, batch, train = WORKLOADS[name]
    config = RunConfig.from_options(model=model, data=data, device="cpu", batch_size=batch,
                                    epochs=args.epochs, no_progress=True, seed=0,
                                    out=str(out / name))
    options = CompareOptions(precisions=args.rungs, seeds=args.seeds,
                             timing_steps=args.timing_steps, timing_warmup=args.warmup,
                             bench_steps=None if train else args.timing_steps)
    return run_compare(config, options, command=bl.command_line())


def rows(name: str, result: dict) -> list[list[str]]:
    summary = {r["precision"]: r for r in result["summary"]}
    base, plain = summary["32-true"], summary.get("bf16-true", summary["32-true"])
    table = []
    def mib(r: dict, key: str) -> str:
        return f"{r[key] / 2 ** 20:.3f}" if r.get(key) is not None else "n/a"

    for rung, r in summary.items():
        acc = "n/a" if r.get("val_acc_mean") is None else \
            f"{100 * r['val_acc_mean']:.2f} ± {100 * (r['val_acc_std'] or 0):.2f}"
        delta = "n/a" if r.get("delta_acc_pp") is None else f"{r['delta_acc_pp']:+.2f}"
        losses = [x["val_loss"] for x in result["runs"]
                  if x["precision"] == rung and x.get("val_loss") is not None]
        val_loss = f"{sum(losses) / len(losses):.4f}" if losses else "n/a"
        state = r["optimizer_state_bytes"] / base["optimizer_state_bytes"]
        step = r["step_time_ms"] / plain["step_time_ms"] if r.get("step_time_ms") else None
        table.append([name, f"`{rung}`", f"{r['bytes_per_param']:.2f}", mib(r, "weights_bytes"),
                      mib(r, "grad_bytes"), mib(r, "master_bytes"),
                      mib(r, "optimizer_state_bytes"),
                      f"{state:.3f}", f"{r['step_time_ms']:.2f}",
                      "n/a" if step is None else f"{step:.3f}", acc, delta, val_loss])
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="cnn,transformer,gpt")
    parser.add_argument("--rungs", default=",".join(RUNGS),
                        help="compare's --precisions (32-true is always added as baseline)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--timing-steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--out", default=None, help="keep the studies here (default: a temp dir)")
    bl.add_common_args(parser)
    args = parser.parse_args()
    bl.apply_threads(args.threads)
    m = bl.machine()
    out = Path(args.out or tempfile.mkdtemp(prefix="memory-ladder-"))
    table = []
    for name in args.workloads.split(","):
        result = study(name, args, out)
        table += rows(name, result)
        (out / f"{name}.json").write_text(json.dumps(result["summary"], indent=2))
    seeds = f"{args.seeds} seed{'s' if args.seeds != 1 else ''}"  # as asked, not always 2
    headers = ["model", "rung", "bytes/param", "weights MiB", "grads MiB", "masters/Kahan MiB",
               "opt state MiB", "opt state / 32-true", "step ms (median)",
               "step / bf16-true", f"val acc % ({seeds})", "Δ acc pp", "val loss (mean)"]
    notes = [f"Each model: one `amptrain compare` study of the rungs (Trainers "
             f"timed interleaved in one process, median of {args.timing_steps} steps after "
             f"{args.warmup} warm-up); cnn: digits, {args.epochs} epochs of batch 64, "
             f"{args.seeds} seeds; transformer (synthetic-seq) and gpt (bytes of README.md, batch "
             f"16): timed and sized only. Bytes are "
             f"exact sums over tensors (compare.json's memory ladder); Adam's 0-d step counters "
             f"are included in the optimizer state. Studies kept in {out}."]
    bl.report("The memory ladder", m, bl.markdown_table(headers, table), notes,
              record=args.record)


if __name__ == "__main__":
    main()
