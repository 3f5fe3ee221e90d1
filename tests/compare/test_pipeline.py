"""compare/study.py: the whole study, from options to compare.json, study.json and reports."""
from __future__ import annotations

import base64
import json
import re

import pytest
import yaml
from PIL import Image

from amptrain import report
from amptrain.compare import CompareOptions, check_out, run_compare
from amptrain.config import replace_options
from amptrain.common.errors import UserError
from amptrain.tasks import ClassificationTask, GanTask
from tests.compare.conftest import PRECISIONS, SEEDS, SUMMARY_FIELDS, small_config

_accuracy = ClassificationTask.metrics.primary


def verdict(delta, tolerance):
    """classification's verdict on a difference in accuracy points."""
    return ClassificationTask.verdict.call(delta, tolerance, _accuracy)


def test_compare_json_has_exactly_the_documented_fields(study):
    data = json.loads((study["out"] / "compare.json").read_text())
    assert data == study["result"]
    assert set(data) == {"baseline", "runs", "summary"}
    assert data["baseline"] == "32-true"
    assert [row["precision"] for row in data["summary"]] == PRECISIONS  # baseline first
    for row in data["summary"]:
        assert list(row) == SUMMARY_FIELDS
        assert row["samples_per_s"] > 0 and row["step_time_ms"] > 0 and row["peak_mem_bytes"] > 0
        assert 0 <= row["val_acc_mean"] <= 1 and row["val_acc_std"] >= 0
        assert row["final_loss_mean"] > 0 and row["skipped_steps"] >= 0
        assert row["verdict"] == verdict(row["delta_acc_pp"], 0.5)
    assert sorted((r["precision"], r["seed"]) for r in data["runs"]) == \
        sorted((p, s) for p in PRECISIONS for s in SEEDS)
    for run in data["runs"]:
        run_dir = study["out"] / "runs" / run["precision"] / f"seed-{run['seed']}"
        assert run["dir"] == f"runs/{run['precision']}/seed-{run['seed']}"
        for name in ("config.yaml", "metrics.jsonl", "tb", "checkpoints/last.pt",
                     "eval/report.json", "eval/classification_report.txt"):
            assert (run_dir / name).exists(), name
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert (config["precision"], config["seed"]) == (run["precision"], run["seed"])
        assert run["steps"] == 6 and run["halted"] is None


def test_study_json_records_how_the_study_was_run(study):
    details = study["details"]
    assert details["seeds"] == SEEDS and details["device"] == "cpu"
    assert (details["options"]["timing_steps"], details["options"]["timing_warmup"]) == (3, 1)
    # The shared training options, without the two that differ per run.
    assert "precision" not in details["config"] and "out" not in details["config"]
    assert details["config"]["model"] == "cnn:8" and details["config"]["max_steps"] == 6
    assert set(details["speed"]) == set(PRECISIONS)
    runs = json.loads((study["out"] / "compare.json").read_text())["runs"]
    for precision, speed in details["speed"].items():
        # the runs' own step time beside the timed one; 6 steps logged in one window at
        # --log-every 10 are too few to judge the timing by (compare/reliability.py)
        assert speed["total_steps"] == 6 and speed["train_step_time_ms"] is None
        assert all(r["train_speed_windows"] == 1 for r in runs if r["precision"] == precision)
    assert "allocation events" in details["memory_method"]  # the CPU's way of measuring
    assert {"python", "torch"} <= set(details["env"])
    for name in ("report.md", "report.html", "compare.png"):
        assert (study["out"] / name).stat().st_size > 0, name


def test_speed_only_study_skips_training_and_still_reports(tmp_path):
    out = tmp_path / "bench"
    result = run_compare(small_config(out), CompareOptions(
        precisions="bf16,32-true", bench_steps=2, timing_warmup=1, seeds=3, interleave=False))
    assert result["runs"] == [] and not (out / "runs").exists()
    assert [r["precision"] for r in result["summary"]] == ["32-true", "bf16-mixed"]
    for row in result["summary"]:
        assert list(row) == SUMMARY_FIELDS
        assert row["samples_per_s"] > 0 and row["val_acc_mean"] is None
        assert row["verdict"] is None
    assert "speed only" in (out / "report.md").read_text()
    assert Image.open(out / "compare.png").size == report.PNG_SIZE


