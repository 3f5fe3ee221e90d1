"""Start-up: ``--help``, ``--version``, every command's ``--help`` and a mistyped flag of
every command are answered without importing torch (or numpy).

Each case runs ``python -X importtime -m amptrain ARGS`` in a fresh process and reads the
interpreter's own record of every import it made (written to stderr): no timing involved.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from amptrain.commands import COMMANDS

REPO = Path(__file__).resolve().parents[2]

CASES = [["--help"], ["--version"], ["--no-such-flag"]]
CASES += [[name, "--help"] for name in COMMANDS]
CASES += [[name, "--no-such-flag"] for name in COMMANDS]


def _imports(args: list[str]) -> tuple[subprocess.CompletedProcess, set[str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "amptrain", *args],
                          env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    return done, imported


@pytest.mark.parametrize("args", CASES, ids=[" ".join(c) for c in CASES])
def test_answered_without_importing_torch(args):
    done, imported = _imports(args)
    assert "amptrain.cli" in imported, done.stderr[-2000:]  # the record is there
    heavy = sorted(name for name in imported if name.split(".")[0] in ("torch", "numpy"))
    assert heavy == [], f"amptrain {' '.join(args)} imported {heavy[:5]}"
    if "--no-such-flag" in args:
        assert done.returncode == 2
        errors = [line for line in done.stderr.splitlines() if line.startswith("amptrain: error:")]
        # One line: the unknown flag, or the required flags missing (eval, export: argparse
        # names those first).
        assert len(errors) == 1, done.stderr[-2000:]
    else:
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip()  # the help text or the version


def test_a_command_that_runs_does_import_torch():
    # The check can fail: a command that does work imports torch, and the record shows it.
    done, imported = _imports(["env"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "torch" in imported
