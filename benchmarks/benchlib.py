"""What the benchmark scripts share: workloads, the hand-written reference loop, the
Trainer driven epoch by epoch, interleaved timing, machine facts, and the results record.

Every comparison runs its variants in one process, interleaved (A B, then B A, ...) so
that a machine that gets busier or quieter affects all of them alike; warm-up rounds
are excluded and medians are reported.
"""
from __future__ import annotations

import copy
import ctypes
import datetime as _dt
import functools
import io
import itertools
import math
import os
import platform
import random
import shlex
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing amptrain
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from amptrain.data import DataOptions, TensorData, build_data  # noqa: E402
from amptrain.models import build_model, is_conv_net  # noqa: E402
from amptrain.trainer import Trainer, seed_everything  # noqa: E402
from amptrain.workflows.runner import model_inputs  # noqa: E402

RESULTS = ROOT / "benchmarks" / "RESULTS.md"
AUTOCAST_DTYPE = {"32-true": None, "tf32": None, "bf16-mixed": torch.bfloat16,
                  "16-mixed": torch.float16}


# ------------------------------------------------------------------ workloads
@dataclass(frozen=True)
class Workload:
    """A model and data to train: built-in names, so every script means the same thing."""

    name: str
    model: str
    data: str
    batch_size: int
    note: str = ""

    def build(self, seed: int = 0) -> tuple[nn.Module, TensorData]:
        """A freshly initialised model (same seed, same weights) and the training split."""
        bundle = build_data(self.data, DataOptions(seed=seed))
        seed_everything(seed)
        return build_model(self.model, model_inputs(bundle)), bundle.train


#: The CPU workloads (sizes chosen so that one epoch is a few dozen steps).
CPU_WORKLOADS = {
    "mlp": Workload("mlp", "mlp:hidden=512", "synthetic-image:samples=3200,size=32", 128,
                    "MLP 3072-512-512-10 on 3x32x32 images"),
    # Issue 47: a step of almost no work, where the Trainer's own per-step Python shows.
    "tiny-mlp": Workload("tiny-mlp", "mlp:hidden=64", "digits", 8,
                         "MLP 64-64-64-10 on digits (8x8), batch 8"),
    "cnn": Workload("cnn", "cnn", "synthetic-image:samples=1600,size=32", 64,
                    "SmallCNN (width 32) on 3x32x32 images"),
    "cnn-wide": Workload("cnn-wide", "cnn:width=64", "synthetic-image:samples=800,size=32", 32,
                         "SmallCNN (width 64) on 3x32x32 images"),
    "transformer": Workload("transformer", "transformer",
                            "synthetic-seq:samples=3200,length=64", 64,
                            "BERT-tiny (d 128, 2 layers, 2 heads, ff 512), 64 tokens"),
    "transformer-base": Workload("transformer-base",
                                 "transformer:d_model=256,layers=4,heads=4,ff=1024",
                                 "synthetic-seq:samples=1600,length=128", 32,
                                 "d 256, 4 layers, 4 heads, ff 1024, 128 tokens"),
}
# The same transformers without dropout: on a CPU, dropout's random numbers (bernoulli_)
# cost the same in every precision and take a third of a bf16 step of BERT-tiny.
for _name in ("transformer", "transformer-base"):
    _w = CPU_WORKLOADS[_name]
    _spec = _w.model + ("," if ":" in _w.model else ":") + "dropout=0"
    CPU_WORKLOADS[_name + "-nodrop"] = Workload(_name + "-nodrop", _spec, _w.data, _w.batch_size,
                                                _w.note + ", no dropout")

#: What both loops share besides the model: AdamW (fused), cosine schedule, no clipping.
LR, WEIGHT_DECAY = 1e-3, 0.01
SGD_LR = 0.05


def cosine_factor(total_steps: int) -> Callable[[int], float]:
    """The cosine schedule amptrain uses with no warm-up (for the hand-written loop)."""
    total = max(1, total_steps)
    return lambda step: 0.5 * (1.0 + math.cos(math.pi * min(1.0, step / total)))