def test_check_out_refuses_a_directory_that_holds_a_study(tmp_path):
    check_out(tmp_path / "new")  # nothing there yet
    check_out(tmp_path)          # an unrelated directory
    (tmp_path / "runs").mkdir()
    with pytest.raises(UserError, match="already holds a compare study"):
        check_out(tmp_path)
    (tmp_path / "runs").rmdir()
    (tmp_path / "compare.json").write_text("{}")
    with pytest.raises(UserError, match="already holds a compare study"):
        check_out(tmp_path)


@pytest.mark.parametrize("overrides, message", [
    (dict(resume="auto"), "compare starts every run fresh: drop --resume"),
    (dict(out=None), "compare needs --out DIR"),
])
def test_run_compare_refuses_before_measuring_anything(tmp_path, overrides, message):
    config = replace_options(small_config(tmp_path / "study"), **overrides)
    with pytest.raises(UserError, match=message):
        run_compare(config, CompareOptions(bench_steps=1, timing_warmup=0))
    assert not (tmp_path / "study").exists()


@pytest.mark.slow
def test_a_gan_is_judged_by_val_fd_with_the_tasks_tolerance_and_shows_its_grids(tmp_path):
    """compare --model dcgan: the gan task's metric and default tolerance (said why in
    study.json and report.md), and one embedded sample grid per precision in report.html."""
    out = tmp_path / "gan"
    config = small_config(out, model="dcgan:width=8,latent=8", max_steps=3, batch_size=32)
    result = run_compare(config, CompareOptions(precisions="32-true,bf16-mixed", seeds=1,
                                                timing_steps=2, timing_warmup=1))
    task = GanTask()
    rows = {r["precision"]: r for r in result["summary"]}
    assert list(rows) == ["32-true", "bf16-mixed"]
    for row in rows.values():
        assert row["val_fd_mean"] > 0 and "val_acc_mean" not in row
        assert row["verdict"] == task.verdict.call(row["delta_fd_rel"],
                                                   GanTask.verdict.default_tolerance,
                                                   task.metrics.primary)
    for run in result["runs"]:
        assert run["val_fd"] > 0 and run["same_initial_weights"] is True
    details = json.loads((out / "study.json").read_text())["task"]
    assert (details["name"], details["tolerance"], details["tolerance_source"]) == \
        ("gan", GanTask.verdict.default_tolerance, "task")
    assert re.search(r"tolerance: the gan task's default \S*tolerance.rel 0\.25: its metric "
                     r"varies", (out / "report.md").read_text())
    page = (out / "report.html").read_text()
    figures = re.findall(r'<figure><img alt="generated samples, ([^"]+)" '
                         r'src="data:image/png;base64,([^"]+)">', page)
    assert [p for p, _ in figures] == ["32-true", "bf16-mixed"]
    for p, data in figures:  # each precision's own grid, embedded (the page stays one file)
        assert base64.b64decode(data) == \
            (out / "runs" / p / "seed-0" / "eval" / "samples.png").read_bytes()


def test_max_steps_sets_every_runs_length_and_each_banner_shows_once(tmp_path, capsys):
    # digits at batch 64: 23 steps an epoch; --max-steps alone trains past the first epoch
    config = small_config(tmp_path / "study", model="mlp", max_steps=25)
    options = CompareOptions(precisions="32-true,bf16-mixed", seeds=2, timing_steps=1,
                             timing_warmup=0)
    result = run_compare(config, options, pick_log_every=False)
    assert [run["steps"] for run in result["runs"]] == [25] * 4
    banners = [line for line in capsys.readouterr().err.splitlines()
               if line.startswith("amptrain: precision ")]
    assert [line.split()[2] for line in banners] == ["32-true", "bf16-mixed"]  # once each
    assert all("25 steps (max_steps 25; 1.1 epochs of 23 steps)" in b for b in banners)
