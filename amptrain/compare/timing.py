"""Speed and memory, measured the fair way: one set-up Trainer per precision in this
process, timed steps alternating between them, a device sync around each, medians."""
from __future__ import annotations

import dataclasses
import gc
import itertools
import logging
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..config import RunConfig
from ..common import clock
from ..common.errors import TrainingHalted
from ..trainer.memory import MemoryMeter
from ..precision.tf32 import MathSwitches
from ..workflows.runner import assemble
from ..tasks import Task
from ..trainer import Trainer
from ..trainer.loop import TaskLoop
from .ladder import inner_tensors, memory_ladder
from .options import MEMORY_STEPS, CompareOptions
from .rows import row_config

log = logging.getLogger("amptrain")


def sync(device: torch.device) -> None:
    """Wait for the device: the clock may only be read once queued work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


#: The lane of the A/A control (the baseline set up a second time) while timing.
_CONTROL = "A/A control"


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
    ladder: dict[str, Any] | None = None   # exact bytes per kind of state (compare/ladder.py)
    task: Task | None = None       # what the runs learn (names compare's metric fields)
    #: The A/A control lane's step times (the baseline only: set up twice, timed in the
    #: same rounds), which show how far apart two identical lanes measure.
    control_times_s: list[float] = dataclasses.field(default_factory=list)
    #: Optimizer steps timed as one (the task's timed_unit: PPO's whole update, rollout
    #: included); a step time is the unit's time over its steps.
    unit: int = 1

    def step(self, timed: bool) -> None:
        """One timed unit of optimizer steps, between device syncs."""
        if self.halted:
            return
        self.switches.apply()
        device = self.trainer.device
        sync(device)
        started = clock.now()
        try:
            if self.task is not None and self.task.iteration.owns:
                # The task's own iteration for one unit (PPO: a rollout and its update),
                # without the loop's logs, evaluations and checkpoints.
                loop = TaskLoop(self.trainer, bare_steps=self.unit)
                self.task.iteration.iterate(loop)
                window = loop.last_window
            else:
                for _ in range(self.unit):
                    window = next(self.windows)
                    self.trainer.train_step(window)
                    self.trainer.finish_step()
        except TrainingHalted as exc:
            self.halted = str(exc)
            log.info("compare: timing of %s stopped: %s", self.precision, exc)
            return
        sync(device)
        if timed:
            self.step_times_s.append((clock.now() - started) / self.unit)
            self.batch_samples = window.global_samples


def build_contender(config: RunConfig, precision: str, needed_windows: int) -> Contender:
    """A Trainer set up exactly as a training run's (same seed, same model), writing nothing."""
    run_config = row_config(precision, config, out=None, resume=None, no_progress=True)
    run = assemble(run_config)  # the run's task too (--model dcgan trains the gan task)
    run_config = run.config     # with what the task decides (ppo: its minibatch, length)
    trainer = Trainer(run_config)
    trainer.setup(run.model, run.data.train, task=run.task)
    switches = MathSwitches()
    epochs = trainer.train_windows
    assert epochs is not None  # set up
    # Only full global batches: a short last batch would make its step look faster.
    windows = [w for w in itertools.islice(epochs.epoch(0), needed_windows + 1)
               if w.global_samples == run_config.batching.batch_size] or \
        list(itertools.islice(epochs.epoch(0), 1))
    return Contender(precision, trainer, switches, itertools.cycle(windows[:needed_windows]),
                     total_steps=trainer.total_steps, task=trainer.task,
                     unit=trainer.task.iteration.timed_unit() if trainer.task is not None else 1)


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

    ``precisions[0]`` is the baseline: it is set up twice, and its second copy (the A/A
    control lane) is timed like any precision; its times go to the baseline's
    ``control_times_s``, not to a row of its own.

    Interleaved: all Trainers live at once and round r runs one step of each, in an
    order rotated by r so no precision always follows the same one. Not interleaved:
    one precision after another, one model in memory at a time, the control last.
    """
    warmup, timed = options.timing_warmup, options.timed_steps
    needed = warmup + timed
    lanes = list(precisions) + [_CONTROL]

    def build(lane: str) -> Contender:
        return build_contender(config, precisions[0] if lane == _CONTROL else lane, needed)

    def finish(c: Contender, lane: str) -> None:
        if lane != _CONTROL:  # the control's memory is the baseline's
            c.peak_mem_bytes = measure_peak_memory(c)
        release(c)

    if options.interleave:
        contenders = {lane: build(lane) for lane in lanes}
        for r in range(needed):
            shift = r % len(lanes)
            for lane in lanes[shift:] + lanes[:shift]:
                contenders[lane].step(timed=r >= warmup)
        for lane, c in contenders.items():
            finish(c, lane)
    else:
        contenders = {}
        for lane in lanes:
            c = contenders[lane] = build(lane)
            for r in range(needed):
                c.step(timed=r >= warmup)
            finish(c, lane)
    control = contenders.pop(_CONTROL)
    contenders[precisions[0]].control_times_s = control.step_times_s
    return contenders


def state_bytes(trainer: Trainer) -> int:
    """Bytes of the model's weights and buffers and every part's optimizer parameters and
    state (fp32 master copies included), each storage counted once."""
    model, optimizers = trainer.model, list(trainer.optimizers.values())
    assert model is not None and optimizers, "set up first"
    tensors = itertools.chain(
        model.parameters(), model.buffers(),
        (p for optimizer in optimizers for group in optimizer.param_groups
         for p in group["params"]),
        trainer.precision.weight_rule_buffers(),
        # Quantised states (adamw8bit) are tensor subclasses: count their inner tensors.
        (t for optimizer in optimizers for s in optimizer.state.values() for v in s.values()
         for t in inner_tensors(v)))
    seen: set[tuple[str, int]] = set()
    total = 0
    for t in tensors:
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def measure_peak_memory(contender: Contender) -> int | None:
    """Model state plus the largest transient of :data:`MEMORY_STEPS` training steps (and,
    on the contender, the memory ladder of its stepped model)."""
    if contender.halted:
        return None
    trainer = contender.trainer
    parts = list(trainer.parts.values())
    assert parts, "set up first"
    if len(parts) == 1:  # the ladder splits one model's state by kind
        contender.ladder = memory_ladder(parts[0].module, parts[0].optimizer,
                                         trainer.precision)
    contender.switches.apply()
    with MemoryMeter(trainer.device, "tensors").span() as transient:
        for _ in range(MEMORY_STEPS):
            trainer.train_step(next(contender.windows))
            trainer.finish_step()
    return state_bytes(trainer) + transient["bytes"]


def speed_figures(contender: Contender) -> dict[str, Any]:
    """Median step time and the throughput derived from it, plus the spread of the samples."""
    times = contender.step_times_s
    if not times:
        return {"samples_per_s": None, "step_time_ms": None,
                "peak_mem_bytes": contender.peak_mem_bytes, "halted": contender.halted,
                **(contender.ladder or {})}
    median = statistics.median(times)
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [median, median, median]
    return {"samples_per_s": contender.batch_samples / median, "step_time_ms": median * 1e3,
            "step_time_p25_ms": q[0] * 1e3, "step_time_p75_ms": q[2] * 1e3,
            "step_times_ms": [round(t * 1e3, 4) for t in times],
            **({"control_step_times_ms": [round(t * 1e3, 4) for t in contender.control_times_s]}
               if contender.control_times_s else {}),
            "batch_samples": contender.batch_samples, "timed_unit_steps": contender.unit,
            "peak_mem_bytes": contender.peak_mem_bytes, "halted": contender.halted,
            **(contender.ladder or {})}


def memory_method(device: torch.device) -> str:
    """What peak_mem_bytes means on ``device`` (printed in the report)."""
    source = ("torch.cuda.max_memory_allocated" if device.type == "cuda" else
              "the CPU allocator's allocation events recorded by torch.profiler "
              "(process RSS cannot be reset between precisions)")
    return (f"model state (weights, buffers, optimizer state, master copies) + the largest "
            f"transient of {MEMORY_STEPS} training steps above it (activations, gradients, "
            f"autocast copies), from {source}. Memory outside PyTorch's allocator (library "
            f"workspaces) is not included.")