# ------------------------------------------------------------------- relay
class Relay:
    """Runs several training loops in turn, ``block`` steps each, and times every turn.

    Each loop runs on a thread of its own and pulls its batches through :meth:`feed`; a
    baton passed at every ``block``-th batch makes sure exactly one loop runs at any time
    (only the loops' set-up, before their first batch, is not serialised; it is not timed).
    A turn's time runs from receiving the baton to asking for the first batch of the next
    turn, so it holds everything a loop does per step: fetching data, forward, backward,
    optimizer, scheduler, logging, bookkeeping. Consecutive turns of different loops see the
    same machine load, so the per-round ratios hold up on a busy machine where absolute
    times do not. A round is one turn of every loop, in a random order.

    On CUDA the device is synchronised at turn boundaries only, so work inside a turn
    stays asynchronous as it would in training.
    """

    def __init__(self, names: list[str], block: int, device: torch.device,
                 clock: Callable[[], float] | None = None) -> None:
        self.names = list(names)
        self.block = block
        self.device = device
        self.clock = clock or default_clock(device)
        self.times: dict[str, list[float]] = {n: [] for n in names}
        self._live = list(names)
        self._current, self._queue = names[0], list(names[1:])
        self._rng = random.Random(0)
        self._cond = threading.Condition()
        self._threads = torch.get_num_threads()
        self._errors: list[BaseException] = []

    # -- inside a loop
    def feed(self, name: str, iterable: Iterable[Any]) -> Iterator[Any]:
        """``iterable``'s items, handing the baton on after every ``block`` of them."""
        state = self._state.setdefault(name, {"count": 0, "t0": None})
        for item in iterable:
            if state["t0"] is None:
                state["t0"] = self._start_turn(name)
            elif state["count"] == self.block:
                synchronize(self.device)
                self.times[name].append(self.clock() - state["t0"])
                self._pass(name)
                state["t0"] = self._start_turn(name)
                state["count"] = 0
            state["count"] += 1
            yield item

    def _start_turn(self, name: str) -> float:
        with self._cond:
            self._cond.wait_for(lambda: self._current == name or self._errors)
        if self._errors:
            raise RuntimeError("another loop failed")
        synchronize(self.device)
        return self.clock()

    def _pass(self, name: str, leaving: bool = False) -> None:
        # Every round visits the loops in a fresh random order, never the same loop twice
        # in a row: over many rounds no loop is favoured by its position in the round or
        # by which loop ran before it (and left its data in the caches). A fixed order
        # measured a 2% bias in A/A runs, a serpentine one (A B C C B A) more, since the
        # loops at its ends run twice in a row on warm caches.
        with self._cond:
            if leaving:
                self._live.remove(name)
            self._queue = [n for n in self._queue if n in self._live]
            if not self._queue and self._live:
                order = list(self._live)
                self._rng.shuffle(order)
                if len(order) > 1 and order[0] == name:
                    order.append(order.pop(0))
                self._queue = order
            self._current = self._queue.pop(0) if self._queue else None
            self._cond.notify_all()

    # -- outside
    def run(self, loops: dict[str, Callable[[], Any]]) -> dict[str, list[float]]:
        """Run ``loops`` (name -> function running the whole loop) to completion."""
        self._state: dict[str, dict[str, Any]] = {}

        def body(name: str) -> None:
            torch.set_num_threads(self._threads)  # a new thread starts with the default
            try:
                loops[name]()
            except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
                self._errors.append(exc)
            finally:
                self._pass(name, leaving=True)

        # Every loop gets a thread of its own (none runs on the calling thread): the
        # main thread differs (its own malloc arena, for one) and measured 2-4% slower
        # in A/A runs of two identical loops.
        threads = [threading.Thread(target=body, args=(n,), name=f"relay-{n}", daemon=True)
                   for n in self.names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self._errors:
            raise self._errors[0]
        return self.times


# --------------------------------------------------------- hand-written loop
class RawLoop:
    """The plain PyTorch AMP recipe, written out by hand, with the Trainer's maths.

    Same model (a deep copy), same data kept on the device and shuffled per epoch, AdamW
    (fused) with the same parameter groups, the same cosine schedule, a GradScaler for
    fp16 only, ``zero_grad(set_to_none=True)``, and every ``log_every`` steps the same
    reads as the Trainer: mean loss, lr, loss scale and the unscaled gradient norm.

    ``fp16_conv_fix`` routes convolutions through amptrain's CPU fp16 convolution (fp16
    forward, fp32 backward rounded to fp16), so that on a CPU without AMX-FP16 the
    hand-written loop runs the same kernels as the Trainer's 16-mixed instead of
    PyTorch's ~100x slower fp16 convolution backward.
    """

    def __init__(self, model: nn.Module, data: TensorData, *, precision: str, batch_size: int,
                 total_steps: int, device: torch.device, log_every: int = 10,
                 channels_last: bool = False, fp16_conv_fix: bool = True, seed: int = 0
                 ) -> None:
        self.device = device
        model = model.to(device)
        if channels_last and is_conv_net(model):
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        self.dtype = AUTOCAST_DTYPE[precision]
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            torch.backends.cudnn.allow_tf32 = precision != "32-true"
        if fp16_conv_fix and self.dtype is torch.float16 and device.type == "cpu":
            from amptrain.precision.islands import ForwardPatches, install_cpu_fp16_conv
            install_cpu_fp16_conv(ForwardPatches(), model, skip=set())
        decay = [p for p in model.parameters() if p.ndim > 1]
        no_decay = [p for p in model.parameters() if p.ndim <= 1]
        self.params = decay + no_decay
        groups = [{"params": decay, "weight_decay": WEIGHT_DECAY},
                  {"params": no_decay, "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=LR, fused=True)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer,
                                                           cosine_factor(total_steps))
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.dtype is torch.float16)
        self.x, self.y = (t.to(device) for t in data.tensors)
        self.batch_size, self.log_every, self.seed = batch_size, log_every, seed
        self.total_steps = total_steps
        self.step = 0
        self.loss_sum = torch.zeros((), device=device)
        self.loss_count = 0
        self.sink = io.StringIO()
        self.model.train()

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.x) / self.batch_size)

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Device-side batches, reshuffled every epoch, for ``total_steps`` steps."""
        epoch = 0
        while True:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            order = torch.randperm(len(self.x), generator=generator).to(self.device)
            b = self.batch_size
            for i in range(self.steps_per_epoch):
                index = order[i * b:(i + 1) * b]
                yield self.x[index], self.y[index]
            epoch += 1

    def loss(self, outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy over classes (a language model's loop flattens the tokens)."""
        return F.cross_entropy(outputs, y)

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        log = (self.step + 1) % self.log_every == 0
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None):
            loss = self.loss(self.model(x), y)
        self.scaler.scale(loss).backward()
        if log:
            self.scaler.unscale_(self.optimizer)
            grad_norm = torch.nn.utils.get_total_norm(
                [p.grad for p in self.params if p.grad is not None], foreach=True)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.loss_sum += loss.detach()
        self.loss_count += 1
        self.step += 1
        if log:
            mean_loss = (self.loss_sum / self.loss_count).item()
            scale = self.scaler.get_scale() if self.scaler.is_enabled() else None
            print(f"step {self.step} loss {mean_loss:.4f} lr {self.scheduler.get_last_lr()[0]:.3g} "
                  f"scale {scale} grad_norm {grad_norm.item():.3g}", file=self.sink)
            self.loss_sum.zero_()
            self.loss_count = 0

    def run(self, feed: Callable[[Iterable[Any]], Iterable[Any]] = iter) -> None:
        """The whole loop: ``total_steps`` steps over :meth:`batches` (through ``feed``)."""
        for x, y in feed(itertools.islice(self.batches(), self.total_steps)):
            self.train_step(x, y)


