"""Fixtures of the compare tests: one real study watched by a spy, and the documented fields.

(tests/report/conftest.py has its own study, without the spy.)
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import TEST_THREADS

from amptrain.compare import CompareOptions, run_compare
from amptrain.config import RunConfig
from amptrain.trainer import Trainer
from amptrain.trainer.stepping import TrainStep

#: docs/design.md: compare.json's summary fields, in order.
SUMMARY_FIELDS = ["precision", "samples_per_s", "speedup", "step_time_ms", "peak_mem_bytes",
                  "mem_ratio", "weights_bytes", "grad_bytes", "master_bytes",
                  "optimizer_state_bytes", "bytes_per_param", "lowbit_flops_share",
                  "est_matmul_speedup_h100", "est_matmul_speedup_b200", "val_acc_mean",
                  "val_acc_std",
                  "delta_acc_pp", "final_loss_mean",
                  "skipped_steps", "speedup_low", "speedup_high", "timing_reliable",
                  "timing_note", "verdict", "data_wait_frac"]
PRECISIONS = ["32-true", "16-mixed", "bf16-mixed"]
SEEDS = [0, 1]


def small_config(out: Path, **overrides) -> RunConfig:
    values = dict(model="cnn:8", data="digits", device="cpu", max_steps=6, batch_size=64,
                  no_progress=True, out=str(out))
    values.update(overrides)
    return RunConfig.from_options(**values)


@pytest.fixture(scope="package")
def study(tmp_path_factory):
    """One real 3 precisions x 2 seeds study; a spy records what each training run saw."""
    torch.set_num_threads(TEST_THREADS)
    out = tmp_path_factory.mktemp("compare") / "study"
    seen: dict[tuple[str, int], dict] = {}
    trainers: dict[int, Trainer] = {}  # a run's TrainStep -> its Trainer
    original_setup, original_on = Trainer.setup, TrainStep.on

    def setup(self, *args, **kwargs):
        original_setup(self, *args, **kwargs)
        trainers[id(self._built.train_step)] = self

    def spy(self, window, step):
        trainer = trainers[id(self)]
        if trainer.out is not None:  # the training runs (timing Trainers write nothing)
            record = seen.setdefault((trainer.precision.name, trainer.config.seed),
                                     {"batches": [], "initial": None, "first_window": window})
            if record["initial"] is None:
                record["initial"] = {k: v.detach().clone() for k, v in
                                     trainer.precision.fp32_state_dict(trainer.model).items()}
            record["batches"].append([t.clone() for b in window.micro_batches for t in b])
        return original_on(self, window, step)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "setup", setup)
        patch.setattr(TrainStep, "on", spy)
        result = run_compare(small_config(out), CompareOptions(timing_steps=3, timing_warmup=1),
                             pick_log_every=False)
    return {"out": out, "result": result, "seen": seen,
            "details": json.loads((out / "study.json").read_text())}
