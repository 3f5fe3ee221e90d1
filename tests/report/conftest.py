"""Fixtures of the report tests: one real compare study, and small hand-written ones."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import TEST_THREADS


@pytest.fixture(scope="session")
def study(tmp_path_factory):
    """One real 3 precisions x 2 seeds study, set up as tests/compare/conftest.py's ``study``
    (without its spy: the reports only need what the study left on disk)."""
    # Imported here: the hand-written studies below need none of the training stack.
    from amptrain.compare import CompareOptions, run_compare
    from amptrain.config import RunConfig, build_config

    torch.set_num_threads(TEST_THREADS)
    out = tmp_path_factory.mktemp("compare") / "study"
    # Flat option names, as on the command line (build_config maps them onto RunConfig).
    config = build_config(RunConfig, {"model": "cnn:8", "data": "digits", "device": "cpu",
                                      "max_steps": 6, "batch_size": 64, "no_progress": True,
                                      "out": str(out)})
    result = run_compare(config, CompareOptions(timing_steps=3, timing_warmup=1),
                         pick_log_every=False)
    return {"out": out, "result": result,
            "details": json.loads((out / "study.json").read_text())}


@pytest.fixture
def pixels_near() -> Callable[..., int]:
    """How many pixels of an RGB array lie within ``tolerance`` of a ``#rrggbb`` colour."""
    def count(pixels: np.ndarray, hex_colour: str, tolerance: float = 12.0) -> int:
        rgb = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.float64)
        return int((np.abs(pixels - rgb).max(axis=-1) <= tolerance).sum())
    return count


# ------------------------------------------------------- hand-written studies
def _row(precision: str, **values) -> dict:
    """A compare.json summary row, fields in the contract's order (docs/design.md)."""
    fields = ["samples_per_s", "speedup", "step_time_ms", "peak_mem_bytes", "mem_ratio",
              "val_acc_mean", "val_acc_std", "delta_acc_pp", "final_loss_mean", "skipped_steps",
              "verdict"]
    assert set(values) <= set(fields), set(values) - set(fields)
    return {"precision": precision, **{k: values.get(k) for k in fields}}


TRAINED_SUMMARY = [
    _row("32-true", samples_per_s=1000.0, speedup=1.0, step_time_ms=64.0,
         peak_mem_bytes=200 * 2 ** 20, mem_ratio=1.0, val_acc_mean=0.9, val_acc_std=0.01,
         delta_acc_pp=0.0, final_loss_mean=0.3, skipped_steps=0, verdict="ok"),
    _row("16-mixed", samples_per_s=1500.0, speedup=1.5, step_time_ms=42.67,
         peak_mem_bytes=120 * 2 ** 20, mem_ratio=0.6, val_acc_mean=0.902, val_acc_std=0.012,
         delta_acc_pp=0.2, final_loss_mean=0.31, skipped_steps=3, verdict="ok"),
]
SPEED_ONLY_SUMMARY = [
    _row("32-true", samples_per_s=1000.0, speedup=1.0, step_time_ms=64.0,
         peak_mem_bytes=2048, mem_ratio=1.0),
    _row("bf16-mixed", samples_per_s=1200.0, speedup=1.2, step_time_ms=53.3,
         peak_mem_bytes=1024, mem_ratio=0.5),
]


def write_study(out: Path, trained: bool = True) -> Path:
    """A two-precision study directory as ``run_compare`` leaves it, written by hand.

    Trained: 32-true and 16-mixed, seeds 0 and 1, 8 logged steps each (16-mixed with a
    loss scale, one skipped step). Speed only: 32-true and bf16-mixed, no runs.
    """
    summary = TRAINED_SUMMARY if trained else SPEED_ONLY_SUMMARY
    runs = []
    if trained:
        for p in ("32-true", "16-mixed"):
            for seed in (0, 1):
                run_dir = out / "runs" / p / f"seed-{seed}"
                run_dir.mkdir(parents=True)
                lines = []
                for step in range(1, 9):
                    record = {"step": step, "epoch": 0, "loss": 2.0 / step + 0.01 * seed}
                    if p == "16-mixed":
                        record["loss_scale"] = 65536.0 if step < 5 else 32768.0
                    lines.append(json.dumps(record))
                lines.append(json.dumps({"step": 8, "epoch": 0, "val_loss": 0.4,
                                         "val_acc": 0.9 + 0.01 * seed}))
                (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
                runs.append({"precision": p, "seed": seed, "dir": f"runs/{p}/seed-{seed}",
                             "val_acc": 0.9 + 0.01 * seed, "val_loss": 0.4,
                             "final_loss": 0.3, "skipped_steps": 1 if p == "16-mixed" else 0,
                             "steps": 8, "halted": None, "wall_s": 1.5,
                             "same_initial_weights": True})
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(
        {"baseline": "32-true", "runs": runs, "summary": summary}, indent=2) + "\n")
    precisions = [r["precision"] for r in summary]
    details = {
        "command": "amptrain compare --model cnn --data digits --out 'a&b'",
        "started": "2024-01-02 03:04:05", "duration_s": 12.3, "device": "cpu",
        "config": {"model": "cnn", "data": "digits", "max_steps": 8, "batch_size": 64,
                   "lr": None},
        "options": {"tolerance_pp": 0.5, "interleave": True, "timing_steps": 3,
                    "timing_warmup": 1, "bench_steps": None if trained else 2},
        "seeds": [0, 1] if trained else [0],
        "speed": {p: {"batch_samples": 64, "step_time_p25_ms": 40.0, "step_time_p75_ms": 70.0}
                  for p in precisions},
        "memory_method": "hand-written numbers",
        "env": {"python": "3.11.7", "torch": "2.13.0+cpu", "cuda": None, "cpu": "Test CPU",
                "cpu_cores": 2, "gpus": []},
    }
    (out / "study.json").write_text(json.dumps(details, indent=2) + "\n")
    return out


@pytest.fixture
def tiny_study(tmp_path) -> Path:
    """A hand-written trained study directory (see :func:`write_study`)."""
    return write_study(tmp_path / "tiny")


@pytest.fixture
def speed_only_study(tmp_path) -> Path:
    """A hand-written speed-only study directory (no runs, no accuracy)."""
    return write_study(tmp_path / "bench", trained=False)