# -------------------------------------------------------------- the Trainer
class _FedWindows:
    """A Trainer's windows with every epoch's iterator passed through ``feed``."""

    def __init__(self, inner: Any, feed: Callable[[Iterable[Any]], Iterable[Any]]) -> None:
        self._inner, self._feed = inner, feed

    def __len__(self) -> int:
        return len(self._inner)

    def epoch(self, epoch: int, start: int = 0) -> Iterable[Any]:
        return self._feed(self._inner.epoch(epoch, start))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class TrainerLoop:
    """An amptrain Trainer set up for ``total_steps`` steps, run through its real loop."""

    def __init__(self, model: nn.Module, data: TensorData, *, precision: str, batch_size: int,
                 total_steps: int, device: torch.device, log_every: int = 10,
                 channels_last: bool = False, torch_optimizer: torch.optim.Optimizer | None = None,
                 **options: Any) -> None:
        options.setdefault("optimizer", "adamw")
        options.setdefault("lr", LR if options["optimizer"] == "adamw" else SGD_LR)
        self.trainer = Trainer(precision=precision, batch_size=batch_size, epochs=10 ** 6,
                               max_steps=total_steps, device=str(device),
                               weight_decay=WEIGHT_DECAY, scheduler="cosine", log_every=log_every,
                               channels_last=channels_last, no_progress=True, **options)
        self.trainer.setup(model, data, optimizer=torch_optimizer)
        # The log lines go where the hand-written loop's go: a buffer, not the terminal.
        self.trainer.logger.stream = io.StringIO()

    @property
    def steps_per_epoch(self) -> int:
        return len(self.trainer.train_windows)

    def run(self, feed: Callable[[Iterable[Any]], Iterable[Any]] = iter) -> None:
        t = self.trainer
        inner = t.train_windows
        t.train_windows = _FedWindows(inner, feed)
        try:
            t.run()
        finally:
            t.train_windows = inner


