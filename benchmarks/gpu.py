"""Everything the CPU benchmarks measure, on one CUDA GPU (H100/H200), in one command.

    python benchmarks/gpu.py [--out DIR] [--budget-s 450]

Sections (each written to DIR/gpu_results.json as soon as it is done, so a run cut short
keeps what it measured; DIR/gpu_results.md gets the markdown tables for RESULTS.md):

1. sync check: the Trainer's steady-state steps under ``torch.cuda.set_sync_debug_mode
   ("error")`` with fused AdamW in 32-true, tf32, bf16-mixed and 16-mixed (any
   host-device sync raises), and the same with a non-fused SGD under 16-mixed, which must
   read GradScaler's inf flag on the host once per step (the check must catch that).
2. Trainer vs a hand-written torch.amp loop (same maths), per precision, for the CPU
   benchmarks' MLP, CNN and transformer: step-time ratio (target <= 1.02). These models
   are tiny for a GPU, so their steps are bound by launching kernels: the harshest test of
   per-step overhead.
3. ResNet-50 (amptrain's ``resnet50``, ImageNet stem) on synthetic 3x224x224 images, and a
   GPT-2-small-sized transformer (amptrain's ``transformer`` with d_model 768, 12 layers,
   12 heads, ff 3072, 1024 tokens; an encoder classifier, so no LM head) in 32-true, tf32,
   16-mixed and bf16-mixed: samples/s, peak memory, achieved TFLOP/s (FLOPs of forward +
   backward counted once with torch.utils.flop_counter.FlopCounterMode) and MFU against
   the GPU's dense peak for the precision's compute dtype; the Trainer next to the
   hand-written loop. ResNet-50 runs channels_last in every precision. Targets: ResNet-50
   AMP over TF32 >= 2.5x (NVIDIA's published A100 figure is 2.63x); transformer bf16
   MFU >= 40%.
4. What a per-step sync costs: 16-mixed with fused SGD (GradScaler's flag stays on the
   GPU) vs foreach SGD (GradScaler reads the flag with .item() every step), same model.
5. amptrain vs Lightning and Accelerate (benchmarks/vs_lightning_accelerate.py), only when
   both are importable here.

``torch.backends.cudnn.benchmark`` is on for every loop (fixed shapes). Timings: the
loops of a comparison take turns of several steps in one process (benchlib.Relay), the
GPU is synchronised at turn boundaries only, medians over rounds, warm-up excluded.
Without a CUDA GPU the script says so and exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import benchlib as bl
import torch
from torch import nn

PRECISIONS = ("32-true", "tf32", "16-mixed", "bf16-mixed")
#: Dense (no sparsity) peak TFLOP/s from NVIDIA's data sheets, by compute dtype.
PEAK_TFLOPS = {
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0},
    "H100": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},  # SXM5 (HBM3)
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "H200": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},  # SXM
}
COMPUTE_DTYPE = {"32-true": "fp32", "tf32": "tf32", "16-mixed": "fp16", "bf16-mixed": "bf16"}

BIG_WORKLOADS = {
    "resnet50": bl.Workload("resnet50", "resnet50", "synthetic-image:samples=640,size=224", 256,
                            "ResNet-50 (ImageNet stem), synthetic 3x224x224, channels_last"),
    "gpt2-small": bl.Workload("gpt2-small",
                              "transformer:d_model=768,layers=12,heads=12,ff=3072,dropout=0.1",
                              "synthetic-seq:samples=320,length=1024,vocab=50257", 8,
                              "d 768, 12 layers, 12 heads, ff 3072, 1024 tokens, vocab 50257"),
}


# ------------------------------------------------------------------ helpers
class Results:
    """Collects sections, rewriting the JSON and markdown files after each one."""

    def __init__(self, out: Path, started: float, budget_s: float) -> None:
        self.out, self.started, self.budget_s = out, started, budget_s
        out.mkdir(parents=True, exist_ok=True)
        self.data: dict[str, Any] = {"machine": _machine(), "command": bl.command_line(),
                                     "sections": {}}
        self.markdown: list[str] = []

    def left_s(self) -> float:
        return self.budget_s - (time.perf_counter() - self.started)

    def add(self, name: str, rows: Any, table: str | None = None, notes: str = "") -> None:
        self.data["sections"][name] = rows
        if table:
            self.markdown += [f"### {name}", "", table, ""] + ([notes, ""] if notes else [])
            print(f"\n### {name}\n\n{table}\n" + (f"\n{notes}\n" if notes else ""), flush=True)
        self.write()

    def skip(self, name: str, why: str) -> None:
        self.data["sections"][name] = {"skipped": why}
        self.markdown += [f"### {name}", "", f"skipped: {why}", ""]
        print(f"\n### {name}: skipped ({why})", flush=True)
        self.write()

    def write(self) -> None:
        self.data["elapsed_s"] = round(time.perf_counter() - self.started, 1)
        (self.out / "gpu_results.json").write_text(json.dumps(self.data, indent=1, default=str))
        m = self.data["machine"]
        head = [f"## GPU benchmarks: {m['gpu']}", "",
                f"`{self.data['command']}`", "",
                f"{m['date']}, {m['gpu']} ({m['gpu_memory_gib']} GiB, CUDA {m['cuda']}, "
                f"cuDNN {m['cudnn']}), torch {m['torch']}, {m['cpu']}; "
                f"{self.data['elapsed_s']} s.", ""]
        (self.out / "gpu_results.md").write_text("\n".join(head + self.markdown) + "\n")


def _machine() -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "gpu": torch.cuda.get_device_name(0),
            "gpu_memory_gib": round(props.total_memory / 2 ** 30, 1),
            "capability": "%d.%d" % torch.cuda.get_device_capability(0),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "python": platform.python_version(),
            "cpu": bl.machine()["cpu"], "load": bl.loadavg()}


def peak_tflops(precision: str, override: float | None) -> float | None:
    if override:
        return override
    name = torch.cuda.get_device_name(0)
    for key in sorted(PEAK_TFLOPS, key=len, reverse=True):  # "H100 NVL" before "H100"
        if key in name:
            return PEAK_TFLOPS[key][COMPUTE_DTYPE[precision]]
    return None


def flops_per_sample(workload: bl.Workload, precision: str, device: torch.device) -> float:
    """Forward + backward FLOPs of one sample (matmuls, convolutions, attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    model, data = workload.build()
    model = model.to(device)
    if workload.name == "resnet50":
        model = model.to(memory_format=torch.channels_last)
    n = 2
    batch = [t[:n].to(device) for t in data.tensors]
    dtype = bl.AUTOCAST_DTYPE[precision]
    counter = FlopCounterMode(display=False)
    with counter, torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
        loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
        loss.backward()
    del model
    return counter.get_total_flops() / n


def free_gpu() -> None:
    import gc
    gc.collect()
    torch.cuda.empty_cache()


# ----------------------------------------------------------------- sections
def sync_check(device: torch.device, results: Results) -> None:
    """Steady-state steps under set_sync_debug_mode('error')."""
    # 4 steps per epoch, so the checked steps cross two epoch starts (new data order).
    workload = bl.Workload("mlp", "mlp:hidden=512", "synthetic-image:samples=640,size=32", 128)
    rows = []
    cases = [(p, "adamw (fused)") for p in PRECISIONS] + [("16-mixed", "sgd (foreach)")]
    for precision, optimizer_name in cases:
        model, data = workload.build()
        optimizer = None
        if optimizer_name.startswith("sgd"):
            model = model.to(device)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=True)
        loop = bl.TrainerLoop(model, data, precision=precision, batch_size=workload.batch_size,
                              total_steps=12, device=device, log_every=1000,
                              torch_optimizer=optimizer)
        count = {"n": 0}  # across feed's calls (one per epoch) within this case

        def feed(iterable, count=count):  # bound: this case's counter, not a later one's
            for item in iterable:
                count["n"] += 1
                torch.cuda.set_sync_debug_mode("error" if 3 <= count["n"] < 12 else 0)
                yield item
            torch.cuda.set_sync_debug_mode(0)

        error = None
        try:
            loop.run(feed)
        except RuntimeError as exc:
            error = str(exc).strip().splitlines()[0][:160]
        finally:
            torch.cuda.set_sync_debug_mode(0)
        expect_sync = optimizer_name.startswith("sgd")
        verdict = ("ok (sync caught, as expected)" if error else "NOT CAUGHT") if expect_sync \
            else ("ok: no sync" if error is None else "SYNC")
        rows.append({"precision": precision, "optimizer": optimizer_name,
                     "steps_checked": 9, "error": error, "verdict": verdict})
        free_gpu()
    table = bl.markdown_table(["precision", "optimizer", "steps under sync_debug_mode('error')",
                               "first error", "verdict"],
                              [[r["precision"], r["optimizer"], r["steps_checked"],
                                r["error"] or "-", r["verdict"]] for r in rows])
    results.add("sync check (steps 3-11 of the Trainer's loop, MLP)", rows, table)


