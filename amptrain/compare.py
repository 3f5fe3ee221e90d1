"""``amptrain compare``: the A/B precision study.

Trains the same model in several precisions (and seeds) with identical initial weights
and identical data order, then answers "is it as accurate, and how much faster and
smaller?" in ``compare.json``, ``report.md``, ``report.html`` and ``compare.png``.

Three measurements, each done the fair way:

* **Accuracy** -- each precision x seed is a normal ``train`` run (``runner.run_training``)
  under ``DIR/runs/<precision>/seed-<s>/``. A probe checks, for every run, that the model
  the precision trains starts from the seed's weights and sees the seed's data order.
* **Speed** -- one fully set-up Trainer per precision in this process; timed optimizer
  steps alternate between them (``--interleave``) so machine drift hits all alike.
  Warm-up steps are excluded, each step is bracketed by a device sync, and the median
  step time is reported (samples/s = global batch / median step time).
* **Memory** -- model state (weights, buffers, optimizer state, master copies) plus the
  largest transient working set of a training step (activations, gradients, autocast
  copies) above it. On CUDA from ``torch.cuda.max_memory_allocated``; on CPU from the
  allocation events of PyTorch's CPU allocator recorded by the profiler, because the
  process's peak RSS only ever grows and cannot separate precisions run in one process.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import itertools
import json
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .config import RunConfig, option, replace_options, to_dict
from .config.options import require_non_negative, require_positive
from .devices import resolve_device
from .env import collect_env
from .errors import TrainingHalted, UserError, flag
from .precision.maths import MathSwitches
from .precision.support import resolve_name
from .runner import prepare_run, run_training
from .trainer import Trainer, forward_batch

log = logging.getLogger("amptrain")

#: compare.json's summary fields, in DESIGN.md's order.
SUMMARY_FIELDS = ("precision", "samples_per_s", "speedup", "step_time_ms", "peak_mem_bytes",
                  "mem_ratio", "val_acc_mean", "val_acc_std", "delta_acc_pp", "final_loss_mean",
                  "skipped_steps", "verdict")
#: A run logs about this many training records, so every loss curve has enough points.
CURVE_POINTS = 100
#: Training steps measured for peak memory (after the timing steps warmed everything up).
MEMORY_STEPS = 2


@dataclass
class CompareOptions:
    """What the study compares and how it measures (the flags ``train`` does not have)."""

    precisions: str = option("32-true,16-mixed,bf16-mixed", "comma-separated precisions to "
                             "compare", group="compare", comma_list=True)
    seeds: int = option(2, "training runs per precision, seeds --seed, --seed+1, ...",
                        group="compare")
    baseline: str = option("32-true", "precision that speedup, mem_ratio and delta_acc_pp are "
                           "relative to (added to --precisions when missing)", group="compare")
    tolerance_pp: float = option(0.5, "verdict ok when |accuracy difference to the baseline| is "
                                 "at most this many percentage points", group="compare")
    interleave: bool = option(True, "alternate the timed steps between precisions "
                              "(--no-interleave times one precision after the other and holds "
                              "one model at a time)", group="compare")
    timing_steps: int = option(30, "timed optimizer steps per precision", group="compare")
    timing_warmup: int = option(5, "untimed warm-up steps per precision before timing",
                                group="compare")
    bench_steps: int | None = option(None, "speed only: time this many steps per precision "
                                     "and skip the training runs", kind=int, group="compare")

    def __post_init__(self) -> None:
        require_positive(self, "seeds", "timing_steps")
        require_positive(self, "bench_steps", optional=True)
        require_non_negative(self, "timing_warmup")
        if not (isinstance(self.tolerance_pp, (int, float)) and math.isfinite(self.tolerance_pp)
                and self.tolerance_pp >= 0):
            raise UserError(f"{flag('tolerance_pp')} must be a number >= 0 "
                            f"(got {self.tolerance_pp!r})")
        if not [p for p in str(self.precisions).split(",") if p.strip()]:
            raise UserError(f"{flag('precisions')} needs at least one precision, e.g. "
                            f"32-true,bf16-mixed")

    @property
    def speed_only(self) -> bool:
        return self.bench_steps is not None

    @property
    def timed_steps(self) -> int:
        return self.bench_steps if self.bench_steps is not None else self.timing_steps


def resolve_precisions(options: CompareOptions, device: torch.device) -> tuple[str, list[str]]:
    """(baseline, precisions): canonical names, ``auto`` resolved, baseline first, no repeats."""
    def canonical(name: str, option: str) -> str:
        try:
            return resolve_name(name.strip(), device)
        except UserError as exc:
            raise UserError(f"{flag(option)}: {exc}") from None

    names = [canonical(p, "precisions") for p in str(options.precisions).split(",") if p.strip()]
    baseline = canonical(options.baseline, "baseline")
    if baseline not in names:
        log.info("compare: adding the baseline %s to --precisions (speedups are relative to it)",
                 baseline)
    ordered = [baseline] + [p for p in names if p != baseline]
    return baseline, list(dict.fromkeys(ordered))


# ------------------------------------------------------------ run identity
def digest(values: Any) -> str:
    """sha256 of tensors (names, dtypes and exact bytes) or of JSON-able values."""
    h = hashlib.sha256()
    if isinstance(values, dict) and all(isinstance(v, torch.Tensor) for v in values.values()):
        for name in sorted(values):
            tensor = values[name].detach().cpu().contiguous().reshape(-1)
            h.update(f"{name}:{tensor.dtype}:{tuple(values[name].shape)}".encode())
            h.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    else:
        h.update(json.dumps(values).encode())
    return h.hexdigest()


class RunProbe:
    """Trainer callback proving that a run is comparable with the other precisions.

    At fit start (after the precision set the model up) it records: whether the model
    holds exactly the seed's initial weights as this precision stores them (fp32 modes
    bitwise; half-weight modes the same values rounded), a digest of the fp32 weights,
    a digest of the data order of every epoch, and the loss of the first step's batch
    re-evaluated in fp32 (autocast off, fp32 weights) -- equal across precisions when
    weights and data are.
    """

    def __init__(self, reference_state: dict[str, torch.Tensor]) -> None:
        self.reference = reference_state
        self.facts: dict[str, Any] = {}

    def on_fit_start(self, trainer: Trainer) -> None:
        live = trainer.model.state_dict()
        same = set(live) == set(self.reference) and all(
            torch.equal(self.reference[k].to(device=v.device, dtype=v.dtype), v)
            for k, v in live.items())
        fp32 = {k: v.detach().clone() for k, v in trainer.precision.fp32_state_dict(trainer.model).items()}
        plan = getattr(trainer.train_windows, "plan", None)
        order = None if plan is None else digest(
            {"global_batch": plan.global_batch,
             "orders": [plan.order(e) for e in range(trainer.config.schedule.epochs)]})
        self.facts = {"same_initial_weights": bool(same), "initial_weights_sha256": digest(fp32),
                      "data_order_sha256": order,
                      "first_step_loss_fp32": first_step_loss_fp32(trainer, fp32)}


def first_step_loss_fp32(trainer: Trainer, fp32_state: dict[str, torch.Tensor]) -> float | None:
    """Loss of the first training step's batch under fp32 weights with autocast off.

    Uses copies of the weights and buffers (BatchNorm statistics are not touched) and a
    forked RNG (dropout draws do not shift the run's random stream).
    """
    window = next(iter(trainer.train_windows.epoch(trainer.epoch, trainer.window_in_epoch)), None)
    if window is None:
        return None
    model = trainer.model
    state = {k: v.to(trainer.device) for k, v in fp32_state.items()}

    def fp32_model(*args: Any, **kwargs: Any) -> Any:
        return torch.func.functional_call(model, state, args, kwargs)

    total, samples = 0.0, 0
    devices = [] if trainer.device.type != "cuda" else \
        [trainer.device.index if trainer.device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices), torch.no_grad(), \
            torch.autocast(trainer.device.type, enabled=False):
        for batch, n in zip(window.micro_batches, window.micro_samples):
            loss, _, _ = forward_batch(fp32_model, batch, trainer.loss_fn)
            total += float(loss.float().item()) * n
            samples += n
    return total / max(samples, 1)


# ------------------------------------------------------------------ speed
def sync(device: torch.device) -> None:
    """Wait for the device: the clock may only be read once queued work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class Contender:
    """One precision in the speed/memory measurement: a prepared Trainer and its windows."""

    precision: str
    trainer: Trainer
    switches: MathSwitches
    windows: Iterator[Any]
    step_times_s: list[float] = dataclasses.field(default_factory=list)
    batch_samples: int = 0
    halted: str | None = None
    peak_mem_bytes: int | None = None
    total_steps: int = 0           # optimizer steps of a full training run with this config

    def step(self, timed: bool) -> None:
        """One optimizer step, timed between device syncs."""
        if self.halted:
            return
        self.switches.apply()
        window = next(self.windows)
        device = self.trainer.device
        sync(device)
        started = time.perf_counter()
        try:
            self.trainer.train_step(window)
            self.trainer.finish_step()
        except TrainingHalted as exc:
            self.halted = str(exc)
            log.info("compare: timing of %s stopped: %s", self.precision, exc)
            return
        sync(device)
        if timed:
            self.step_times_s.append(time.perf_counter() - started)
            self.batch_samples = window.global_samples


def build_contender(config: RunConfig, precision: str, needed_windows: int) -> Contender:
    """A Trainer set up exactly as a training run's (same seed, same model), writing nothing."""
    run_config = replace_options(config, precision=precision, out=None, resume=None,
                                     no_progress=True)
    data, model = prepare_run(run_config)
    trainer = Trainer(run_config)
    trainer.setup(model, data.train)
    switches = MathSwitches()
    # Only full global batches: a short last batch would make its step look faster.
    windows = [w for w in itertools.islice(trainer.train_windows.epoch(0), needed_windows + 1)
               if w.global_samples == run_config.batching.batch_size] or \
        list(itertools.islice(trainer.train_windows.epoch(0), 1))
    return Contender(precision, trainer, switches, itertools.cycle(windows[:needed_windows]),
                     total_steps=trainer.total_steps)


def release(contender: Contender) -> None:
    """Drop a contender's model and optimizer (and the cached device memory)."""
    contender.trainer = None  # type: ignore[assignment]
    contender.windows = iter(())
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def measure_speed_and_memory(config: RunConfig, precisions: list[str],
                             options: CompareOptions) -> dict[str, Contender]:
    """Time ``options.timed_steps`` steps per precision (warm-up excluded), then measure memory.

    Interleaved: all Trainers live at once and round r runs one step of each, in an
    order rotated by r so no precision always follows the same one. Not interleaved:
    one precision after another, one model in memory at a time.
    """
    warmup, timed = options.timing_warmup, options.timed_steps
    needed = warmup + timed
    if options.interleave:
        contenders = {p: build_contender(config, p, needed) for p in precisions}
        for r in range(needed):
            shift = r % len(precisions)
            for p in precisions[shift:] + precisions[:shift]:
                contenders[p].step(timed=r >= warmup)
        for c in contenders.values():
            c.peak_mem_bytes = measure_peak_memory(c)
            release(c)
        return contenders
    contenders = {}
    for p in precisions:
        c = contenders[p] = build_contender(config, p, needed)
        for r in range(needed):
            c.step(timed=r >= warmup)
        c.peak_mem_bytes = measure_peak_memory(c)
        release(c)
    return contenders


# ----------------------------------------------------------------- memory
def state_bytes(trainer: Trainer) -> int:
    """Bytes of the model's weights and buffers and the optimizer's parameters and state
    (fp32 master copies included), each storage counted once."""
    tensors = itertools.chain(
        trainer.model.parameters(), trainer.model.buffers(),
        (p for group in trainer.optimizer.param_groups for p in group["params"]),
        (v for s in trainer.optimizer.state.values() for v in s.values()
         if isinstance(v, torch.Tensor)))
    seen: set[tuple[str, int]] = set()
    total = 0
    for t in tensors:
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


@contextlib.contextmanager
def transient_peak(device: torch.device) -> Iterator[dict[str, int]]:
    """Largest amount of device memory PyTorch held above the level at entry, in bytes."""
    result = {"bytes": 0}
    if device.type == "cuda":
        sync(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield result
        sync(device)
        result["bytes"] = max(0, torch.cuda.max_memory_allocated(device) - start)
        return
    from torch.profiler import ProfilerActivity, profile

    with _native_stderr_silenced(), \
            profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield result
    result["bytes"] = _peak_of_allocation_events(prof)


@contextlib.contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """Hide the profiler's native start/stop lines (written straight to file descriptor 2)."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # pragma: no cover - no usable descriptor 2
        yield
        return
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _peak_of_allocation_events(prof: Any) -> int:
    """Running sum of the profiler's CPU allocation (+) and free (-) events; its maximum.

    The raw events carry every allocation with its size and time; the per-operator view
    only keeps each operator's net change, which would hide peaks inside an operator.
    """
    events = []
    raw = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if raw is not None:
        events = [(e.start_ns(), e.nbytes()) for e in raw.events()
                  if e.name() == "[memory]" and str(e.device_type()).endswith("CPU")]
    else:  # pragma: no cover - older profilers: per-operator net changes (a lower bound)
        events = [(e.time_range.start, e.self_cpu_memory_usage) for e in prof.events()]
    level = peak = 0
    for _, nbytes in sorted(events):
        level += nbytes
        peak = max(peak, level)
    return peak


def measure_peak_memory(contender: Contender) -> int | None:
    """Model state plus the largest transient of :data:`MEMORY_STEPS` training steps."""
    if contender.halted:
        return None
    trainer = contender.trainer
    contender.switches.apply()
    with transient_peak(trainer.device) as transient:
        for _ in range(MEMORY_STEPS):
            trainer.train_step(next(contender.windows))
            trainer.finish_step()
    return state_bytes(trainer) + transient["bytes"]


# --------------------------------------------------------------- training
def train_runs(config: RunConfig, precisions: list[str], seeds: list[int], out: Path
               ) -> list[dict[str, Any]]:
    """Each precision x seed as a normal training run; returns one record per run."""
    runs: list[dict[str, Any]] = []
    total = len(precisions) * len(seeds)
    for seed in seeds:
        _, reference_model = prepare_run(replace_options(config, seed=seed))
        reference = {k: v.detach().clone() for k, v in reference_model.state_dict().items()}
        del reference_model
        for precision in precisions:
            run_dir = out / "runs" / precision / f"seed-{seed}"
            run_config = replace_options(config, precision=precision, seed=seed,
                                             out=str(run_dir), resume=None)
            log.info("compare: run %d/%d: %s, seed %d -> %s", len(runs) + 1, total, precision,
                     seed, run_dir)
            probe = RunProbe(reference)
            started = time.perf_counter()
            record: dict[str, Any] = {"precision": precision, "seed": seed,
                                      "dir": str(run_dir.relative_to(out))}
            try:
                result = run_training(run_config, callbacks=[probe])
            except TrainingHalted as exc:
                log.info("compare: %s seed %d stopped: %s", precision, seed, exc)
                record.update(val_acc=None, val_loss=None, final_loss=None, skipped_steps=None,
                              steps=None, halted=str(exc), train_samples_per_s=None)
            else:
                record.update(val_acc=_finite(result.val_acc), val_loss=_finite(result.val_loss),
                              final_loss=_finite(result.final_loss),
                              skipped_steps=result.skipped_steps, steps=result.steps, halted=None,
                              train_samples_per_s=result.samples_per_s)
            record["wall_s"] = round(time.perf_counter() - started, 3)
            record.update(probe.facts)
            runs.append(record)
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    _check_comparable(runs)
    return runs


def _check_comparable(runs: list[dict[str, Any]]) -> None:
    """Say loudly when runs of one seed did not start alike (the A/B would be unfair)."""
    for seed in sorted({r["seed"] for r in runs}):
        group = [r for r in runs if r["seed"] == seed and r.get("data_order_sha256")]
        if len({r["data_order_sha256"] for r in group}) > 1:
            log.warning("compare: seed %d: the precisions saw different data orders", seed)
        for r in runs:
            if r["seed"] == seed and r.get("same_initial_weights") is False:
                log.warning("compare: seed %d: %s did not start from the seed's initial weights "
                            "(is the model factory seeded?)", seed, r["precision"])


# ---------------------------------------------------------------- summary
def _finite(value: float | None) -> float | None:
    """JSON has no NaN or inf: a diverged value is reported as null."""
    return value if value is not None and math.isfinite(value) else None


def _mean(values: list[float]) -> float | None:
    return float(statistics.fmean(values)) if values else None


def _std(values: list[float]) -> float | None:
    """Sample standard deviation across seeds (0 for a single seed)."""
    if not values:
        return None
    return float(statistics.stdev(values)) if len(values) > 1 else 0.0


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def verdict(delta_acc_pp: float | None, tolerance_pp: float) -> str | None:
    """``ok`` within the tolerance, else ``worse`` or ``better``; None without accuracy."""
    if delta_acc_pp is None:
        return None
    if abs(delta_acc_pp) <= tolerance_pp + 1e-9:
        return "ok"
    return "worse" if delta_acc_pp < 0 else "better"


def summarise(baseline: str, precisions: list[str], runs: list[dict[str, Any]],
              speed: dict[str, dict[str, Any]], tolerance_pp: float) -> list[dict[str, Any]]:
    """One summary row per precision, baseline first, with exactly :data:`SUMMARY_FIELDS`.

    ``speed[p]`` holds ``samples_per_s``, ``step_time_ms`` and ``peak_mem_bytes`` measured
    for precision ``p`` in this invocation; ratios are taken against ``speed[baseline]``.
    """
    def accuracies(p: str) -> list[float]:
        return [r["val_acc"] for r in runs if r["precision"] == p and r.get("val_acc") is not None]

    base_speed = speed.get(baseline, {})
    base_acc = _mean(accuracies(baseline))
    rows = []
    for p in precisions:
        mine = [r for r in runs if r["precision"] == p]
        accs = accuracies(p)
        acc_mean = _mean(accs)
        delta = (acc_mean - base_acc) * 100 if acc_mean is not None and base_acc is not None \
            else None
        halted = any(r.get("halted") for r in mine)
        s = speed.get(p, {})
        row = {
            "precision": p,
            "samples_per_s": s.get("samples_per_s"),
            "speedup": _ratio(s.get("samples_per_s"), base_speed.get("samples_per_s")),
            "step_time_ms": s.get("step_time_ms"),
            "peak_mem_bytes": s.get("peak_mem_bytes"),
            "mem_ratio": _ratio(s.get("peak_mem_bytes"), base_speed.get("peak_mem_bytes")),
            "val_acc_mean": acc_mean,
            "val_acc_std": _std(accs),
            "delta_acc_pp": delta,
            "final_loss_mean": _mean([r["final_loss"] for r in mine
                                      if r.get("final_loss") is not None]),
            "skipped_steps": sum(r["skipped_steps"] for r in mine
                                 if r.get("skipped_steps") is not None) if mine else None,
            "verdict": "failed" if halted else verdict(delta, tolerance_pp),
        }
        rows.append({k: row[k] for k in SUMMARY_FIELDS})
    return rows


def speed_figures(contender: Contender) -> dict[str, Any]:
    """Median step time and the throughput derived from it, plus the spread of the samples."""
    times = contender.step_times_s
    if not times:
        return {"samples_per_s": None, "step_time_ms": None,
                "peak_mem_bytes": contender.peak_mem_bytes, "halted": contender.halted}
    median = statistics.median(times)
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [median, median, median]
    return {"samples_per_s": contender.batch_samples / median, "step_time_ms": median * 1e3,
            "step_time_p25_ms": q[0] * 1e3, "step_time_p75_ms": q[2] * 1e3,
            "step_times_ms": [round(t * 1e3, 4) for t in times],
            "batch_samples": contender.batch_samples,
            "peak_mem_bytes": contender.peak_mem_bytes, "halted": contender.halted}


# ------------------------------------------------------------------ study
def check_out(out: Path) -> None:
    """Refuse to mix a new study into a directory that already holds one."""
    if (out / "compare.json").exists() or (out / "runs").exists():
        raise UserError(f"--out {out} already holds a compare study; choose another --out")


def run_compare(config: RunConfig, options: CompareOptions, *, command: str | None = None,
                pick_log_every: bool = True) -> dict[str, Any]:
    """Run the whole study into ``config.out``; returns compare.json's content.

    ``config`` holds the training options shared by every run (its ``precision`` and
    ``seed`` are set per run: seeds ``config.seed`` .. ``config.seed + seeds - 1``).
    With ``pick_log_every`` --log-every is chosen for smooth loss curves.
    """
    from . import report

    if config.checkpointing.resume:
        raise UserError("compare starts every run fresh: drop --resume")
    if not config.out:
        raise UserError("compare needs --out DIR")
    out = Path(config.out)
    check_out(out)
    device = resolve_device(config.device)
    baseline, precisions = resolve_precisions(options, device)
    seeds = [config.seed + i for i in range(options.seeds)]
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()

    log.info("compare: timing %s (%d warm-up + %d timed steps each, %s)", ", ".join(precisions),
             options.timing_warmup, options.timed_steps,
             "interleaved" if options.interleave else "one after another")
    contenders = measure_speed_and_memory(config, precisions, options)
    speed = {p: speed_figures(c) for p, c in contenders.items()}
    if pick_log_every:
        steps = contenders[baseline].total_steps
        config = replace_options(config, log_every=max(1, steps // CURVE_POINTS))
    runs = [] if options.speed_only else train_runs(config, precisions, seeds, out)

    result = {"baseline": baseline, "runs": runs,
              "summary": summarise(baseline, precisions, runs, speed, options.tolerance_pp)}
    (out / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
    study = {
        "command": command, "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
        "duration_s": round(time.time() - started, 1), "device": str(device),
        "config": {k: v for k, v in to_dict(config).items() if k not in ("precision", "out")},
        "options": dataclasses.asdict(options), "seeds": seeds, "speed": speed,
        "memory_method": memory_method(device), "env": collect_env(),
    }
    (out / "study.json").write_text(json.dumps(study, indent=2) + "\n")
    report.write_reports(out)
    return result


def memory_method(device: torch.device) -> str:
    """What peak_mem_bytes means on ``device`` (printed in the report)."""
    source = ("torch.cuda.max_memory_allocated" if device.type == "cuda" else
              "the CPU allocator's allocation events recorded by torch.profiler "
              "(process RSS cannot be reset between precisions)")
    return (f"model state (weights, buffers, optimizer state, master copies) + the largest "
            f"transient of {MEMORY_STEPS} training steps above it (activations, gradients, "
            f"autocast copies), from {source}. Memory outside PyTorch's allocator (library "
            f"workspaces) is not included.")