def _windows_forever(trainer: Trainer) -> Iterator[Any]:
    epoch = 0
    while True:
        yield from trainer.train_windows.epoch(epoch)
        epoch += 1


def interleaved_step_times(trainers: dict[str, Trainer], warmup: int,
                           steps: int) -> dict[str, list[float]]:
    """Seconds per optimizer step of each set-up Trainer, the Trainers taking one step in
    turn (A B C, A B C, ...); the first ``warmup`` rounds are not recorded."""
    windows = {name: _windows_forever(trainer) for name, trainer in trainers.items()}
    times: dict[str, list[float]] = {name: [] for name in trainers}
    for step in range(warmup + steps):
        for name, trainer in trainers.items():
            window = next(windows[name])
            started = time.perf_counter()
            trainer.train_step(window)
            trainer.finish_step()
            synchronize(trainer.device)
            if step >= warmup:
                times[name].append(time.perf_counter() - started)
    return times


def without_gradient_check(trainer: Trainer) -> None:
    """For measuring only: skip the per-step inf/NaN check of the gradients that 32-true
    and bf16-mixed do (the flag handed to the optimizer is a constant 0)."""
    guard = trainer.precision.guard
    if not hasattr(guard, "_found_inf") or guard.scale_tensor is not None:
        raise ValueError("only modes without a loss scaler have a separate gradient check")
    zero = torch.zeros((), device=trainer.device)

    def unscale_(optimizer: torch.optim.Optimizer) -> None:
        guard._found_inf[id(optimizer)] = zero

    guard.unscale_ = unscale_


# ------------------------------------------------------------------- timing
def default_clock(device: torch.device) -> Callable[[], float]:
    """The clock turns are timed with.

    On a CPU with one intra-op thread: the calling thread's CPU time. On a machine shared
    with other jobs the wall clock also counts the time the scheduler gave the cores to
    someone else, which on this 2-core development machine swings step times by 2x from
    one second to the next; the thread's CPU time does not (every op of a CPU training
    step, backward included, runs on the calling thread when torch has one thread).
    Otherwise (several threads, or a GPU): the wall clock.
    """
    if device.type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


def clock_name(device: torch.device) -> str:
    return "thread CPU time" if default_clock(device) is time.thread_time else "wall-clock time"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def relay(loops: dict[str, Any], block: int, device: torch.device,
          group: int = 1) -> dict[str, list[float]]:
    """Run objects with ``run(feed)`` in a :class:`Relay`; seconds per ``group`` turns.

    ``block=1, group=10`` times 10 steps of every loop like ``block=10`` does, but with
    the loops alternating after every step, so that each step is measured next to the
    other loops' steps (the best pairing on a busy machine; on a GPU it would cost a
    synchronisation per step, so there turns are longer).
    """
    r = Relay(list(loops), block, device)
    times = r.run({name: functools.partial(loop.run, functools.partial(r.feed, name))
                   for name, loop in loops.items()})
    return {name: [sum(t[i:i + group]) for i in range(0, len(t) - group + 1, group)]
            for name, t in times.items()}