def trainer_vs_raw(device: torch.device, results: Results, rounds: int, block: int) -> None:
    import trainer_vs_raw as tvr

    rows = []
    for name in ("mlp", "cnn", "transformer"):
        for precision in PRECISIONS:
            if results.left_s() < 60:
                rows.append({"model": name, "precision": precision, "skipped": "time budget"})
                continue
            r = tvr.measure(bl.CPU_WORKLOADS[name], precision, rounds, 2, block, device)
            rows.append(r)
            free_gpu()
    table = bl.markdown_table(
        ["model", "precision", "hand-written ms/step", "Trainer ms/step",
         "Trainer / hand-written", "A/A control", "<= 1.02"],
        [[r["model"], r["precision"], f"{r['raw_ms']:.3f}", f"{r['trainer_ms']:.3f}",
          f"**{r['ratio']:.3f}**", f"{r['control']:.3f}", "ok" if r["ratio"] <= 1.02 else "MISS"]
         if "ratio" in r else [r["model"], r["precision"], "-", "-", "-", "-", r["skipped"]]
         for r in rows])
    notes = (f"Workloads as on the CPU (batch 128/64/64, data on the GPU). Turns of {block} "
             f"steps (one log step each), {rounds} rounds after 2 warm-up, wall clock with the "
             f"GPU synchronised at turn boundaries only.")
    results.add("Trainer vs hand-written loop (small models)", rows, table, notes)


