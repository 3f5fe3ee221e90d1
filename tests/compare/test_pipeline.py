"""compare/study.py: the whole study, from options to compare.json, study.json and reports."""
from __future__ import annotations

import json

import pytest
import yaml
from PIL import Image

from amptrain import report
from amptrain.compare import CompareOptions, check_out, run_compare
from amptrain.config import replace_options
from amptrain.errors import UserError
from amptrain.tasks import ClassificationTask
from tests.compare.conftest import PRECISIONS, SEEDS, SUMMARY_FIELDS, small_config

verdict = ClassificationTask().verdict


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
