"""compare/timing.py: speed and memory measured the fair way (one set-up Trainer per
precision, timed steps alternating between them, a device sync around each, medians)."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from amptrain.trainer.windows import StepBatch
from amptrain.compare import (
    MEMORY_STEPS,
    CompareOptions,
    Contender,
    build_contender,
    measure_peak_memory,
    measure_speed_and_memory,
    memory_method,
    speed_figures,
    state_bytes,
    timing,
)
from amptrain.data import TensorData
from amptrain.common import clock
from amptrain.common.errors import TrainingHalted
from amptrain.precision.tf32 import MathSwitches
from amptrain.workflows.runner import data_and_model
from amptrain.trainer import Trainer
from tests.compare.conftest import small_config


def _window(samples: int = 64) -> StepBatch:
    return StepBatch([(torch.zeros(samples, 2), torch.zeros(samples, dtype=torch.long))],
                  [samples], samples)


def _contender(trainer=None, windows=(), **fields) -> Contender:
    return Contender("bf16-mixed", trainer, MathSwitches(), iter(windows), **fields)


class _FakeTrainer:
    """Counts steps; raises TrainingHalted at step ``halt_at`` (1-based)."""

    def __init__(self, halt_at: int | None = None) -> None:
        self.device = torch.device("cpu")
        self.position = SimpleNamespace(step=0)  # advanced by the contender
        self.steps, self.finished, self.halt_at = 0, 0, halt_at

    def train_step(self, window: StepBatch) -> None:
        self.steps += 1
        if self.steps == self.halt_at:
            raise TrainingHalted("loss scale fell to its floor")

    def finish_step(self) -> None:
        self.finished += 1


def test_state_bytes_count_weights_then_optimizer_state():
    model = torch.nn.Linear(256, 256)
    trainer = Trainer(precision="32-true", device="cpu", optimizer="adamw", no_progress=True,
                      batch_size=8)
    trainer.setup(model, TensorData(torch.randn(8, 256), torch.randint(0, 256, (8,))))
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert state_bytes(trainer) == weights  # Adam's moments appear at its first step
    trainer.train_step(next(iter(trainer.train_windows.epoch(0))))
    trainer.finish_step()
    assert state_bytes(trainer) >= 3 * weights


def test_only_timed_steps_are_timed():
    trainer = _FakeTrainer()
    contender = _contender(trainer, [_window(48), _window(64), _window(64)])
    contender.step(timed=False)  # warm-up
    assert contender.step_times_s == [] and contender.batch_samples == 0
    contender.step(timed=True)
    contender.step(timed=True)
    assert len(contender.step_times_s) == 2 and all(t >= 0 for t in contender.step_times_s)
    assert contender.batch_samples == 64
    assert (trainer.steps, trainer.finished) == (3, 3)  # every step waited for


def test_a_halted_precision_stops_stepping_and_has_no_memory_figure():
    trainer = _FakeTrainer(halt_at=2)
    contender = _contender(trainer, [_window(), _window()])
    contender.step(timed=True)
    contender.step(timed=True)
    assert contender.halted == "loss scale fell to its floor"
    assert len(contender.step_times_s) == 1  # the halted step is not timed
    contender.step(timed=True)  # no window left: a step now would raise StopIteration
    assert trainer.steps == 2
    assert measure_peak_memory(contender) is None


def test_speed_figures_are_the_median_and_its_spread():
    contender = _contender(step_times_s=[0.010, 0.040, 0.020, 0.030], batch_samples=64,
                           peak_mem_bytes=1234)
    figures = speed_figures(contender)
    assert figures["step_time_ms"] == pytest.approx(25.0)
    assert figures["samples_per_s"] == pytest.approx(64 / 0.025)
    assert figures["step_time_p25_ms"] == pytest.approx(12.5)
    assert figures["step_time_p75_ms"] == pytest.approx(37.5)
    assert figures["step_times_ms"] == [10.0, 40.0, 20.0, 30.0]  # in the order timed
    assert (figures["batch_samples"], figures["peak_mem_bytes"], figures["halted"]) == \
        (64, 1234, None)
    one = speed_figures(_contender(step_times_s=[0.02], batch_samples=8))
    assert one["step_time_p25_ms"] == one["step_time_ms"] == one["step_time_p75_ms"]
    halted = speed_figures(_contender(halted="diverged", peak_mem_bytes=None))
    assert halted == {"samples_per_s": None, "step_time_ms": None, "peak_mem_bytes": None,
                      "halted": "diverged"}


@pytest.mark.parametrize("interleave, expected", [
    # Round r runs one step of each precision and of the A/A control (a second "a", the
    # baseline), the order rotated by r.
    (True, [("a", False), ("b", False), ("c", False), ("a2", False),
            ("b", True), ("c", True), ("a2", True), ("a", True),
            ("c", True), ("a2", True), ("a", True), ("b", True)]),
    (False, [("a", False), ("a", True), ("a", True), ("b", False), ("b", True), ("b", True),
             ("c", False), ("c", True), ("c", True), ("a2", False), ("a2", True), ("a2", True)]),
])
def test_timed_steps_alternate_between_precisions_when_interleaved(monkeypatch, interleave,
                                                                   expected):
    steps: list[tuple[str, bool]] = []
    built: list[str] = []

    class Recording(Contender):
        def step(self, timed: bool) -> None:
            steps.append((self.name, timed))
            if timed:
                self.step_times_s.append(0.01)

    def build(config, precision, needed):
        built.append(precision)
        assert needed == 3  # warm-up + timed
        contender = Recording(precision, SimpleNamespace(), MathSwitches(), iter(()))
        contender.name = precision + ("2" if built.count(precision) > 1 else "")
        return contender

    measured: list[str] = []

    def memory(c):
        measured.append(c.name)
        return len(c.precision)

    monkeypatch.setattr(timing, "build_contender", build)
    monkeypatch.setattr(timing, "measure_peak_memory", memory)
    options = CompareOptions(timing_warmup=1, timing_steps=2, interleave=interleave)
    contenders = measure_speed_and_memory(None, ["a", "b", "c"], options)
    assert steps == expected
    assert built == ["a", "b", "c", "a"] and list(contenders) == ["a", "b", "c"]
    assert measured == ["a", "b", "c"]  # the control lane's memory is the baseline's
    assert all(c.peak_mem_bytes == 1 and c.trainer is None for c in contenders.values())
    # The control's times are the baseline's A/A lane, not a row of their own.
    assert contenders["a"].control_times_s == [0.01, 0.01]
    assert contenders["b"].control_times_s == []
    assert speed_figures(contenders["a"])["control_step_times_ms"] == [10.0, 10.0]


def test_a_contender_is_set_up_as_the_training_run_and_writes_nothing(tmp_path):
    config = small_config(tmp_path / "study", seed=3)
    contender = build_contender(config, "bf16-mixed", needed_windows=2)
    trainer = contender.trainer
    assert trainer.out is None and not (tmp_path / "study").exists()
    assert trainer.precision.name == "bf16-mixed" and trainer.config.seed == 3
    assert contender.total_steps == 6  # the run's --max-steps
    _, model = data_and_model(config)  # the seed's weights, as the training run starts from
    live = trainer.precision.fp32_state_dict(trainer.model)
    assert all(torch.equal(v, live[k]) for k, v in model.state_dict().items())
    # The timed steps cycle over `needed_windows` full global batches.
    first, second, third = (next(contender.windows) for _ in range(3))
    assert first.global_samples == second.global_samples == 64
    assert third is first and second is not first


def test_a_ppo_contender_times_whole_updates_with_their_rollouts():
    pytest.importorskip("gymnasium")
    from amptrain.config import RunConfig
    # 2 environments x 16 steps, 2 minibatches x 2 epochs: an update is 4 optimizer steps.
    config = RunConfig.from_options(data="gym:CartPole-v1", num_envs=2, rollout_steps=16,
                                    minibatches=2, update_epochs=2, env_steps=128, seed=0,
                                    no_progress=True, logger="none")
    contender = build_contender(config, "32-true", needed_windows=3)
    task = contender.task
    assert contender.unit == task.iteration.timed_unit() == 4
    collected = []
    collect = task.collect
    task.collect = lambda ctx, update=0: (collected.append(update), collect(ctx, update))[1]
    contender.step(timed=False)
    contender.step(timed=True)
    contender.step(timed=True)
    # One rollout per timed unit (a contender that never advanced the step number
    # collected once and timed minibatch updates alone).
    assert collected == [0, 1, 2] and contender.trainer.step == 12
    assert len(contender.step_times_s) == 2 and contender.batch_samples == 16
    assert speed_figures(contender)["timed_unit_steps"] == 4


def test_memory_method_says_what_peak_mem_bytes_measures():
    cpu, cuda = memory_method(torch.device("cpu")), memory_method(torch.device("cuda", 0))
    assert "torch.profiler" in cpu and "max_memory_allocated" not in cpu
    assert "torch.cuda.max_memory_allocated" in cuda
    assert all(f"{MEMORY_STEPS} training steps" in text for text in (cpu, cuda))


# ------------------------------------------- compare times the speed training has (issue 38)
def _tiny_hf(directory):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "tiny_hf_model", Path(__file__).parents[2] / "examples" / "tiny_hf_model.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.write_tiny_bert(directory / "bert")
    example.write_reviews_csv(directory / "reviews.csv", rows=240)
    return directory / "bert", directory / "reviews.csv"


class _StepClock:
    """Trainer callback: the time between consecutive steps of the training loop, on
    amptrain's clock (:mod:`amptrain.common.clock`, the one compare's lane reads)."""

    def __init__(self) -> None:
        self.times, self.last = [], None

    def on_step_end(self, trainer) -> None:
        now = clock.now()
        if self.last is not None:
            self.times.append(now - self.last)
        self.last = now


@pytest.mark.slow
def test_compare_times_an_hf_model_at_the_speed_its_training_runs(tmp_path):
    """compare's step time of a small hf: model is the training loop's step time, not 40x
    it (issue 38: 1184-1200 ms against 27 ms). compare's timing lane (what its table's step
    time comes from) and a training run alternate in this process; medians of steady-state
    steps; the 3x bound is a sanity bound on a 40x error, not a benchmark.

    Both sides run on the main thread's CPU time (``time.thread_time`` through amptrain's
    clock), at one intra-op thread so all the work is on that thread: the work each step
    does, not the machine's load (wall time swung 10-15x for either side on the shared
    2-core EPYC at load 15-20, and the test failed at load 8 on a Xeon, issue 49). Work the
    lane adds still shows."""
    import statistics

    pytest.importorskip("transformers")
    from amptrain.compare import CompareOptions
    from amptrain.config import RunConfig

    bert, reviews = _tiny_hf(tmp_path)
    config = RunConfig.from_options(model=f"hf:{bert}", data=f"csv-text:{reviews}",
                                    precision="32-true", batch_size=16, epochs=1, lr=3e-3,
                                    device="cpu", no_progress=True, log_every=4)
    options = CompareOptions(precisions="32-true", bench_steps=8, timing_warmup=3)
    compared, trained = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with clock.use(time.thread_time):
            _alternate(config, options, tmp_path, compared, trained)
    finally:
        torch.set_num_threads(threads)
    ratio = statistics.median(compared) / statistics.median(trained)
    assert 1 / 3 < ratio < 3, (f"compare's step {compared} ms vs the training loop's "
                               f"{trained} ms")


def _alternate(config, options, tmp_path, compared, trained) -> None:
    """Two rounds of (compare's timing lane, a training run), each side's median step."""
    import statistics

    from amptrain.workflows.runner import run_training

    for round_ in range(2):
        lanes = measure_speed_and_memory(config, ["32-true"], options)
        compared.append(speed_figures(lanes["32-true"])["step_time_ms"])
        clock = _StepClock()
        run_training(config.with_options(out=str(tmp_path / f"train-{round_}")),
                     callbacks=[clock])
        trained.append(statistics.median(clock.times[2:]) * 1e3)  # warm steps only