def big_rows(spec: str | None) -> list[tuple[str, str]]:
    """``--big-rows`` as (model, precision) pairs in the order given: ``resnet50:bf16-mixed``
    one row, ``gpt2-small`` every precision of it; None: every model, every precision."""
    if not spec:
        return [(name, p) for name in BIG_WORKLOADS for p in PRECISIONS]
    pairs = []
    for item in spec.split(","):
        name, _, precision = item.partition(":")
        if name not in BIG_WORKLOADS or (precision and precision not in PRECISIONS):
            raise SystemExit(f"--big-rows: {item!r} is not MODEL[:PRECISION] of "
                             f"{sorted(BIG_WORKLOADS)} x {PRECISIONS}")
        pairs += [(name, p) for p in ([precision] if precision else PRECISIONS)]
    return pairs


def big_models(device: torch.device, results: Results, rounds: int, block: int,
               peak_override: float | None, only: str | None = None) -> None:
    rows = []
    wanted = big_rows(only)
    for name, workload in BIG_WORKLOADS.items():
        precisions = [p for n, p in wanted if n == name]
        if not precisions:
            continue
        channels_last = name == "resnet50"
        model, data = workload.build()
        flops = None
        for precision in precisions:
            if results.left_s() < 45:
                rows.append({"model": name, "precision": precision, "skipped": "time budget"})
                continue
            try:
                row = _big_model_run(workload, model, data, precision, channels_last, rounds,
                                     block, device)
            except torch.OutOfMemoryError as exc:
                rows.append({"model": name, "precision": precision,
                             "skipped": f"out of memory: {str(exc).splitlines()[0][:80]}"})
                free_gpu()
                continue
            if flops is None:  # the same count in every precision
                flops = flops_per_sample(workload, "bf16-mixed", device)
            row["gflop_per_sample"] = flops / 1e9
            row["tflops"] = flops * row["samples_per_s"] / 1e12
            peak = peak_tflops(precision, peak_override)
            row["peak_tflops"] = peak
            row["mfu"] = row["tflops"] / peak if peak else None
            rows.append(row)
            free_gpu()
        base = {r["precision"]: r for r in rows if r.get("model") == name and "samples_per_s" in r}
        for r in rows:
            if r.get("model") == name and "samples_per_s" in r:
                for ref in ("32-true", "tf32"):
                    if ref in base:
                        r[f"speedup_vs_{ref}"] = r["samples_per_s"] / base[ref]["samples_per_s"]
    table = bl.markdown_table(
        ["model", "precision", "samples/s", "vs 32-true", "vs tf32", "peak memory GiB",
         "TFLOP/s", "MFU", "hand-written samples/s", "Trainer / hand-written"],
        [[r["model"], r["precision"], f"{r['samples_per_s']:.1f}",
          f"{r.get('speedup_vs_32-true', float('nan')):.2f}x",
          f"{r.get('speedup_vs_tf32', float('nan')):.2f}x",
          f"{r['peak_mem_bytes'] / 2 ** 30:.1f}", f"{r['tflops']:.1f}",
          f"{r['mfu'] * 100:.1f}%" if r["mfu"] is not None else "-",
          f"{r['raw_samples_per_s']:.1f}", f"{r['ratio']:.3f}"]
         if "samples_per_s" in r else [r["model"], r["precision"]] + ["-"] * 7 + [r["skipped"]]
         for r in rows])
    notes = ("; ".join(f"{w.name} = {w.note}, batch {w.batch_size}"
                       for w in BIG_WORKLOADS.values()) +
             ". FLOPs per sample of forward + backward from FlopCounterMode (optimizer not "
             "counted); MFU against the dense peak of the precision's compute dtype "
             "(fp32 / tf32 / fp16 / bf16). Targets: ResNet-50 16-mixed or bf16-mixed vs tf32 "
             ">= 2.5x; gpt2-small bf16-mixed MFU >= 40%.")
    results.add("ResNet-50 and GPT-2-small-sized transformer", rows, table, notes)


