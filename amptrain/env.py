"""What this machine is and what it supports: the ``amptrain env`` command.

:func:`collect_env` describes the software and hardware (reports embed it), including
which precision modes the present device runs natively (``supported``) and the one
amptrain would pick (``recommended_precision``). :func:`run_bench` measures matmul and
convolution throughput per dtype on that device. Every CUDA fact comes from
``torch.cuda.*`` queries, so tests can fake a GPU by patching them.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

from .precision import fp8
from .precision.fp8 import CC_FP8
from .precision.modes import MODES, auto_mode, cpu_has_native_bf16

#: /proc/cpuinfo flags that decide how fast reduced precision is on an x86 CPU.
CPU_FLAGS = {"amx_bf16": "AMX-BF16", "amx_fp16": "AMX-FP16", "amx_tile": "AMX-TILE",
             "avx512_bf16": "AVX512-BF16", "avx512_fp16": "AVX512-FP16"}

#: Every precision `supported` reports on: amptrain's modes (fp8 included).
PRECISIONS = tuple(MODES)

# Compute capabilities (major, minor) where NVIDIA hardware features start.
CC_FP16 = (6, 0)          # fast fp16 arithmetic (Pascal P100)
CC_TENSOR_CORES = (7, 0)  # Volta: fp16 Tensor Cores
CC_BF16 = (8, 0)          # Ampere: bf16 and TF32 Tensor Cores
# CC_FP8 (8.9, Ada / Hopper: fp8 Tensor Cores) comes from the precision layer.


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else platform's guess."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def read_cpu_flags(path: str = "/proc/cpuinfo") -> set[str] | None:
    """The CPU's feature flags (x86 ``flags``, ARM ``Features``), or None when unknown."""
    try:
        with open(path) as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return None


def cpu_flags(path: str = "/proc/cpuinfo") -> dict[str, bool | None]:
    """{flag: present} for :data:`CPU_FLAGS`; values are None when the flags are unknown."""
    flags = read_cpu_flags(path)
    return {name: (None if flags is None else name in flags) for name in CPU_FLAGS}


def _version(query: Callable[[], Any]) -> str | None:
    try:
        value = query()
    except Exception:  # noqa: BLE001 - a CPU build raises for CUDA libraries; any failure = absent
        return None
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        return ".".join(str(v) for v in value)
    return str(value)


def _nccl_version() -> str | None:
    if not torch.cuda.is_available():
        return None
    return _version(torch.cuda.nccl.version)


def gpu_info(index: int) -> dict[str, Any]:
    """Name, compute capability, memory and precision features of one CUDA device."""
    props = torch.cuda.get_device_properties(index)
    cc = (props.major, props.minor)
    return {"name": props.name, "compute_capability": f"{props.major}.{props.minor}",
            "memory_bytes": int(props.total_memory),
            "multiprocessors": getattr(props, "multi_processor_count", None),
            "tensor_cores": cc >= CC_TENSOR_CORES, "fp16": cc >= CC_FP16,
            "bf16": cc >= CC_BF16, "tf32": cc >= CC_BF16, "fp8": cc >= CC_FP8}


