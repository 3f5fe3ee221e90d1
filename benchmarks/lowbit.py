"""The emulated low-bit formats' cost: step time of each recipe of
amptrain.precision.lowbit.RECIPES (fp8, fp8-rowwise, fp8-rowwise-gw-hp, fp8-blockwise,
mxfp8, mxfp4, the nvfp4 training recipe and nvfp4-plain; each eligible Linear's GEMM
operands quantised and dequantised with the format's rules, fp32 GEMMs;
amptrain.precision.lowbit) relative to an emulated bf16-mixed step on the same model,
for the cnn, transformer and gpt models through the Trainer. Goal: at most 1.5x
bf16-mixed's step time.

bf16-mixed is emulated only where the CPU lacks bf16 hardware, so the default setting is
``ONEDNN_MAX_CPU_ISA=AVX2`` (an AVX2-only CPU as far as oneDNN is concerned: bf16
emulated); ``--settings native,avx2`` adds the CPU as it is. oneDNN reads the variable at
start-up, so each setting runs in a process of its own (this script re-runs itself). In
each, every variant trains its own copy of the same model on the same data, all in one
process, alternating after every step in a random order (benchlib.Relay); a round is
``--block`` steps of each variant, ``--warmup`` rounds are excluded; cost = median over
rounds of (the variant's time / bf16-mixed's time) in the same round, spread = half the
interquartile range of those ratios.

    python benchmarks/lowbit.py [--models cnn,transformer,gpt] [--rounds 5] \
        [--settings avx2] [--threads 1] [--record]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import warnings
from typing import Any

import benchlib as bl
import torch

from amptrain.common.errors import AmptrainWarning
from amptrain.precision.fp8 import plan_float8
from amptrain.precision.lowbit import RECIPES

WORKLOADS = {"cnn": bl.CPU_WORKLOADS["cnn"], "transformer": bl.CPU_WORKLOADS["transformer"],
             "gpt": bl.Workload("gpt", "gpt", f"text:{bl.ROOT / 'README.md'}", 16,
                                "gpt (4 layers, width 128, 4 heads) on README.md's bytes")}
BASELINE = "bf16-mixed"
FORMATS = tuple(RECIPES)
GOAL = 1.5
SETTINGS = {"native": {}, "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}


def measure(workload: bl.Workload, formats: list[str], rounds: int, warmup: int,
            block: int) -> list[dict[str, Any]]:
    """One setting, one model: each variant's ms/step and cost relative to bf16-mixed."""
    model, data = workload.build()
    total = (warmup + rounds) * block + 1
    extra = {"task": "lm"} if workload.name == "gpt" else {}
    loops = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AmptrainWarning)   # "emulated on this cpu", known
        for precision in (BASELINE, *formats):
            loops[precision] = bl.TrainerLoop(
                bl.fresh_copy(model), data, precision=precision,
                batch_size=workload.batch_size, total_steps=total,
                device=torch.device("cpu"), log_every=block, **extra)
    turn, group = bl.turn_plan(torch.device("cpu"), block)
    times = {k: v[warmup:] for k, v in
             bl.relay(loops, turn, torch.device("cpu"), group).items()}
    rows = []
    for name, t in times.items():
        ratios = bl.pair_ratios(t, times[BASELINE])
        layers = plan_float8(model, dim_multiple=RECIPES[name].dim_multiple) \
            if name in RECIPES else None
        rows.append({"model": workload.name, "variant": name,
                     "ms": bl.median(t) / block * 1e3, "cost": bl.median(ratios),
                     "spread": bl.spread(ratios),
                     "layers": f"{len(layers.convert)} of "
                               f"{len(layers.convert) + len(layers.skipped)}"
                     if layers else "-"})
    return rows


def run_setting(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for name in args.models.split(","):
        for row in measure(WORKLOADS[name], args.formats.split(","), args.rounds,
                           args.warmup, args.block):
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="cnn,transformer,gpt",
                        help=f"comma-separated, from {', '.join(WORKLOADS)}")
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--settings", default="avx2",
                        help="avx2 (ONEDNN_MAX_CPU_ISA=AVX2: bf16 emulated), native")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds")
    parser.add_argument("--warmup", type=int, default=1, help="rounds not measured")
    parser.add_argument("--block", type=int, default=3, help="steps of each variant per round")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    bl.add_common_args(parser)
    args = parser.parse_args()
    bl.apply_threads(args.threads)
    if args.child:  # one setting, in the environment the parent chose: rows as JSON
        print(json.dumps(run_setting(args)))
        return
    machine = bl.machine()
    table_rows = []
    for setting in args.settings.split(","):
        argv = [a for a in sys.argv[1:] if a != "--record"]
        proc = subprocess.run([sys.executable, __file__, *argv, "--child"],
                              env={**os.environ, **SETTINGS[setting]}, check=True,
                              stdout=subprocess.PIPE, text=True)
        for r in json.loads(proc.stdout.strip().splitlines()[-1]):
            judged = r["variant"] != BASELINE
            verdict = ("ok" if r["cost"] <= GOAL else "MISS") if judged else "-"
            table_rows.append([setting, r["model"], r["variant"], r["layers"],
                               f"{r['ms']:.1f}",
                               f"**{r['cost']:.2f}x**" if judged else f"{r['cost']:.2f}x",
                               r["spread"], verdict])
    table = bl.markdown_table(["oneDNN ISA", "model", "variant", "low-bit Linears",
                               "ms/step", f"vs {BASELINE}", "spread", f"<= {GOAL}x"],
                              table_rows)
    notes = ["Workloads: " + "; ".join(f"{w.name} = {w.note}, batch {w.batch_size}"
                                        for n, w in WORKLOADS.items()
                                        if n in args.models.split(",")) + ".",
             f"Through the Trainer (AdamW, cosine schedule). Variants alternate after every "
             f"step in a random order; a round is {args.block} steps of each; {args.rounds} "
             f"measured rounds after {args.warmup} warm-up, timed by "
             f"{'thread CPU time' if args.threads == 1 else 'wall-clock time'}. "
             f"The low-bit formats are emulated (quantise-dequantise + fp32 GEMM) in the "
             f"eligible Linear layers and run bf16-mixed elsewhere; avx2 = "
             f"ONEDNN_MAX_CPU_ISA=AVX2 (bf16-mixed emulated too). A model whose Linears are "
             f"not eligible (the cnn: only its classifier, the last Linear) trains exactly "
             f"as bf16-mixed."]
    bl.report(f"Emulated low-bit formats vs {BASELINE}", machine, table, notes,
              record=args.record)


if __name__ == "__main__":
    main()
