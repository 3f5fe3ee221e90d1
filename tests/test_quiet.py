"""quiet.py: torchao's import noise and torch's warning about its state classes stay out
of normal output; nothing else is silenced."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao not installed")
def test_importing_torchao_through_amptrain_prints_nothing(tmp_path):
    script = ("import logging, warnings\n"
              "from amptrain.quiet import quiet_torchao\n"
              "with quiet_torchao():\n"
              "    from torchao.optim import AdamW8bit\n"
              "warnings.warn('OptimState8bit does not implement _stable_hash_for_caching.')\n"
              "warnings.warn('another warning still shows')\n"
              "logging.getLogger('torchao').warning('torchao still logs after the import')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "Failed to load" not in result.stderr and "register_constant" not in result.stderr
    assert "_stable_hash_for_caching" not in result.stderr
    assert "another warning still shows" in result.stderr
    assert "torchao still logs after the import" in result.stderr


def test_logger_levels_are_restored():
    import logging

    from amptrain.quiet import quiet_imports

    logger = logging.getLogger("torchao")
    before = logger.level
    with quiet_imports():
        assert logger.level == logging.ERROR
    assert logger.level == before
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the context itself warns about nothing
        with quiet_imports():
            pass
