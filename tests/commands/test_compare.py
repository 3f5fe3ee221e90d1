"""``amptrain compare`` from the command line: train and study options from YAML and flags,
one-line user errors, and the acceptance study as a real process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from amptrain import cli
from tests.compare.conftest import PRECISIONS, SUMMARY_FIELDS

ROOT = Path(__file__).parents[2]


def test_cli_takes_train_options_and_compare_options_from_yaml_and_flags(tmp_path, capsys):
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump({"model": "mlp", "precisions": ["32-true", "bf16-mixed"],
                                      "bench_steps": 1, "batch_size": 32}))
    out = tmp_path / "out"
    code = cli.main(["compare", "--config", str(config), "--batch-size", "16", "--timing-warmup",
                     "0", "--no-interleave", "--device", "cpu", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "bf16-mixed" in printed and "speedup" in printed
    details = json.loads((out / "study.json").read_text())
    assert details["config"]["model"] == "mlp" and details["config"]["batch_size"] == 16
    assert details["options"]["interleave"] is False
    assert details["speed"]["bf16-mixed"]["batch_samples"] == 16


@pytest.mark.parametrize("argv, message", [
    (["--precisions", "32-true,fp17"], "--precisions: unknown --precision 'fp17'"),
    (["--seeds", "0"], "--seeds must be an integer >= 1"),
    (["--tolerance-pp", "-1"], "--tolerance-pp must be a number >= 0"),
    (["--resume", "auto"], "unrecognized arguments: --resume"),
    # not silently read as --precisions bf16-mixed (argparse's prefix matching is off)
    (["--precision", "bf16-mixed"], "unrecognized arguments: --precision bf16-mixed"),
])
def test_cli_user_errors_exit_2_with_one_line(tmp_path, capsys, argv, message):
    assert _exit_code(["compare", "--out", str(tmp_path / "x"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_cli_refuses_an_out_dir_that_holds_a_study(tmp_path, capsys):
    (tmp_path / "compare.json").write_text("{}")
    assert _exit_code(["compare", "--out", str(tmp_path)]) == 2
    assert "already holds a compare study" in capsys.readouterr().err


def _exit_code(argv: list[str]) -> int:
    """main()'s exit code, whether it returns it or argparse exits with it."""
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.slow
def test_acceptance_digits_cnn_three_precisions_two_seeds(tmp_path):
    """The issue's acceptance run, end to end through the command line."""
    out = tmp_path / "study"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-m", "amptrain", "compare", "--model", "cnn", "--data", "digits",
         "--seeds", "2", "--epochs", "1", "--timing-steps", "10", "--no-progress",
         "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    elapsed = time.perf_counter() - started
    assert completed.returncode == 0, completed.stderr[-3000:]
    data = json.loads((out / "compare.json").read_text())
    assert set(data) == {"baseline", "runs", "summary"} and data["baseline"] == "32-true"
    assert [r["precision"] for r in data["summary"]] == PRECISIONS
    assert all(list(r) == SUMMARY_FIELDS for r in data["summary"])
    assert len(data["runs"]) == 6 and all(r["same_initial_weights"] for r in data["runs"])
    assert data["summary"][0]["speedup"] == 1.0
    for name in ("report.md", "report.html", "compare.png"):
        assert (out / name).stat().st_size > 1000
    print(f"acceptance study took {elapsed:.0f} s")  # shown with -s; never asserted


@pytest.mark.slow
def test_cli_names_a_row_by_the_low_bit_setting_it_ran_with(tmp_path, capsys):
    """--nvfp4-without rht: the nvfp4 row is printed (and noted as emulated) as "nvfp4
    without rht"; bf16-mixed, which does not read it, and compare.json's keys stay as they
    are."""
    out = tmp_path / "out"
    code = cli.main(["compare", "--model", "mlp", "--precisions", "bf16-mixed,nvfp4",
                     "--baseline", "bf16-mixed", "--nvfp4-without", "rht", "--bench-steps", "1",
                     "--timing-warmup", "0", "--no-interleave", "--batch-size", "32",
                     "--device", "cpu", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    rows = [line.split("  ")[0] for line in printed.splitlines()[2:4]]
    # bf16-mixed is emulated on a CPU without bf16 instructions: marked, or not
    assert rows[0] in ("bf16-mixed", "bf16-mixed (emulated)")
    assert rows[1] == "nvfp4 without rht (emulated)"
    note = next(line for line in printed.splitlines() if line.startswith("(emulated): "))
    assert "nvfp4 without rht ha" in note
    summary = json.loads((out / "compare.json").read_text())["summary"]
    assert [r["precision"] for r in summary] == ["bf16-mixed", "nvfp4"]
    assert json.loads((out / "study.json").read_text())["row_names"] == {
        "nvfp4": "nvfp4 without rht"}
