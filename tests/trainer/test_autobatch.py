"""Memory-aware batching: auto micro-batch, out-of-memory recovery, LR scaling and warm-up."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from amptrain.trainer.autobatch import (OutOfMemoryHalt, divisors, halve, is_out_of_memory,
                                        largest_fitting, resplit)
from amptrain.trainer.windows import StepBatch
from amptrain.config import TrainConfig, build_config
from amptrain.common.errors import UserError, cli_spelling
from amptrain.trainer.memory import MemoryMeter
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification

ROOT = Path(__file__).resolve().parents[2]


class OomModel(nn.Module):
    """A small classifier that runs out of memory like a GPU would, on the CPU.

    It raises ``torch.cuda.OutOfMemoryError`` (a plain RuntimeError subclass, constructible
    without CUDA) for training micro-batches above ``limit`` and on the forward calls
    numbered in ``fail_calls`` (1-based), at the end of the forward, as a real allocation
    failure would: after BatchNorm updated its running statistics and dropout drew from
    the RNG. ``plain=False`` drops both (they depend on the micro-batch split, so only runs
    with equal micro-batches are comparable with them).
    """

    def __init__(self, limit: int | None = None, fail_calls: tuple[int, ...] = (),
                 plain: bool = False, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        extras = [] if plain else [nn.BatchNorm1d(16), nn.Dropout(0.1)]
        self.body = nn.Sequential(nn.Linear(8, 16), *extras, nn.Tanh())
        self.head = nn.Linear(16, 3)
        self.limit, self.fail_calls = limit, set(fail_calls)
        self.calls: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.head(self.body(x))
        if self.training:
            self.calls.append(x.shape[0])
            too_big = self.limit is not None and x.shape[0] > self.limit
            if too_big or len(self.calls) in self.fail_calls:
                raise torch.cuda.OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate 2.00 GiB (simulated: micro-batch "
                    f"{x.shape[0]})")
        return out


def _train(model, data, tmp_path=None, **options):
    options = {"precision": "32-true", "device": "cpu", "no_progress": True, "epochs": 2,
               "scheduler": "cosine", "optimizer": "adamw", "lr": 0.01, "log_every": 1,
               **options}
    if tmp_path is not None:
        options["out"] = str(tmp_path)
    trainer = Trainer(**options)
    trainer.fit(model, data)
    return trainer


def _assert_same_params(a: nn.Module, b: nn.Module, exact: bool = False) -> None:
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        if exact:
            assert torch.equal(p, q), name
        else:
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def _losses(trainer):
    return [r["loss"] for r in trainer.history if "loss" in r]


# ------------------------------------------------------------ out-of-memory recovery
def test_oom_above_a_micro_batch_recovers_and_equals_the_smaller_micro_batch_from_start(
        tmp_path, capsys):
    data = tiny_classification(n=200)  # 3 x 64 + 8: the last window of each epoch is partial
    model = OomModel(limit=20)
    trainer = _train(model, data, tmp_path, batch_size=64)  # micro 64 x accumulate 1 at first
    reference = OomModel()
    expected = _train(reference, data, batch_size=64, micro_batch_size=16)

    _assert_same_params(model, reference, exact=True)
    assert _losses(trainer) == _losses(expected)
    assert (trainer.micro_batch_size, trainer.accumulate) == (16, 4)
    # Step 1 failed at 64 and at 32, then ran as 4 x 16; nothing larger than 16 ever again.
    assert model.calls[:6] == [64, 32, 16, 16, 16, 16]
    assert max(model.calls[2:]) == 16
    resolved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert (resolved["micro_batch_size"], resolved["accumulate"]) == (16, 4)
    assert [(e["step"], e["micro_batch_size"], e["accumulate"]) for e in resolved["oom_events"]] \
        == [(1, [64, 32], [1, 2]), (1, [32, 16], [2, 4])]
    err = capsys.readouterr().err
    assert "out of memory at step 1 with micro-batch 64; redoing the step as micro-batch 32" in err
    assert "micro-batch 16 x accumulate 4 (same global batch of 64)" in err


def test_transient_oom_mid_window_drops_partial_gradients_and_redoes_the_same_batch():
    data = tiny_classification(n=256)
    # 64 = 4 x 16; forward call 10 is the 2nd micro-batch of step 3: the 1st one's gradients
    # are already accumulated when it fails, and must not count twice. No BatchNorm or
    # dropout: steps 1-2 run as 16-sample micro-batches here, 8-sample ones in the reference.
    model = OomModel(fail_calls=(10,), plain=True)
    trainer = _train(model, data, batch_size=64, micro_batch_size=16, epochs=1)
    reference = OomModel(plain=True)
    expected = _train(reference, data, batch_size=64, micro_batch_size=8, epochs=1)

    _assert_same_params(model, reference)
    assert _losses(trainer) == pytest.approx(_losses(expected), rel=1e-5)
    assert model.calls[8:10] == [16, 16] and model.calls[10:18] == [8] * 8
    assert [e["step"] for e in trainer.sizer.oom_events] == [3]
    assert trainer.step == 4 and (trainer.micro_batch_size, trainer.accumulate) == (8, 8)


def test_oom_even_at_micro_batch_one_stops_after_bounded_retries():
    data = tiny_classification(n=64)
    model = OomModel(limit=0, plain=True)  # BatchNorm cannot train on one sample
    with pytest.raises(OutOfMemoryHalt, match="out of memory at step 1 even with micro-batch 1"):
        _train(model, data, batch_size=24)
    # 24 -> 12 -> 6 -> 3 -> 1 (largest divisor of 24 <= half), then give up.
    assert model.calls == [24, 12, 6, 3, 1]


def test_other_errors_are_not_mistaken_for_out_of_memory():
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert is_out_of_memory(MemoryError())
    try:
        torch.empty(1 << 62, dtype=torch.uint8)  # the CPU allocator's own failure
    except RuntimeError as exc:
        assert is_out_of_memory(exc)
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_out_of_memory(ValueError("out of memory"))


def test_resplit_cuts_the_same_samples_like_the_batch_plan():
    x = torch.arange(10.0).unsqueeze(1)
    y = torch.arange(10)
    window = StepBatch([(x[:5], y[:5]), (x[5:], y[5:])], [5, 5], 10)
    again = resplit(window, 3)
    assert again.micro_samples == [2, 3, 2, 3]  # ceil(10/3) = 4 micro-batches, evenly cut
    assert torch.equal(torch.cat([b[1] for b in again.micro_batches]), y)
    assert again.global_samples == 10
    as_dicts = StepBatch([{"x": x[:4], "labels": y[:4]}, {"x": x[4:], "labels": y[4:]}], [4, 6], 10)
    assert [b["labels"].tolist() for b in resplit(as_dicts, 5).micro_batches] == \
        [list(range(5)), list(range(5, 10))]
    assert halve(64, 64) == 32 and halve(3, 24) == 1 and halve(1, 24) is None


# ------------------------------------------------------------------- auto micro-batch
def test_search_gallops_then_bisects_over_divisors():
    tried = []

    def fits(m):
        tried.append(m)
        return m <= 24

    assert divisors(96) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96]
    assert largest_fitting(divisors(96), fits) == 24
    assert tried == [1, 2, 4, 8, 16, 32, 24]
    tried.clear()
    assert largest_fitting(divisors(96), fits, start=1) == 24
    assert tried == [2, 4, 8, 16, 32, 24]
    tried.clear()
    assert largest_fitting(divisors(96), lambda m: tried.append(m) or m < 2, start=1) == 1
    assert tried == [2, 1]  # below the start when the start does not fit
    tried.clear()
    assert largest_fitting(divisors(96), fits, ascending=True) == 24
    assert tried == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]  # never smaller than a previous probe
    assert largest_fitting([1, 2, 4], lambda m: False) is None
    assert largest_fitting([1, 2, 4], lambda m: True) == 4


@pytest.mark.parametrize("precision", ["32-true", "16-mixed", "bf16-master"])
def test_auto_picks_the_largest_divisor_that_fits_and_probing_leaves_training_unchanged(
        precision, tmp_path):
    data = tiny_classification(n=200)
    model = OomModel(limit=24)  # the fake memory limit: micro-batches above 24 do not fit
    trainer = _train(model, data, tmp_path, batch_size=96, micro_batch_size="auto",
                     precision=precision, epochs=1)
    assert (trainer.micro_batch_size, trainer.accumulate) == (24, 4)
    probes = trainer.sizer.search_report["probes"]
    assert [(p["micro_batch_size"], p["fits"]) for p in probes] == \
        [(2, True), (4, True), (8, True), (16, True), (32, False), (24, True)]
    assert probes[4]["note"].startswith("out of memory: CUDA out of memory")
    assert not trainer.sizer.oom_events  # training itself never ran out of memory
    resolved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert (resolved["micro_batch_size"], resolved["accumulate"]) == (24, 4)
    assert resolved["micro_batch_search"]["micro_batch_size"] == 24

    # The probes' steps were undone: weights, BatchNorm buffers, optimizer state, loss
    # scale and dropout RNG all continue exactly as in a run given --micro-batch-size 24.
    reference = OomModel()
    expected = _train(reference, data, batch_size=96, micro_batch_size=24, precision=precision,
                      epochs=1)
    _assert_same_params(model, reference, exact=True)
    assert _losses(trainer) == _losses(expected)
    if precision == "16-mixed":
        assert trainer.precision.loss_scale == expected.precision.loss_scale


class _WideActivations(nn.Module):
    """Tiny weights, huge activations: ~16 MiB per sample for each tensor autograd keeps."""

    def __init__(self, width: int = 1 << 19) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.width = width
        self.scale = nn.Parameter(torch.ones(()))
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = torch.tanh(x.repeat(1, self.width) * self.scale)
        return self.head(wide.view(len(x), self.width, 8).mean(1))


@pytest.mark.slow
@pytest.mark.skipif(not MemoryMeter(torch.device("cpu"), "process").resettable,
                    reason="needs a resettable peak RSS (Linux /proc/self/clear_refs)")
def test_auto_under_a_cpu_memory_budget_uses_measured_peak_rss():
    data = tiny_classification(n=32)
    options = dict(batch_size=8, micro_batch_size="auto", epochs=1, max_steps=1,
                   optimizer="sgd", scheduler="none")
    roomy = _train(_WideActivations(), data, memory_budget_gb=100.0, **options)
    peaks = {p["micro_batch_size"]: p["peak_bytes"] for p in roomy.sizer.search_report["probes"]}
    assert list(peaks) == [2, 4, 8] and roomy.micro_batch_size == 8
    assert peaks[8] - peaks[4] > 150 << 20  # 4 more samples of real activations, measured
    budget = (peaks[4] + peaks[8]) / 2
    tight = _train(_WideActivations(), data, memory_budget_gb=budget / 1e9, **options)
    assert (tight.micro_batch_size, tight.accumulate) == (4, 2)
    notes = {p["micro_batch_size"]: p["note"] for p in tight.sizer.search_report["probes"]}
    assert notes[4] == "fits" and notes[8] in ("over budget", "predicted over budget")


# ------------------------------------------------------------------- user errors
def test_impossible_combinations_are_user_errors():
    with cli_spelling():
        _impossible_combinations()


def _impossible_combinations():
    with pytest.raises(UserError, match="drop --accumulate"):
        build_config(TrainConfig, {"micro_batch_size": "auto", "accumulate": 2})
    with pytest.raises(UserError, match="only applies with --micro-batch-size auto"):
        build_config(TrainConfig, {"memory_budget_gb": 4.0})
    with pytest.raises(UserError, match=r"multiple of 3 \(nearest: 99 or 102\)"):
        build_config(TrainConfig, {"batch_size": 100, "micro_batch_size": "auto"}).batching.split(3)
    with pytest.raises(UserError, match=r"valid values: 1, 2, 4, 5, 10, 20, 25, 50, \.\.\. "
                                        r"\(nearest: 20 or 25\), or keep it with --batch-size "
                                        r"96 or 120"):
        build_config(TrainConfig, {"batch_size": 100, "micro_batch_size": 24}).batching.split()


def _cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "amptrain", "train", "--model", "mlp", "--data",
                           "digits", "--precision", "32-true", "--device", "cpu",
                           "--no-progress", "--out", str(tmp_path / "run"), *args],
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_cli_impossible_auto_combinations_exit_2_with_one_line(tmp_path):
    done = _cli("--micro-batch-size", "auto", "--accumulate", "3", tmp_path=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "amptrain: error: --micro-batch-size auto derives --accumulate from what fits; "
        "drop --accumulate (or give an integer --micro-batch-size)"]
    done = _cli("--micro-batch-size", "auto", "--memory-budget-gb", "0.01", tmp_path=tmp_path)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("amptrain: error: --micro-batch-size auto: even micro-batch 1 does "
                           "not fit (over budget, peak ")
    assert "> budget 0.01 GB); raise --memory-budget-gb (now 0.01)" in last
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------ lr scaling and warm-up
@pytest.mark.parametrize("scaling,scheduler,factor", [("linear", "none", 4.0),
                                                      ("sqrt", "cosine", 2.0)])
def test_lr_scaling_and_auto_warmup_follow_the_documented_schedule(scaling, scheduler, factor):
    data = tiny_classification(n=256)  # batch 32: 8 steps per epoch, 32 steps in 4 epochs
    trainer = Trainer(precision="32-true", device="cpu", no_progress=True, epochs=4,
                      batch_size=32, base_batch_size=8, lr_scaling=scaling, lr=0.01,
                      scheduler=scheduler, log_every=1)
    trainer.setup(OomModel(), data)
    used = []
    trainer.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: used.append(opt.param_groups[0]["lr"]))
    trainer.run()

    lr, total = 0.01 * factor, 32
    warmup = min(5 * 8, math.ceil(0.1 * total))  # Goyal's 5 epochs, capped at 10% of the run
    assert warmup == 4 and trainer.lr_schedule.warmup_steps == 4 and trainer.lr_schedule.lr == lr

    def schedule(s: int) -> float:  # lr of optimizer step s (0-based)
        if s < warmup:
            return lr * (s + 1) / warmup
        if scheduler == "none":
            return lr
        return lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warmup) / (total - warmup))))

    assert used == pytest.approx([schedule(s) for s in range(total)], rel=1e-12)
    # metrics.jsonl's lr at step n is the rate after step n's schedule update (step n+1's).
    logged = [r["lr"] for r in trainer.history if "loss" in r]
    assert logged == pytest.approx([schedule(n) for n in range(1, total + 1)], rel=1e-12)


def test_warmup_given_longer_wins_and_scaling_down_adds_none():
    data = tiny_classification(n=256)
    base = dict(precision="32-true", device="cpu", no_progress=True, epochs=4, batch_size=32,
                lr=0.01, scheduler="none")
    longer = Trainer(**base, base_batch_size=8, lr_scaling="linear", warmup_steps=6)
    longer.setup(OomModel(), data)
    assert (longer.lr_schedule.warmup_steps, longer.lr_schedule.warmup_auto) == (6, 4)
    down = Trainer(**base, base_batch_size=64, lr_scaling="linear")
    down.setup(OomModel(), data)
    assert (down.lr_schedule.lr, down.lr_schedule.warmup_steps) == (0.005, 0)
    assert down.optimizer.param_groups[0]["lr"] == 0.005


@pytest.mark.slow
def test_cli_lr_scaling_writes_lr_and_warmup_used_and_logs_every_step(tmp_path):
    done = _cli("--batch-size", "64", "--base-batch-size", "16", "--lr-scaling", "linear",
                "--lr", "0.01", "--scheduler", "none", "--epochs", "1", "--log-every", "1",
                tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in records if "loss" in r]
    steps = len(lrs)  # one epoch of digits' training split
    warmup = min(5 * steps, math.ceil(0.1 * steps))
    resolved = yaml.safe_load((run / "config.yaml").read_text())
    assert resolved["lr"] == pytest.approx(0.04)
    assert resolved["warmup_steps"] == warmup == 3
    assert resolved["lr_schedule"] == {"lr_scaling": "linear", "base_lr": 0.01, "lr_factor": 4.0,
                                       "warmup_steps_given": 0, "warmup_steps_auto": 3}
    assert resolved["lr_scaling"] == "none"  # already applied: rerunning the file keeps lr 0.04
    assert lrs == pytest.approx([0.04 * min(1.0, (n + 1) / warmup) for n in range(1, steps + 1)])
    assert ("lr scaling linear: lr 0.01 x 64/16 = 0.04 (--batch-size 64, --base-batch-size 16); "
            "warm-up 3 steps (automatic for a scaled-up lr") in done.stderr