def turn_plan(device: torch.device, steps: int) -> tuple[int, int]:
    """(block, group) to time ``steps``-step units: one step per turn on a CPU, whole units
    per turn on a GPU (synchronising it after every step would change what is measured)."""
    return (1, steps) if device.type == "cpu" else (steps, 1)


def median(values: list[float]) -> float:
    return statistics.median(values)


def spread(values: list[float]) -> str:
    """Half the interquartile range relative to the median, e.g. '+-3%'."""
    if len(values) < 4:
        return "-"
    q = statistics.quantiles(values, n=4)
    return f"+-{(q[2] - q[0]) / 2 / statistics.median(values) * 100:.1f}%"


def span(values: list[float]) -> str:
    """Each value, e.g. '0.99 1.01 1.00' (repeats of a ratio)."""
    return " ".join(f"{v:.3f}" for v in values)


def pair_ratios(a: list[float], b: list[float]) -> list[float]:
    """Per-round ratios a/b (consecutive turns, so each pair saw the same load)."""
    return [x / y for x, y in zip(a, b)]


# ----------------------------------------------------------------- machine
def loadavg() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def machine() -> dict[str, Any]:
    """What the numbers were measured on (from amptrain.precision.hardware.probe and the OS)."""
    from amptrain.precision.hardware.probe import collect_env

    env = collect_env()
    flags = [k for k, v in (env.get("cpu_flags") or {}).items() if v]
    gpus = env.get("gpus") or []
    return {
        "date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        "cpu": env["cpu"], "cores": os.cpu_count(), "threads": torch.get_num_threads(),
        "cpu_flags": flags, "gpu": ", ".join(g.get("name", "?") for g in gpus) or None,
        "torch": torch.__version__, "cuda": env.get("cuda"), "python": platform.python_version(),
        "load": loadavg(),
    }


def machine_line(m: dict[str, Any]) -> str:
    hw = m["gpu"] or (f"{m['cpu']} ({m['cores']} cores; "
                      f"{', '.join(m['cpu_flags']) or 'no AMX/AVX512 flags'})")
    return (f"{m['date']}, {hw}, torch {m['torch']}, {m['threads']} intra-op thread(s), "
            f"load average {m['load']} at the start")


def command_line() -> str:
    script = os.path.relpath(sys.argv[0], ROOT) if os.path.isabs(sys.argv[0]) else sys.argv[0]
    return "python " + " ".join(shlex.quote(a) for a in [script] + sys.argv[1:])


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def report(title: str, m: dict[str, Any], table: str, notes: list[str] = (),
           record: bool = False) -> str:
    """Print a RESULTS.md section; with ``record`` append it to benchmarks/RESULTS.md."""
    text = "\n".join([f"### {title}", "", f"`{command_line()}`", "",
                      machine_line(m) + f"; load average {loadavg()} at the end.", "", table, ""]
                     + [n for n in notes] + ([""] if notes else []))
    print(text)
    if record:
        with open(RESULTS, "a") as handle:
            handle.write("\n" + text)
        print(f"(appended to {os.path.relpath(RESULTS)})")
    return text


def add_common_args(parser: Any) -> None:
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU intra-op threads (default: torch's own choice)")
    parser.add_argument("--record", action="store_true",
                        help="append the result table to benchmarks/RESULTS.md")


def apply_threads(threads: int | None) -> None:
    """Set the intra-op threads, and make glibc's malloc keep the memory it is given back.

    Several loops in one process allocate from per-thread malloc arenas, and glibc hands
    freed memory back to the kernel by heuristics (trim and mmap thresholds): measured on
    the CNN, one loop's step page-faulted 16 MB back in every time and another's 32 MB,
    and the kernel's page zeroing counts as that loop's CPU time. One arena that keeps
    what it gets (as a long training process settles into, or as jemalloc/tcmalloc do)
    took the faults to zero for every loop alike. Applied before any loop thread starts.
    """
    if threads:
        torch.set_num_threads(threads)
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to settle
        return
    m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8
    libc.mallopt(m_arena_max, 1)
    libc.mallopt(m_trim_threshold, 2 ** 31 - 1)
    libc.mallopt(m_mmap_threshold, 32 * 2 ** 20)  # glibc's largest; bigger blocks are mmapped


def fresh_copy(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model)