def _big_model_run(workload: bl.Workload, model: nn.Module, data: Any, precision: str,
                   channels_last: bool, rounds: int, block: int, device: torch.device) -> dict:
    # Peak memory of the Trainer alone (nothing else resident), then the timed comparison.
    torch.backends.cudnn.benchmark = True
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    solo = bl.TrainerLoop(bl.fresh_copy(model), data, precision=precision,
                          batch_size=workload.batch_size, total_steps=4, device=device,
                          log_every=10 ** 9, channels_last=channels_last)
    solo.run()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del solo
    free_gpu()
    total = (2 + rounds) * block + 1
    common = dict(precision=precision, batch_size=workload.batch_size, total_steps=total,
                  device=device, log_every=block, channels_last=channels_last)
    loops = {"trainer": bl.TrainerLoop(bl.fresh_copy(model), data, **common),
             "raw": bl.RawLoop(bl.fresh_copy(model), data, **common)}
    times = {k: v[2:] for k, v in bl.relay(loops, block, device).items()}
    step_s = bl.median(times["trainer"]) / block
    raw_s = bl.median(times["raw"]) / block
    return {"model": workload.name, "precision": precision, "batch": workload.batch_size,
            "samples_per_s": workload.batch_size / step_s,
            "raw_samples_per_s": workload.batch_size / raw_s,
            "ratio": bl.median(bl.pair_ratios(times["trainer"], times["raw"])),
            "peak_mem_bytes": peak}


def sync_cost(device: torch.device, results: Results, rounds: int, block: int) -> None:
    """16-mixed with fused SGD (no sync) vs foreach SGD (GradScaler reads found_inf)."""
    rows = []
    for workload in (bl.CPU_WORKLOADS["transformer"], BIG_WORKLOADS["gpt2-small"]):
        if results.left_s() < 45:
            rows.append({"model": workload.name, "skipped": "time budget"})
            continue
        model, data = workload.build()
        total = (2 + rounds) * block + 1
        loops = {}
        for fused in (True, False):
            m = bl.fresh_copy(model).to(device)
            opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9,
                                  **({"fused": True} if fused else {"foreach": True}))
            loops["fused" if fused else "foreach"] = bl.TrainerLoop(
                m, data, precision="16-mixed", batch_size=workload.batch_size, total_steps=total,
                device=device, log_every=block, torch_optimizer=opt)
        times = {k: v[2:] for k, v in bl.relay(loops, block, device).items()}
        fused_ms = bl.median(times["fused"]) / block * 1e3
        foreach_ms = bl.median(times["foreach"]) / block * 1e3
        rows.append({"model": workload.name, "fused_ms": fused_ms, "foreach_ms": foreach_ms,
                     "ratio": bl.median(bl.pair_ratios(times["foreach"], times["fused"]))})
        del loops
        free_gpu()
    table = bl.markdown_table(
        ["model", "fused SGD ms/step (no sync)", "foreach SGD ms/step (1 sync/step)",
         "cost of the sync"],
        [[r["model"], f"{r['fused_ms']:.2f}", f"{r['foreach_ms']:.2f}",
          f"{(r['ratio'] - 1) * 100:+.1f}%"] if "ratio" in r else [r["model"], "-", "-",
                                                                  r["skipped"]]
         for r in rows])
    results.add("What GradScaler's per-step sync costs (16-mixed, SGD)", rows, table)


