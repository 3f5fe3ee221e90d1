"""The ``amptrain env`` report: the machine's facts (probed by
:func:`amptrain.precision.hardware.probe.collect_env`) as a table, and :func:`run_bench`,
which measures matmul and convolution throughput per dtype on that device.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

from ..precision.hardware.devices import CPU_FLAGS, resolve_device
from ..precision.hardware.support import (device_features, emulated_fast, emulated_precisions,
                                          emulation_label)
from ..precision.modes import MODES
from ..precision.emulation import EmulatedAutocast


# -------------------------------------------------------------------- bench
@dataclass(frozen=True)
class BenchCase:
    """One kernel to time: its name, problem size and how to build inputs and run it."""

    op: str
    shape: str
    flops: float
    make: Callable[[torch.dtype, torch.device], tuple[torch.Tensor, ...]]
    run: Callable[..., torch.Tensor]


def bench_cases(device: torch.device) -> list[BenchCase]:
    """A square matmul and a ResNet-style 3x3 convolution, sized for the device."""
    n = 4096 if device.type == "cuda" else 1024
    batch, channels, size = (64, 128, 56) if device.type == "cuda" else (8, 64, 28)

    def matmul_inputs(dtype: torch.dtype, dev: torch.device) -> tuple[torch.Tensor, ...]:
        g = torch.Generator(device="cpu").manual_seed(0)
        return tuple(torch.randn(n, n, generator=g).to(dev, dtype) for _ in range(2))

    def conv_inputs(dtype: torch.dtype, dev: torch.device) -> tuple[torch.Tensor, ...]:
        g = torch.Generator(device="cpu").manual_seed(0)
        x = torch.randn(batch, channels, size, size, generator=g)
        w = torch.randn(channels, channels, 3, 3, generator=g) * 0.05
        fmt = torch.channels_last
        return (x.to(dev, dtype).contiguous(memory_format=fmt),
                w.to(dev, dtype).contiguous(memory_format=fmt))

    return [
        BenchCase("matmul", f"{n}x{n}x{n}", 2.0 * n ** 3, matmul_inputs, torch.matmul),
        BenchCase("conv2d", f"{batch}x{channels}x{size}x{size} 3x3 fwd, channels_last",
                  2.0 * batch * channels * size * size * channels * 9, conv_inputs,
                  lambda x, w: F.conv2d(x, w, padding=1)),
    ]


BENCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: The mode whose matmuls a bench dtype stands for (how a run computes it on this device).
_BENCH_MODE = {"bf16": "bf16-mixed", "fp16": "16-mixed"}
#: How a run computes a dtype's matmuls, as the bench table labels it.
PATHS = {"native": "the dtype's own kernels",
         "emulated": "fp32 kernels + the dtype's rounding (amptrain's emulation)",
         "pytorch": "PyTorch's slow half kernels (AMPTRAIN_EMULATION=off)"}


def kernel_paths(device: torch.device) -> dict[str, str]:
    """Per bench dtype, the path a training run's matmuls and convolutions take on
    ``device`` (asked of :mod:`amptrain.precision.hardware.support`): ``native``, ``emulated``
    (:mod:`amptrain.precision.emulation`) or ``pytorch`` (emulated with the switch off)."""
    features = device_features(device)
    emulated, fast = emulated_precisions(device, features), emulated_fast(device, features)
    paths = {"fp32": "native"}
    for name, mode in _BENCH_MODE.items():
        paths[name] = ("emulated" if fast[mode] else "pytorch") if emulated[mode] else "native"
    return paths


def _timed(case: BenchCase, inputs: tuple[torch.Tensor, ...], device: torch.device,
           reps: int, emulate: torch.dtype | None = None) -> float:
    """Seconds per call, averaged over ``reps`` back-to-back calls (under the emulating
    autocast of dtype ``emulate``, fp32 inputs, where a run would emulate)."""

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    context = EmulatedAutocast(emulate) if emulate is not None else contextlib.nullcontext()
    with context:
        start = time.perf_counter()
        for _ in range(reps):
            case.run(*inputs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (time.perf_counter() - start) / reps


def run_bench(device: torch.device | None = None, rounds: int = 3,
              target_s: float = 0.05) -> dict[str, Any]:
    """fp32/bf16/fp16 throughput of each :func:`bench_cases` kernel on ``device``, each
    dtype timed on the path a training run takes here (:func:`kernel_paths`): where the
    device emulates bf16 or fp16, the emulation (fp32 inputs under the emulating autocast),
    not PyTorch's slow half kernels that no run uses.

    Dtypes are interleaved within each round (so drift hits all alike), the first call
    per dtype is a warm-up, and the result is the median over rounds. Each timing
    repeats the kernel until about ``target_s`` seconds have passed. A dtype the device
    cannot run is reported with ``tflops`` None and the error.
    """
    device = device or resolve_device("auto")
    paths = kernel_paths(device)
    results = []
    with torch.inference_mode():
        for case in bench_cases(device):
            inputs, reps, errors = {}, {}, {}
            emulate = {name: BENCH_DTYPES[name] if paths[name] == "emulated" else None
                       for name in BENCH_DTYPES}
            for name, dtype in BENCH_DTYPES.items():  # warm-up, and repetitions per dtype
                try:
                    inputs[name] = case.make(torch.float32 if emulate[name] else dtype, device)
                    once = max(_timed(case, inputs[name], device, 1, emulate[name]), 1e-6)
                except RuntimeError as exc:
                    errors[name] = str(exc).strip().splitlines()[0]
                    continue
                reps[name] = max(1, min(1000, int(target_s / once)))
            times: dict[str, list[float]] = {name: [] for name in reps}
            for _ in range(rounds):
                for name in reps:
                    times[name].append(_timed(case, inputs[name], device, reps[name],
                                              emulate[name]))
            medians = {name: statistics.median(ts) for name, ts in times.items()}
            for name in BENCH_DTYPES:
                row: dict[str, Any] = {"op": case.op, "shape": case.shape, "dtype": name,
                                       "path": paths[name], "ms": None, "tflops": None,
                                       "ratio_to_fp32": None}
                if name in medians:
                    row.update(ms=medians[name] * 1e3,
                               tflops=case.flops / medians[name] / 1e12)
                    if "fp32" in medians:
                        row["ratio_to_fp32"] = medians["fp32"] / medians[name]
                else:
                    row["error"] = errors[name]
                results.append(row)
    return {"device": str(device), "threads": torch.get_num_threads(), "rounds": rounds,
            "results": results}


# ---------------------------------------------------------------- output
def _yes(value: bool | None) -> str:
    return "?" if value is None else ("yes" if value else "no")


def _gib(n: int) -> str:
    return f"{n / 2 ** 30:.1f} GiB"


def format_env(info: dict[str, Any]) -> str:
    """A readable report of :func:`collect_env` (and ``bench`` when present)."""
    lines = ["amptrain env", "",
             f"  python {info['python']}   torch {info['torch']}   CUDA {info['cuda'] or '-'}"
             f"   cuDNN {info['cudnn'] or '-'}   NCCL {info['nccl'] or '-'}",
             f"  CPU    {info['cpu']} ({info['cpu_cores']} cores)",
             "         " + "  ".join(f"{label} {_yes(info['cpu_flags'][flag])}"
                                     for flag, label in CPU_FLAGS.items())]
    if info["gpus"]:
        for i, gpu in enumerate(info["gpus"]):
            lines.append(f"  GPU {i}  {gpu['name']}, compute capability "
                         f"{gpu['compute_capability']}, {_gib(gpu['memory_bytes'])}, "
                         f"Tensor Cores {_yes(gpu['tensor_cores'])}")
    else:
        lines.append("  GPU    none visible")
    f = info["features"]
    lines += ["", f"device {info['device']}: Tensor Cores {_yes(f['tensor_cores'])}   "
                  f"bf16 {_yes(f['bf16'])}   fp16 {_yes(f['fp16'])}   TF32 {_yes(f['tf32'])}   "
                  f"fp8 {_yes(f['fp8'])}", ""]
    width = max(len(p) for p in info["supported"])
    cells = {name: emulation_label(bool(info["emulated"].get(name)),
                                   bool(info.get("emulated_fast", {}).get(name)),
                                   lowbit=bool(MODES.get(name) and MODES[name].lowbit))
             or _yes(native) for name, native in info["supported"].items()}
    cell = max(16, *map(len, cells.values()))
    lines.append(f"  {'precision':<{width}}  {'supported':<{cell}}  needs")
    for name, support in cells.items():
        mark = "  <- recommended" if name == info["recommended_precision"] else ""
        lines.append(f"  {name:<{width}}  {support:<{cell}}  {info['needs'][name]}{mark}")
    lines += ["", info.get("recommended_line") or
              f"recommended: --precision {info['recommended_precision']}"]
    if info["notes"]:
        lines += ["", "notes:"] + [f"  - {note}" for note in info["notes"]]
    if info.get("bench"):
        lines += ["", format_bench(info["bench"])]
    return "\n".join(lines)


def format_bench(bench: dict[str, Any]) -> str:
    """The --bench table: TFLOP/s and speed relative to fp32, per kernel and dtype."""
    lines = [f"throughput on {bench['device']} ({bench['threads']} threads, median of "
             f"{bench['rounds']} interleaved rounds):",
             f"  {'op':<7} {'dtype':<5} {'path':<8} {'ms':>9} {'TFLOP/s':>8} {'vs fp32':>8}  "
             f"shape"]
    for r in bench["results"]:
        path = r.get("path", "native")
        if r["tflops"] is None:
            lines.append(f"  {r['op']:<7} {r['dtype']:<5} {path:<8} {'-':>9} {'-':>8} "
                         f"{'-':>8}  {r.get('error', 'not run')}")
            continue
        ratio = f"{r['ratio_to_fp32']:>7.2f}x" if r["ratio_to_fp32"] is not None else f"{'-':>8}"
        lines.append(f"  {r['op']:<7} {r['dtype']:<5} {path:<8} {r['ms']:>9.3f} "
                     f"{r['tflops']:>8.3f} {ratio}  {r['shape']}")
    used = dict.fromkeys(r.get("path", "native") for r in bench["results"])
    lines.append("  path: each dtype as a training run computes it here; " + "; ".join(
        f"{path} = {PATHS[path]}" for path in used))
    return "\n".join(lines)
