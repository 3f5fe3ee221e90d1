"""fp8 against bf16-mixed on an Ada/Hopper GPU: throughput and loss curves, one command.

    python benchmarks/gpu_fp8.py                      # H100/H200: d_model 2048, 4 layers, seq 1024
    python benchmarks/gpu_fp8.py --d-model 4096 --ff 16384 --layers 2 --batch-size 4
    python benchmarks/gpu_fp8.py --tiny --device cpu --precisions 32-true,bf16-mixed   # smoke test
    python benchmarks/gpu_fp8.py --precisions bf16-mixed,fp8-rowwise-gw-hp,fp8-blockwise
        # issue 46's recipes (fp8-blockwise native on sm90+ with torchao and Triton; the
        # d_model and ff must be multiples of 128 for its layers to be eligible)

Both precisions train amptrain's built-in ``transformer`` (dropout off) through the
Trainer, from identical initial weights on identical batches:

1. throughput: the precisions take turns, ``--steps`` optimizer steps per turn for
   ``--rounds`` rounds (the order alternates), after ``--warmup`` turns each that are not
   counted (torch.compile and fp8 scale set-up happen there); each turn is timed with the
   device synchronised at its ends, and the median step time is reported, with tokens/s,
   the speed-up over the first precision and the peak memory;
2. loss curves: each precision then trains a fresh copy for ``--curve-steps`` steps; the
   loss is logged every ``--log-every`` steps and the curves are compared with the first
   precision's: the largest relative gap of the smoothed curves, and the verdict ``ok``
   when it stays under ``--tolerance`` (default 5%).

torchao's float8 speed-up needs torch.compile (on by default; ``--no-compile`` to see
eager) and large matmuls: published torchao figures are about 1.25x for large Linear
layers and slower than bf16 for small ones. Needs CUDA with compute capability 8.9+ and
torchao for fp8; anything else stops with the reason (exit 2).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from amptrain.config import RunConfig, build_config
from amptrain.common.errors import UserError, cli_spelling
from amptrain.precision import Precision
from amptrain.workflows.runner import data_and_model
from amptrain.trainer import Trainer

TINY = {"d_model": 32, "layers": 1, "heads": 2, "ff": 64, "seq": 16, "batch_size": 8,
        "vocab": 100, "steps": 2, "rounds": 2, "warmup": 1, "curve_steps": 8, "log_every": 2,
        "compile": False}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", default="bf16-mixed,fp8",
                        help="comma-separated; the first is the baseline (default: bf16-mixed,fp8)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--d-model", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--ff", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=1024, help="tokens per sequence")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per turn")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2, help="untimed turns per precision")
    parser.add_argument("--curve-steps", type=int, default=300)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--tolerance", type=float, default=0.05,
                        help="largest relative gap between smoothed loss curves (default 0.05)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--tiny", action="store_true",
                        help="tiny sizes (a smoke test of this script)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.tiny:
        for key, value in TINY.items():
            setattr(args, key, value)
    args.precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    return args


def check_device(args: argparse.Namespace) -> torch.device:
    """The device, or a UserError naming what is missing (CUDA, sm89+, torchao)."""
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("benchmarks/gpu_fp8.py needs a CUDA GPU with compute capability 8.9+ "
                        "(H100/H200, L4, L40S) and torchao; none is visible here "
                        f"(torch {torch.__version__}). For a CPU smoke test: --tiny --device cpu "
                        f"--precisions 32-true,bf16-mixed")
    device = torch.device(args.device)
    for name in args.precisions:
        Precision(name, device=device)  # raises the precision layer's own UserError
    return device


def build(args: argparse.Namespace, precision: str, max_steps: int) -> tuple[Trainer, Any]:
    """A Trainer set up on a fresh, identically seeded model and the shared data spec."""
    model = (f"transformer:d_model={args.d_model},layers={args.layers},heads={args.heads},"
             f"ff={args.ff},dropout=0.0")
    samples = args.batch_size * max(args.curve_steps, args.steps * 4)
    data = f"synthetic-seq:samples={samples},length={args.seq},vocab={args.vocab},classes=8"
    config = build_config(RunConfig, dict(
        model=model, data=data, precision=precision, device=args.device, seed=0,
        batch_size=args.batch_size, max_steps=max_steps, epochs=10 ** 6, lr=args.lr,
        scheduler="none", log_every=args.log_every, compile=args.compile, no_progress=True,
        val_fraction=0.01))
    bundle, module = data_and_model(config)
    trainer = Trainer(config)
    trainer.setup(module, bundle.train)
    return trainer, bundle


def windows_forever(trainer: Trainer) -> Iterator[Any]:
    epoch = 0
    while True:
        yield from trainer.train_windows.epoch(epoch)
        epoch += 1


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_throughput(args: argparse.Namespace, device: torch.device
                       ) -> dict[str, dict[str, float]]:
    """Interleaved turns of ``args.steps`` steps; warm-up turns excluded; medians."""
    runs = {}
    for name in args.precisions:
        trainer, _ = build(args, name, max_steps=10 ** 9)
        runs[name] = {"trainer": trainer, "windows": windows_forever(trainer),
                      "step_s": [], "peak": 0}
    total_rounds = args.warmup + args.rounds
    for round_index in range(total_rounds):
        order = args.precisions if round_index % 2 == 0 else args.precisions[::-1]
        for name in order:
            run = runs[name]
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            synchronize(device)
            start = time.perf_counter()
            for _ in range(args.steps):
                run["trainer"].train_step(next(run["windows"]))
            run["trainer"].finish_step()
            synchronize(device)
            elapsed = (time.perf_counter() - start) / args.steps
            if round_index >= args.warmup:
                run["step_s"].append(elapsed)
                if device.type == "cuda":
                    run["peak"] = max(run["peak"], torch.cuda.max_memory_allocated(device))
    tokens = args.batch_size * args.seq
    results = {}
    for name, run in runs.items():
        step = statistics.median(run["step_s"])
        results[name] = {"step_ms": step * 1e3, "tokens_per_s": tokens / step,
                         "peak_mem_bytes": run["peak"],
                         "skipped_steps": run["trainer"].precision.skipped_steps}
    base = results[args.precisions[0]]["step_ms"]
    for row in results.values():
        row["speedup"] = base / row["step_ms"]
    del runs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return results


def loss_curves(args: argparse.Namespace, device: torch.device) -> dict[str, list[float]]:
    """Each precision trains a fresh copy for ``curve_steps`` steps; the logged losses."""
    curves = {}
    for name in args.precisions:
        trainer, _ = build(args, name, max_steps=args.curve_steps)
        result = trainer.run()
        curves[name] = [r["loss"] for r in result.history if "loss" in r]
        del trainer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return curves


def smooth(values: list[float], width: int = 3) -> list[float]:
    """Trailing moving average (the logged losses are already means over log_every steps)."""
    return [statistics.fmean(values[max(0, i - width + 1):i + 1]) for i in range(len(values))]


def compare_curves(curves: dict[str, list[float]], baseline: str, tolerance: float
                   ) -> dict[str, dict[str, float | str]]:
    """Largest relative gap of each smoothed curve to the baseline's, and a verdict."""
    reference = smooth(curves[baseline])
    verdicts = {}
    for name, values in curves.items():
        mine = smooth(values)
        gaps = [abs(a - b) / max(abs(b), 1e-8) for a, b in zip(mine, reference)]
        worst = max(gaps) if gaps else 0.0
        finite = all(v == v and abs(v) != float("inf") for v in values)
        verdicts[name] = {"max_rel_gap": worst, "final_loss": values[-1] if values else None,
                          "verdict": "ok" if finite and worst <= tolerance else "differs"}
    return verdicts


