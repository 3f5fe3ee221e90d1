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

``--previous DIR`` (an amptrain checkout, e.g. a git worktree of main) adds, for each
format, a variant ``<format>:previous`` whose eligible Linears run through that
checkout's emulated linear (its ``amptrain.precision.lowbit``, imported under another
name): old and new code in one Relay, the steadiest comparison of a change on a shared
machine (separate runs of the same code move by more than 10 %).

    python benchmarks/lowbit.py [--models cnn,transformer,gpt] [--rounds 5] \
        [--settings avx2] [--threads 1] [--previous DIR] [--record]
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
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


def previous_lowbit(checkout: str) -> Any:
    """``amptrain.precision.lowbit`` of another checkout (its repository root), imported
    as the package ``amptrain_previous`` (its relative imports stay within it)."""
    root = Path(checkout).resolve() / "amptrain"
    spec = importlib.util.spec_from_file_location(
        "amptrain_previous", root / "__init__.py", submodule_search_locations=[str(root)])
    if spec is None or spec.loader is None:
        raise SystemExit(f"--previous {checkout}: no amptrain package there")
    package = importlib.util.module_from_spec(spec)
    sys.modules["amptrain_previous"] = package
    spec.loader.exec_module(package)
    return importlib.import_module("amptrain_previous.precision.lowbit")


def through_previous(loop: bl.TrainerLoop, lowbit: Any, precision: str) -> None:
    """The loop's emulated Linears (their forwards patched by the precision) made to call
    the previous checkout's emulated linear instead, with seeds of its own."""
    model = loop.trainer.model
    names = [name for name, module in model.named_modules()
             if isinstance(module, torch.nn.Linear) and "forward" in module.__dict__]
    recipe, seeds = lowbit.RECIPES[precision], lowbit.StochasticSeeds(0, names)
    for name, module in model.named_modules():
        if name in names:
            def forward(x: torch.Tensor, module: torch.nn.Module = module,
                        name: str = name) -> torch.Tensor:
                return lowbit.lowbit_linear(x, module.weight, module.bias, recipe, seeds,
                                            name)
            module.forward = forward


def measure(workload: bl.Workload, formats: list[str], rounds: int, warmup: int,
            block: int, previous: str | None = None) -> list[dict[str, Any]]:
    """One setting, one model: each variant's ms/step and cost relative to bf16-mixed
    (``previous``: each format also through that checkout's emulated linear)."""
    model, data = workload.build()
    total = (warmup + rounds) * block + 1
    extra = {"task": "lm"} if workload.name == "gpt" else {}
    loops = {}
    old = previous_lowbit(previous) if previous else None
    variants = [BASELINE] + [f + tag for f in formats
                             for tag in (("", ":previous") if old else ("",))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AmptrainWarning)   # "emulated on this cpu", known
        for variant in variants:
            precision = variant.split(":")[0]
            loops[variant] = bl.TrainerLoop(
                bl.fresh_copy(model), data, precision=precision,
                batch_size=workload.batch_size, total_steps=total,
                device=torch.device("cpu"), log_every=block, **extra)
            if variant.endswith(":previous"):
                through_previous(loops[variant], old, precision)
    turn, group = bl.turn_plan(torch.device("cpu"), block)
    times = {k: v[warmup:] for k, v in
             bl.relay(loops, turn, torch.device("cpu"), group).items()}
    rows = []
    for name, t in times.items():
        ratios = bl.pair_ratios(t, times[BASELINE])
        precision = name.split(":")[0]
        layers = plan_float8(model, dim_multiple=RECIPES[precision].dim_multiple) \
            if precision in RECIPES else None
        rows.append({"model": workload.name, "variant": name,
                     "ms": bl.median(t) / block * 1e3, "cost": bl.median(ratios),
                     "spread": bl.spread(ratios),
                     "vs previous": _vs_previous(times, name),
                     "layers": f"{len(layers.convert)} of "
                               f"{len(layers.convert) + len(layers.skipped)}"
                     if layers else "-"})
    return rows


def _vs_previous(times: dict[str, list[float]], name: str) -> str:
    """A format's time over its previous code's in the same rounds (median, spread)."""
    previous = times.get(name + ":previous")
    if previous is None:
        return "-"
    ratios = bl.pair_ratios(times[name], previous)
    return f"{bl.median(ratios):.2f}x {bl.spread(ratios)}"


def run_setting(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for name in args.models.split(","):
        for row in measure(WORKLOADS[name], args.formats.split(","), args.rounds,
                           args.warmup, args.block, args.previous):
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
    parser.add_argument("--previous", default=None, metavar="DIR",
                        help="an amptrain checkout whose emulated linear runs each format "
                             "too, in the same Relay ('<format>:previous')")
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
                               r["spread"], verdict]
                              + ([r["vs previous"]] if args.previous else []))
    table = bl.markdown_table(["oneDNN ISA", "model", "variant", "low-bit Linears",
                               "ms/step", f"vs {BASELINE}", "spread", f"<= {GOAL}x"]
                              + (["vs previous"] if args.previous else []), table_rows)
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
    if args.previous:
        notes.append(f"`<format>:previous` = the same format through the emulated linear of "
                     f"{args.previous} (imported as amptrain_previous), in the same Relay; "
                     f"vs previous = median over rounds of this code's time / the previous "
                     f"code's, spread.")
    bl.report(f"Emulated low-bit formats vs {BASELINE}", machine, table, notes,
              record=args.record)


if __name__ == "__main__":
    main()
