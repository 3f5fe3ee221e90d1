"""``amptrain env`` from the command line: the table, JSON for machines, and its flags."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from amptrain import cli
from amptrain.precision import MODES
from amptrain.precision.hardware.support import onednn_may_use

ROOT = Path(__file__).parents[2]
CPUINFO = Path("/proc/cpuinfo")


def _cli(*args: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "amptrain", *args], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=120)


def _proc_flags() -> set[str]:
    for line in CPUINFO.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.skipif(not CPUINFO.exists() or not _proc_flags(),
                    reason="needs an x86 Linux /proc/cpuinfo with a flags line")
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU recommendation")
def test_env_json_reports_this_cpus_flags_and_recommends_bf16_where_native():
    result = _cli("env", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    flags = _proc_flags()
    assert info["cpu_flags"] == {name: name in flags for name in
                                 ("amx_bf16", "amx_fp16", "amx_tile", "avx512_bf16",
                                  "avx512_fp16")}
    # Native bf16 is the real CPU's (its flags), unless ONEDNN_MAX_CPU_ISA keeps oneDNN
    # below it (a test run pretending to be an older CPU class).
    native_bf16 = bool({"amx_bf16", "avx512_bf16"} & flags) and onednn_may_use("bf16")
    assert info["recommended_precision"] == ("bf16-mixed" if native_bf16 else "32-true")
    assert set(info["supported"]) == set(MODES) | {"fp8"}
    assert info["supported"]["32-true"] and not info["supported"]["fp8"]
    assert info["supported"]["bf16-mixed"] == native_bf16
    assert info["supported"]["tf32"] is False  # a CUDA feature
    assert info["python"] and info["torch"] == torch.__version__ and info["cpu_cores"] >= 1
    if native_bf16 and "amx_fp16" not in flags:
        assert any("AMX-FP16" in note for note in info["notes"])


def test_cli_env_prints_a_table():
    result = _cli("env")
    assert result.returncode == 0, result.stderr
    assert "precision" in result.stdout and "supported" in result.stdout
    assert "recommended: --precision" in result.stdout
    for name in list(MODES) + ["fp8"]:
        assert f"  {name} " in result.stdout


def test_threads_below_one_is_a_one_line_user_error(capsys):
    assert cli.main(["env", "--threads", "0"]) == 2
    assert capsys.readouterr().err == \
        "amptrain: error: --threads must be an integer >= 1 (got 0)\n"


def test_json_is_the_library_report_as_json(capsys, monkeypatch):
    from amptrain.precision.hardware import probe

    monkeypatch.setattr(probe, "collect_env", lambda: {"python": "3", "torch": "2", "notes": []})
    assert cli.main(["env", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"python": "3", "torch": "2", "notes": []}
