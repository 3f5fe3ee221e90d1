"""version.py: the package version in one place, the one pyproject.toml and the CLI say."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import amptrain
from amptrain.version import __version__

ROOT = Path(__file__).resolve().parents[1]


def test_the_version_is_the_one_pyproject_declares():
    # The [project] table's version line (tomllib is Python 3.11+; the package runs on 3.10).
    text = (ROOT / "pyproject.toml").read_text()
    project = text[text.index("[project]"):]
    declared = re.search(r'^version\s*=\s*"([^"]+)"', project, re.MULTILINE)
    assert declared is not None and __version__ == declared.group(1)
    assert re.fullmatch(r"\d+\.\d+\.\d+([.-]?\w+)?", __version__)


def test_the_package_face_exports_the_same_version():
    assert amptrain.__version__ is __version__


def test_the_command_line_prints_it():
    result = subprocess.run([sys.executable, "-m", "amptrain", "--version"],
                            capture_output=True, text=True, check=True)
    assert result.stdout.strip() == f"amptrain {__version__}"


def test_reading_it_imports_nothing_heavy():
    code = "import sys; from amptrain.version import __version__; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"