def frameworks(device: torch.device, results: Results, rounds: int, block: int) -> None:
    try:
        import accelerate  # noqa: F401
        import lightning  # noqa: F401
    except ImportError:
        results.skip("amptrain vs Lightning and Accelerate",
                     "lightning / accelerate not installed in this environment "
                     "(benchmarks/setup_compare_env.sh with TORCH_SPEC=torch on a GPU machine)")
        return
    import contextlib
    import io

    import vs_lightning_accelerate as vla

    rows = []
    for name in ("mlp", "cnn", "transformer"):
        for precision in ("32-true", "bf16-mixed", "16-mixed"):
            if results.left_s() < 45:
                continue
            with contextlib.redirect_stdout(io.StringIO()):
                rows.append(vla.measure(bl.CPU_WORKLOADS[name], precision, rounds, 2, block,
                                        device))
            free_gpu()
    table = bl.markdown_table(
        ["model", "precision", "amptrain ms/step", "Lightning / amptrain", "Accelerate / amptrain",
         "hand-written / amptrain"],
        [[r["model"], r["precision"], f"{r['amptrain_ms']:.3f}", vla._cell(r, "lightning"),
          vla._cell(r, "accelerate"), f"{r['hand-written']:.3f}"] for r in rows])
    results.add("amptrain vs Lightning and Accelerate", rows, table)


# --------------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "benchmarks/gpu-results",
                        help="where gpu_results.json / .md go (default: $OUT, else "
                             "benchmarks/gpu-results)")
    parser.add_argument("--budget-s", type=float, default=450,
                        help="skip what would not finish within this many seconds")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the GPU's dense peak for MFU when it is not in the table")
    parser.add_argument("--sections", default="sync,overhead,big,synccost,frameworks")
    parser.add_argument("--big-rows", default=None,
                        help="the big section's rows, in order: MODEL[:PRECISION],... "
                             "(default: resnet50 and gpt2-small in every precision)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"benchmarks/gpu.py needs a CUDA GPU (made for an H100/H200), and none is visible "
              f"here: torch {torch.__version__} (CUDA build: {torch.version.cuda or 'no'}), "
              f"torch.cuda.is_available() is False. The CPU benchmarks are "
              f"trainer_vs_raw.py, precision_speedup.py and vs_lightning_accelerate.py.",
              file=sys.stderr)
        return 2
    started = time.perf_counter()
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    results = Results(Path(args.out), started, args.budget_s)
    sections: dict[str, Callable[[], None]] = {
        "sync": lambda: sync_check(device, results),
        "overhead": lambda: trainer_vs_raw(device, results, args.rounds, block=20),
        "big": lambda: big_models(device, results, max(4, args.rounds // 2), 5,
                                  args.peak_tflops, args.big_rows),
        "synccost": lambda: sync_cost(device, results, args.rounds, block=20),
        "frameworks": lambda: frameworks(device, results, args.rounds, block=20),
    }
    for name in args.sections.split(","):
        if results.left_s() <= 30:
            results.skip(name, f"time budget of {args.budget_s:.0f} s spent")
            continue
        try:
            sections[name]()
        except Exception:  # noqa: BLE001 - one broken section must not lose the others
            results.add(f"{name} (failed)", {"error": traceback.format_exc()})
            print(traceback.format_exc(), file=sys.stderr)
            free_gpu()
    results.write()
    print(f"\nwritten: {results.out / 'gpu_results.json'} and {results.out / 'gpu_results.md'} "
          f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
