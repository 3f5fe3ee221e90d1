"""``amptrain eval`` end to end, as a real process: a checkpoint file or a run directory."""
from __future__ import annotations

import json

import pytest

from tests.commands.helpers import amptrain


@pytest.mark.slow
def test_eval_of_the_checkpoint(digits_run, tmp_path):
    out, trained = digits_run
    assert trained.returncode == 0, trained.stderr
    result = amptrain("eval", "--checkpoint", out / "checkpoints" / "last.pt", "--data", "digits",
                      "--precision", "bf16-mixed", "--out", tmp_path / "ev", "--no-progress",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "checkpoint trained with bf16-mixed" in result.stdout
    report = json.loads((tmp_path / "ev" / "eval" / "report.json").read_text())
    trained_report = json.loads((out / "eval" / "report.json").read_text())
    # The same validation split and weights; only the batch size of evaluation differs.
    assert report["accuracy"] == pytest.approx(trained_report["accuracy"], abs=0.01)
    assert (tmp_path / "ev" / "eval" / "classification_report.txt").is_file()


@pytest.mark.slow
def test_eval_of_a_run_directory_takes_its_last_checkpoint(digits_run, tmp_path):
    out, trained = digits_run
    assert trained.returncode == 0, trained.stderr
    result = amptrain("eval", "--checkpoint", out, "--out", tmp_path / "ev", "--no-progress",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"is a directory: using {out / 'checkpoints' / 'last.pt'}" in result.stderr
