"""``amptrain diagnose``: its flags, the library it drives, and end-to-end runs."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from amptrain.commands import diagnose as command
from tests.conftest import tiny_classification

ROOT = Path(__file__).parents[2]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "amptrain", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_cli_diagnose_writes_json_and_markdown(tmp_path):
    data = tiny_classification(n=128)
    np.savez(tmp_path / "data.npz", x=data.tensors[0].numpy(), y=data.tensors[1].numpy())
    out = tmp_path / "diag"
    result = _cli("diagnose", "--model", "demo-overflow", "--data", f"npz:{tmp_path / 'data.npz'}",
                  "--steps", "3", "--batch-size", "32", "--device", "cpu", "--out", str(out),
                  cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "diagnose.json").read_text())
    assert report["first_nonfinite"]["module"] == "scale"
    assert {"modules", "recommendations", "runs"} <= set(report)
    assert (out / "diagnose.md").read_text().startswith("# amptrain diagnose")
    assert "first non-finite in 16-mixed: module 'scale' (forward) at step 1" in result.stdout
    assert "--keep-fp32 scale" in result.stdout


def test_cli_diagnose_rejects_bad_steps(tmp_path):
    result = _cli("diagnose", "--steps", "0", "--out", str(tmp_path / "x"), cwd=tmp_path)
    assert result.returncode == 2
    assert "--steps" in result.stderr and "Traceback" not in result.stderr


def test_the_library_is_usable_without_the_command_line():
    package = importlib.import_module("amptrain.diagnose")
    assert callable(package.diagnose) and callable(package.write_reports)
    assert not any(name.startswith("amptrain.commands") or name == "amptrain.cli"
                   for name in _imports_of("amptrain.diagnose"))


def _imports_of(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    return set(out.split())


def test_diagnose_flags_leave_out_options_of_a_full_training_run():
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args(["--steps", "3", "--keep-fp32", "head", "--init-scale", "8"])
    assert (args.steps, args.keep_fp32, args.init_scale) == (3, ["head"], 8.0)
    assert parser.parse_args(["--precision", "plan:p.yaml"]).precision == "plan:p.yaml"
    for option in ("--epochs", "--max-steps", "--resume"):
        with pytest.raises(SystemExit):
            parser.parse_args([option, "1"])
    # Every command takes --no-progress (plain lines instead of bars, as train).
    assert parser.parse_args(["--no-progress"]).no_progress is True
