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

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao not installed")
def test_importing_torchao_through_amptrain_prints_nothing(tmp_path):
    script = ("import logging, warnings\n"
              "from amptrain.common.quiet import quiet_torchao\n"
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

    from amptrain.common.quiet import quiet_imports

    logger = logging.getLogger("torchao")
    before = logger.level
    with quiet_imports():
        assert logger.level == logging.ERROR
    assert logger.level == before
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the context itself warns about nothing
        with quiet_imports():
            pass


def test_an_import_that_resets_log_levels_or_logs_elsewhere_is_still_held_back(caplog):
    # What torch's logging set-up does inside a dependency's import: the named logger's
    # level is reset to NOTSET, and another logger warns. Neither may reach the user; an
    # error still does, and everything speaks again after the block.
    import logging

    from amptrain.common.quiet import quiet_imports

    caplog.set_level(logging.INFO)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with quiet_imports():
            logging.getLogger("torch.utils._pytree").setLevel(logging.NOTSET)
            logging.getLogger("torch.utils._pytree").warning("an Enum ... register_constant")
            logging.getLogger("some.dependency").warning("import-time notice")
            logging.getLogger("some.dependency").error("a real failure")
            warnings.warn("a dependency's DeprecationWarning", DeprecationWarning, stacklevel=1)
        logging.getLogger("some.dependency").warning("said after the import")
        warnings.warn("a warning after the import", UserWarning, stacklevel=1)
    said = [r.getMessage() for r in caplog.records]
    assert said == ["a real failure", "said after the import"]
    assert [str(w.message) for w in caught] == ["a warning after the import"]
    assert logging.root.manager.disable == logging.NOTSET


def _foreign_lines(text: str) -> list[str]:
    """Lines that amptrain's commands did not write (its own start with these)."""
    own = ("amptrain: ", "amptrain[rank", "epoch ", "done: ", "outputs: ")
    return [line for line in text.splitlines() if line.strip() and not line.startswith(own)]


@pytest.mark.slow  # one fresh 3-step training and one fresh torchao import (~20 s)
def test_a_fresh_train_prints_only_amptrains_lines(tmp_path):
    # The acceptance check of issue 37: a user's `amptrain train` in a new interpreter
    # (every dependency imported for the first time) shows no line amptrain did not write.
    from tests.commands.helpers import amptrain

    run = amptrain("train", "--max-steps", "3", "--no-progress", "--out", tmp_path / "run",
                   cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert _foreign_lines(run.stderr) == [] and _foreign_lines(run.stdout) == [], \
        run.stderr + run.stdout
    assert "done: " in run.stdout
    if importlib.util.find_spec("torchao") is None:
        return
    # --optimizer adamw8bit's import of torchao (its compiled step takes minutes on a
    # CPU, so the import path alone, through amptrain, in a fresh interpreter).
    script = ("import torch\nfrom amptrain.trainer.optim import adamw8bit_class\n"
              "adamw8bit_class(torch.nn.Linear(2, 2))\nprint('imported')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and result.stdout == "imported\n"