def default_device() -> torch.device:
    """The device ``--device auto`` (and so ``env``) talks about."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def device_features(device: torch.device, flags: dict[str, bool | None],
                    gpus: list[dict[str, Any]]) -> dict[str, bool]:
    """Which reduced-precision maths ``device`` does in hardware (not emulated)."""
    if device.type == "cuda":
        gpu = gpus[device.index or 0]
        return {key: bool(gpu[key]) for key in ("tensor_cores", "fp16", "bf16", "tf32", "fp8")}
    native_bf16 = cpu_has_native_bf16() or bool(flags.get("avx512_bf16") or flags.get("amx_bf16"))
    native_fp16 = bool(flags.get("avx512_fp16") or flags.get("amx_fp16"))
    return {"tensor_cores": False, "amx": bool(flags.get("amx_tile")), "fp16": native_fp16,
            "bf16": native_bf16, "tf32": False, "fp8": False}


def precision_needs(device: torch.device) -> dict[str, str]:
    """What each precision needs from this kind of device (one line each, for the table)."""
    if device.type == "cuda":
        by_kind = {"fp32": "any CUDA GPU", "tf32": "compute capability 8.0+ (Ampere)",
                   "fp16": "compute capability 6.0+ (Tensor Cores: 7.0+)",
                   "bf16": "compute capability 8.0+ (Ampere)",
                   "fp8": "compute capability 8.9+ (Ada/Hopper) and torchao"}
    else:
        by_kind = {"fp32": "any CPU", "tf32": "an NVIDIA GPU (here it trains as 32-true)",
                   "fp16": "AVX512-FP16 or AMX-FP16 (AMX-FP16 for fast conv)",
                   "bf16": "AVX512-BF16 or AMX-BF16 (AMX for speed)",
                   "fp8": "an NVIDIA GPU with compute capability 8.9+ and torchao"}
    needs = {}
    for name, spec in MODES.items():
        dtypes = (spec.compute_dtype, spec.param_dtype)
        kind = "fp8" if spec.float8_linears else "tf32" if spec.tf32 else \
            "bf16" if torch.bfloat16 in dtypes else "fp16" if torch.float16 in dtypes else "fp32"
        needs[name] = by_kind[kind]
    return needs


def supported_precisions(features: dict[str, bool]) -> dict[str, bool]:
    """{precision: runs natively on this device} for every mode.

    fp8 also needs torchao: it is supported exactly when ``--precision fp8`` would be
    accepted (:func:`amptrain.precision.fp8.fp8_unsupported_reason`).
    """
    supported = {}
    for name, spec in MODES.items():
        if spec.float8_linears:
            supported[name] = features["fp8"] and fp8.torchao_available()
        elif spec.tf32:
            supported[name] = features["tf32"]
        elif torch.bfloat16 in (spec.compute_dtype, spec.param_dtype):
            supported[name] = features["bf16"]
        elif torch.float16 in (spec.compute_dtype, spec.param_dtype):
            supported[name] = features["fp16"]
        else:
            supported[name] = True
    return supported


def env_notes(device: torch.device, flags: dict[str, bool | None], features: dict[str, bool],
              gpus: list[dict[str, Any]], recommended: str) -> list[str]:
    """Plain-language consequences of the facts above, for people choosing a precision."""
    notes: list[str] = []
    if device.type == "cpu":
        if torch.version.cuda is None:
            notes.append("this torch is a CPU build: no CUDA GPU can be used")
        elif not gpus:
            notes.append("no CUDA GPU visible: training runs on the CPU")
        if features["bf16"]:
            engine = "AMX-BF16 tiles" if flags.get("amx_bf16") else "AVX512-BF16"
            notes.append(f"bf16 is native on this CPU ({engine}): bf16-mixed is the fastest "
                         f"safe choice and needs no loss scaling")
        else:
            notes.append("this CPU has no native bf16 (no AVX512-BF16/AMX-BF16): bf16 is "
                         "emulated and slower than fp32; train in 32-true")
        if not flags.get("amx_fp16"):
            fp16_math = "AVX512-FP16" if flags.get("avx512_fp16") else "no native fp16 maths"
            notes.append(f"fp16 has no AMX-FP16 here ({fp16_math}): 16-mixed is slower than "
                         f"bf16-mixed, and PyTorch's fp16 convolution backward is a slow "
                         f"reference kernel (amptrain computes it in fp32 instead)")
        notes.append("tf32 is a CUDA feature: on this device --precision tf32 trains as 32-true")
    else:
        gpu = gpus[device.index or 0]
        cc = gpu["compute_capability"]
        if not features["bf16"]:
            notes.append(f"{gpu['name']} (compute capability {cc}) has no bf16: use 16-mixed "
                         f"with dynamic loss scaling; bf16 modes are refused")
        if not features["tensor_cores"]:
            notes.append(f"{gpu['name']} has no Tensor Cores: mixed precision saves memory "
                         f"but little time")
        if features["tf32"]:
            notes.append("TF32 Tensor Cores: --precision tf32 speeds up fp32 matmul/conv "
                         "(10-bit mantissa)")
        if len(gpus) > 1:
            notes.append(f"{len(gpus)} GPUs visible: train on all with --nproc-per-node "
                         f"{len(gpus)}")
    if features["fp8"] and not fp8.torchao_available():
        notes.append("fp8 needs torchao (pip install torchao); it is not installed")
    elif not features["fp8"]:
        notes.append("fp8 needs an NVIDIA GPU with compute capability 8.9+ (Ada/Hopper)")
    if recommended != "32-true":
        notes.append("for conv nets under AMP add --channels-last (NHWC is what Tensor Cores "
                     "and oneDNN's reduced-precision kernels want)")
    return notes


def collect_env() -> dict[str, Any]:
    """The software, the hardware and what it supports (``amptrain env --json``).

    The first keys (``python``, ``torch``, ``cuda``, ``cpu``, ``cpu_cores``, ``gpus``) are
    embedded in other reports; the rest describe precision support on the device that
    ``--device auto`` would use.
    """
    flags = cpu_flags()
    gpus = [gpu_info(i) for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []
    device = default_device()
    features = device_features(device, flags, gpus)
    supported = supported_precisions(features)
    recommended = auto_mode(device)
    return {
        "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "cpu": cpu_model(), "cpu_cores": os.cpu_count(),
        "gpus": gpus,
        "cudnn": _version(torch.backends.cudnn.version) if torch.cuda.is_available() else None,
        "nccl": _nccl_version(),
        "cpu_flags": flags,
        "device": str(device),
        "features": features,
        "needs": precision_needs(device),
        "supported": supported,
        "recommended_precision": recommended,
        "channels_last": recommended != "32-true",
        "notes": env_notes(device, flags, features, gpus, recommended),
    }


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


def _timed(case: BenchCase, inputs: tuple[torch.Tensor, ...], device: torch.device,
           reps: int) -> float:
    """Seconds per call, averaged over ``reps`` back-to-back calls."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        case.run(*inputs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / reps