def format_table(args: argparse.Namespace, device: torch.device, speed: dict[str, Any],
                 curves: dict[str, Any]) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    lines = [f"fp8 benchmark on {name} (torch {torch.__version__}, compile={args.compile}): "
             f"transformer d_model {args.d_model}, {args.layers} layers, {args.heads} heads, "
             f"ff {args.ff}, seq {args.seq}, batch {args.batch_size}",
             f"throughput: median of {args.rounds} interleaved turns of {args.steps} steps, "
             f"{args.warmup} warm-up turns each excluded; loss: {args.curve_steps} steps, "
             f"logged every {args.log_every}", "",
             f"| precision | step ms | tokens/s | speed-up | peak GiB | final loss | "
             f"max gap to {args.precisions[0]} | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for precision in args.precisions:
        s, c = speed[precision], curves[precision]
        final = f"{c['final_loss']:.4f}" if c["final_loss"] is not None else "-"
        lines.append(f"| {precision} | {s['step_ms']:.1f} | {s['tokens_per_s']:,.0f} | "
                     f"{s['speedup']:.2f}x | {s['peak_mem_bytes'] / 2 ** 30:.1f} | {final} | "
                     f"{c['max_rel_gap'] * 100:.1f}% | {c['verdict']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with cli_spelling():  # a command line: errors name its flags
            device = check_device(args)
    except UserError as exc:
        print(f"gpu_fp8: error: {exc}", file=sys.stderr)
        return 2
    speed = measure_throughput(args, device)
    raw = loss_curves(args, device)
    curves = compare_curves(raw, args.precisions[0], args.tolerance)
    print(format_table(args, device, speed, curves))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"args": {k: v for k, v in vars(args).items() if k != "json"},
             "device": str(device), "torch": torch.__version__, "throughput": speed,
             "curves": raw, "comparison": curves}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
