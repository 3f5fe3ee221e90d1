"""Helpers of the command tests: ``amptrain`` as a user runs it, a real subprocess."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def amptrain(*args: str, cwd: Path | None = None, timeout: float = 300
             ) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "amptrain", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)
