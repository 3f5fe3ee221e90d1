"""Fixtures of the checkpoint tests (helpers that are no fixtures: ``helpers.py``)."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from amptrain import cli
from tests.checkpoint.helpers import CLI_RUN, _finish, _start


@pytest.fixture(autouse=True)
def _restore_determinism():
    # --deterministic flips a process-wide switch; give the other tests their default back.
    yield
    torch.use_deterministic_algorithms(False)


@pytest.fixture
def notices():
    """Messages of the amptrain logger (the CLI turns its propagation off)."""
    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("amptrain")
    handler, level = Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture
def run_cli(capsys):
    """``amptrain ARGS`` in this process: (exit code, stderr)."""
    logger = logging.getLogger("amptrain")
    saved = logger.handlers[:], logger.propagate, logger.level

    def run(*args: str) -> tuple[int, str]:
        logger.handlers.clear()  # the CLI then logs to the stderr captured right now
        capsys.readouterr()
        code = cli.main([str(a) for a in args])
        return code, capsys.readouterr().err

    yield run
    logger.handlers[:], logger.propagate, level = saved
    logger.setLevel(level)   # clears the isEnabledFor cache (an assignment to .level does not)


@pytest.fixture
def cli_checkpoint(tmp_path, run_cli) -> Path:
    code, err = run_cli("train", *CLI_RUN, "--out", tmp_path / "run")
    assert code == 0, err
    return tmp_path / "run" / "checkpoints" / "last.pt"


# One reference run for the whole session: the tests that compare with it
# live in two modules (a module-scoped fixture would train it twice).
@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    code, err = _finish(_start(out))
    assert code == 0, err
    return out