def run_bench(device: torch.device | None = None, rounds: int = 5,
              target_s: float = 0.1) -> dict[str, Any]:
    """fp32/bf16/fp16 throughput of each :func:`bench_cases` kernel on ``device``.

    Dtypes are interleaved within each round (so drift hits all alike), the first call
    per dtype is a warm-up, and the result is the median over rounds. Each timing
    repeats the kernel until about ``target_s`` seconds have passed. A dtype the device
    cannot run is reported with ``tflops`` None and the error.
    """
    device = device or default_device()
    results = []
    with torch.inference_mode():
        for case in bench_cases(device):
            inputs, reps, errors = {}, {}, {}
            for name, dtype in BENCH_DTYPES.items():  # warm-up, and repetitions per dtype
                try:
                    inputs[name] = case.make(dtype, device)
                    once = max(_timed(case, inputs[name], device, 1), 1e-6)
                except RuntimeError as exc:
                    errors[name] = str(exc).strip().splitlines()[0]
                    continue
                reps[name] = max(1, min(1000, int(target_s / once)))
            times: dict[str, list[float]] = {name: [] for name in reps}
            for _ in range(rounds):
                for name in reps:
                    times[name].append(_timed(case, inputs[name], device, reps[name]))
            medians = {name: statistics.median(ts) for name, ts in times.items()}
            for name in BENCH_DTYPES:
                row: dict[str, Any] = {"op": case.op, "shape": case.shape, "dtype": name,
                                       "ms": None, "tflops": None, "ratio_to_fp32": None}
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
    width = max(len(p) for p in PRECISIONS)
    lines.append(f"  {'precision':<{width}}  supported  needs")
    for name in PRECISIONS:
        mark = "  <- recommended" if name == info["recommended_precision"] else ""
        lines.append(f"  {name:<{width}}  {_yes(info['supported'][name]):<9}  "
                     f"{info['needs'][name]}{mark}")
    extra = " (+ --channels-last for conv nets)" if info["channels_last"] else ""
    lines += ["", f"recommended: --precision {info['recommended_precision']}{extra}"]
    if info["notes"]:
        lines += ["", "notes:"] + [f"  - {note}" for note in info["notes"]]
    if info.get("bench"):
        lines += ["", format_bench(info["bench"])]
    return "\n".join(lines)


def format_bench(bench: dict[str, Any]) -> str:
    """The --bench table: TFLOP/s and speed relative to fp32, per kernel and dtype."""
    lines = [f"throughput on {bench['device']} ({bench['threads']} threads, median of "
             f"{bench['rounds']} interleaved rounds):",
             f"  {'op':<7} {'dtype':<5} {'ms':>9} {'TFLOP/s':>8} {'vs fp32':>8}  shape"]
    for r in bench["results"]:
        if r["tflops"] is None:
            lines.append(f"  {r['op']:<7} {r['dtype']:<5} {'-':>9} {'-':>8} {'-':>8}  "
                         f"{r.get('error', 'not run')}")
            continue
        ratio = f"{r['ratio_to_fp32']:>7.2f}x" if r["ratio_to_fp32"] is not None else f"{'-':>8}"
        lines.append(f"  {r['op']:<7} {r['dtype']:<5} {r['ms']:>9.3f} {r['tflops']:>8.3f} "
                     f"{ratio}  {r['shape']}")
    return "\n".join(lines)
