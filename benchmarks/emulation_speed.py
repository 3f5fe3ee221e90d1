"""Emulated precisions at fp32 speed: step time of each emulated mode (fp32 kernels with
the half format's rounding, amptrain.precision.emulation) and of the slow path it
replaces (PyTorch's own half CPU kernels, ``AMPTRAIN_EMULATION=off``), relative to
32-true, for the cnn, transformer and gpt models through the Trainer. Goal: emulated
>= 0.8x of 32-true.

Two CPU settings: as the CPU is (here AVX512-BF16: bf16 native, fp16 emulated), and under
``ONEDNN_MAX_CPU_ISA=AVX2`` (an AVX2-only CPU as far as oneDNN is concerned: bf16 and fp16
both emulated), which oneDNN reads at start-up, so each setting runs in a process of its
own (this script re-runs itself). In each, every variant trains its own copy of the same
model on the same data, all in one process, alternating after every step in a random
order (benchlib.Relay); a round is ``--block`` steps of each variant, ``--warmup`` rounds
are excluded; ratio = median over rounds of (32-true's time / the variant's time) in the
same round, spread = half the interquartile range of those ratios.

    python benchmarks/emulation_speed.py [--models cnn,transformer,gpt] [--rounds 5] \
        [--settings native,avx2] [--no-slow] [--threads 1] [--record]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

import benchlib as bl
import torch

from amptrain.precision.emulation import ENV_SWITCH
from amptrain.precision.hardware.support import emulated_fast

#: The models: the CPU workloads of the other benchmarks, and gpt on this README's bytes
#: (memory_ladder.py's workload).
WORKLOADS = {"cnn": bl.CPU_WORKLOADS["cnn"], "transformer": bl.CPU_WORKLOADS["transformer"],
             "gpt": bl.Workload("gpt", "gpt", f"text:{bl.ROOT / 'README.md'}", 16,
                                "gpt (4 layers, width 128, 4 heads) on README.md's bytes")}
PRECISIONS = ("bf16-mixed", "16-mixed")
GOAL = 0.8
SETTINGS = {"native": {}, "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}


def _loop(model: torch.nn.Module, data: Any, precision: str, slow: bool,
          workload: bl.Workload, total: int, block: int) -> bl.TrainerLoop:
    """A Trainer whose Precision was created with the emulation switch on or off."""
    saved = os.environ.get(ENV_SWITCH)
    os.environ[ENV_SWITCH] = "off" if slow else "on"
    try:
        extra = {"task": "lm"} if workload.name == "gpt" else {}
        return bl.TrainerLoop(bl.fresh_copy(model), data, precision=precision,
                              batch_size=workload.batch_size, total_steps=total,
                              device=torch.device("cpu"), log_every=block, **extra)
    finally:
        if saved is None:
            os.environ.pop(ENV_SWITCH, None)
        else:
            os.environ[ENV_SWITCH] = saved


def measure(workload: bl.Workload, precisions: list[str], slow: bool, rounds: int,
            warmup: int, block: int) -> list[dict[str, Any]]:
    """One setting, one model: each variant's ms/step and ratio to 32-true."""
    model, data = workload.build()
    fast = emulated_fast(torch.device("cpu"), _features())
    total = (warmup + rounds) * block + 1
    loops = {"32-true": _loop(model, data, "32-true", False, workload, total, block)}
    for precision in precisions:
        loops[f"{precision} {'emulated' if fast[precision] else 'native'}"] = \
            _loop(model, data, precision, False, workload, total, block)
        if slow and fast[precision]:
            loops[f"{precision} torch kernels"] = \
                _loop(model, data, precision, True, workload, total, block)
    turn, group = bl.turn_plan(torch.device("cpu"), block)
    times = {k: v[warmup:] for k, v in
             bl.relay(loops, turn, torch.device("cpu"), group).items()}
    rows = []
    for name, t in times.items():
        ratios = bl.pair_ratios(times["32-true"], t)
        rows.append({"model": workload.name, "variant": name,
                     "ms": bl.median(t) / block * 1e3, "ratio": bl.median(ratios),
                     "spread": bl.spread(ratios)})
    return rows


def _features() -> dict[str, bool]:
    from amptrain.precision.hardware.support import device_features
    return device_features(torch.device("cpu"))


def run_setting(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for name in args.models.split(","):
        for row in measure(WORKLOADS[name], args.precisions.split(","), not args.no_slow,
                           args.rounds, args.warmup, args.block):
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="cnn,transformer,gpt",
                        help=f"comma-separated, from {', '.join(WORKLOADS)}")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--settings", default="native,avx2",
                        help="native (the CPU as it is), avx2 (ONEDNN_MAX_CPU_ISA=AVX2)")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds")
    parser.add_argument("--warmup", type=int, default=1, help="rounds not measured")
    parser.add_argument("--block", type=int, default=3, help="steps of each variant per round")
    parser.add_argument("--no-slow", action="store_true",
                        help="leave out PyTorch's half kernels (the slow path)")
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
            emulated = r["variant"].endswith("emulated")
            verdict = ("ok" if r["ratio"] >= GOAL else "MISS") if emulated else "-"
            table_rows.append([setting, r["model"], r["variant"], f"{r['ms']:.1f}",
                               f"**{r['ratio']:.2f}x**" if emulated else f"{r['ratio']:.2f}x",
                               r["spread"], verdict])
    table = bl.markdown_table(["oneDNN ISA", "model", "variant", "ms/step",
                               "vs 32-true", "spread", f">= {GOAL}x"], table_rows)
    notes = ["Workloads: " + "; ".join(f"{w.name} = {w.note}, batch {w.batch_size}"
                                        for n, w in WORKLOADS.items()
                                        if n in args.models.split(",")) + ".",
             f"Through the Trainer (AdamW, cosine schedule). Variants alternate after every "
             f"step in a random order; a round is {args.block} steps of each; {args.rounds} "
             f"measured rounds after {args.warmup} warm-up, timed by "
             f"{'thread CPU time' if args.threads == 1 else 'wall-clock time'}. "
             f"`emulated`: amptrain's fp32 kernels with the half rounding; `torch kernels`: "
             f"AMPTRAIN_EMULATION=off (PyTorch's half CPU kernels, what amptrain ran before; "
             f"for 16-mixed with its fp32 convolution backward); `native`: the CPU has the "
             f"hardware. avx2 = ONEDNN_MAX_CPU_ISA=AVX2 (oneDNN only; ATen's own vector "
             f"code still uses AVX512 on this CPU)."]
    bl.report("Emulated precisions vs 32-true (fp32 kernels, half rounding)", machine, table,
              notes, record=args.record)


if __name__ == "__main__":
    main()
