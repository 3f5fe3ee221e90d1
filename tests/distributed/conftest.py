"""Fixtures of the distributed tests (helpers that are no fixtures: ``helpers.py``)."""
from __future__ import annotations

import pytest
import torch

from tests.distributed.helpers import ROOT, torchrun


# Session-wide: DDP and FSDP tests in two modules read the same launch (process
# start-up dominates, so one launch runs every scenario).
@pytest.fixture(scope="session")
def scenarios(tmp_path_factory):
    """Run every worker scenario once on 2 processes; returns load(name, rank)."""
    out = tmp_path_factory.mktemp("ddp")
    result = torchrun(str(ROOT / "tests" / "distributed" / "worker.py"), str(out))
    if result.returncode != 0:
        pytest.fail(f"distributed worker failed ({result.returncode}):\n{result.stderr[-6000:]}")

    def load(name: str, rank: int):
        return torch.load(out / f"{name}-rank{rank}.pt", weights_only=False)
    return load
