"""``amptrain train`` end to end, as a real process: the main job and every output it
writes, --config with flag overrides and the resolved config.yaml read back, a diverged
run, and resuming a finished one."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.commands.helpers import amptrain


@pytest.mark.slow
def test_main_job_reaches_90_percent_and_writes_every_output(digits_run):
    out, result = digits_run
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads((out / "eval" / "report.json").read_text())
    assert report["accuracy"] >= 0.90
    assert f"val_acc {report['accuracy']:.4f}" in result.stdout and str(out) in result.stdout
    for name in ("config.yaml", "metrics.jsonl", "checkpoints/last.pt",
                 "eval/classification_report.txt", "eval/report.json"):
        assert (out / name).is_file(), name
    assert list((out / "tb").glob("events.out.tfevents.*"))
    assert "macro avg" in (out / "eval" / "classification_report.txt").read_text()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert train and set(train[0]) >= {"step", "epoch", "loss", "lr", "loss_scale", "grad_norm",
                                       "skipped_steps", "samples_per_s", "peak_mem_bytes"}
    assert records[-1]["val_acc"] == pytest.approx(report["accuracy"])
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["precision"] == "bf16-mixed" and config["model"] == "cnn"


# ------------------------------------------------------- (b) config round trip
@pytest.mark.slow
def test_config_file_flag_override_and_round_trip(tmp_path):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({
        "model": "mlp", "data": "digits", "precision": "bf16-mixed", "epochs": 5,
        "max-steps": 4, "batch_size": 32, "accumulate": 2, "lr": 0.01, "keep_fp32": ["head"],
        "scheduler": "none", "seed": 3}))
    first = tmp_path / "first"
    result = amptrain("train", "--config", tmp_path / "run.yaml", "--epochs", "1", "--seed", "4",
                      "--out", first, "--no-progress", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load((first / "config.yaml").read_text())
    assert resolved["epochs"] == 1 and resolved["seed"] == 4        # the flags won
    assert resolved["lr"] == 0.01 and resolved["keep_fp32"] == ["head"]  # the file's values
    assert (resolved["model"], resolved["batch_size"], resolved["max_steps"]) == ("mlp", 32, 4)
    assert (resolved["micro_batch_size"], resolved["accumulate"]) == (16, 2)  # derived
    assert resolved["precision"] == "bf16-mixed" and resolved["out"] == str(first)

    second = tmp_path / "second"
    again = amptrain("train", "--config", first / "config.yaml", "--out", second, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    reread = yaml.safe_load((second / "config.yaml").read_text())
    assert reread == {**resolved, "out": str(second)}
    # Same config, same seed: the same training, step for step.
    losses = [[r["loss"] for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())
               if "loss" in r] for d in (first, second)]
    assert losses[0] == losses[1] and len(losses[0]) == 1


@pytest.mark.slow
def test_a_diverged_run_exits_non_zero_and_says_so(tmp_path):
    result = amptrain("train", "--model", "mlp", "--lr", "1e30", "--max-bad-steps", "1000",
                      "--max-steps", "12", "--precision", "32-true", "--no-progress",
                      "--out", tmp_path / "run", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "error: training diverged: its final" in result.stderr and "not finite" in result.stderr
    assert "done:" not in result.stdout


@pytest.mark.slow
def test_resuming_a_finished_run_adds_no_record(digits_run, tmp_path):
    import shutil

    out, trained = digits_run
    assert trained.returncode == 0, trained.stderr
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    before = (copy / "metrics.jsonl").read_text()
    result = amptrain("train", "--model", "cnn", "--data", "digits", "--precision", "bf16-mixed",
                      "--epochs", "3", "--out", copy, "--resume", "auto", "--no-progress",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "already finished at step" in result.stderr
    assert (copy / "metrics.jsonl").read_text() == before


# ------------------------------------------------------- the run's length, its last word
@pytest.mark.slow
def test_max_steps_alone_trains_that_many_steps_over_several_epochs(tmp_path):
    out = tmp_path / "run"
    result = amptrain("train", "--model", "mlp", "--data", "digits", "--max-steps", "30",
                      "--precision", "32-true", "--no-progress", "--logger", "none",
                      "--log-every", "5", "--out", out, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    first = result.stderr.splitlines()[0]
    assert "30 steps (--max-steps 30; 1.3 epochs of 23 steps) of 64 samples" in first
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert train[-1]["step"] == 30 and train[-1]["epoch"] == 1  # past the first epoch
    assert train[-1]["lr"] == 0.0  # the schedule spans the 30 steps
    assert "after 30 steps" in result.stdout and "warning" not in result.stdout
    assert yaml.safe_load((out / "config.yaml").read_text())["epochs"] is None  # not given


@pytest.mark.slow
def test_a_regression_that_learnt_nothing_says_so_after_done(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)  # targets independent of the inputs: nothing to learn
    np.savez(tmp_path / "noise.npz", x=rng.normal(size=(300, 4)).astype("float32"),
             y=rng.normal(size=300).astype("float32"))
    result = amptrain("train", "--model", "mlp", "--data", f"npz:{tmp_path / 'noise.npz'}",
                      "--max-steps", "2", "--precision", "32-true", "--no-progress",
                      "--logger", "none", "--out", tmp_path / "run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    done = next(i for i, line in enumerate(lines) if line.startswith("done:"))
    assert lines[done + 1].startswith("warning: the model has not learnt: val R² ")
    assert "--max-steps" in lines[done + 1]
