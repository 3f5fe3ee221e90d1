"""reproducibility.py: seeds and kernel choices, what makes a run repeat itself."""
from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from amptrain.common.reproducibility import seed_everything


@pytest.fixture(autouse=True)
def _keep_global_state():
    """These tests reseed and switch process-wide state: give the other tests theirs back."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    deterministic = torch.are_deterministic_algorithms_enabled()
    benchmark = torch.backends.cudnn.benchmark
    yield
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.benchmark = benchmark


def _draws() -> tuple[list[float], list[float], float]:
    return torch.rand(4).tolist(), np.random.rand(4).tolist(), random.random()


def test_the_same_seed_gives_the_same_draws_from_torch_numpy_and_random():
    seed_everything(7)
    first = _draws()
    _draws()  # the streams move on ...
    seed_everything(7)
    assert _draws() == first  # ... and the seed puts every one of them back
    seed_everything(8)
    other = _draws()
    assert all(a != b for a, b in zip(other, first))  # each stream follows the seed


def test_deterministic_forces_deterministic_kernels(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = True
    seed_everything(0)
    assert not torch.are_deterministic_algorithms_enabled()  # not asked for: untouched
    assert torch.backends.cudnn.benchmark is True and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    seed_everything(0, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.benchmark is False
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"  # cuBLAS needs it to repeat
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    seed_everything(0, deterministic=True)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"  # the user's own setting stays


def test_cudnn_benchmark_is_on_for_cuda_training_unless_deterministic():
    from amptrain.common.reproducibility import tune_backends

    saved = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = False
        tune_backends(torch.device("cpu"), deterministic=False)
        assert torch.backends.cudnn.benchmark is False  # not ours to change off CUDA
        tune_backends(torch.device("cuda", 0), deterministic=False)
        assert torch.backends.cudnn.benchmark is True
        tune_backends(torch.device("cuda", 0), deterministic=True)
        assert torch.backends.cudnn.benchmark is False
    finally:
        torch.backends.cudnn.benchmark = saved


# Issue 33: the seed has one owner, which names the two moments a run applies it.
def test_both_phases_start_the_same_stream_from_the_seed():
    from amptrain.common.reproducibility import MODEL_INIT, SEED_PHASES, TRAINING, seed_phase

    assert SEED_PHASES == (MODEL_INIT, TRAINING)
    seed_everything(9)
    expected = _draws()
    for phase in SEED_PHASES:
        torch.rand(3)  # whatever ran before the phase
        seed_phase(phase, 9)
        assert _draws() == expected


def test_deterministic_kernels_come_with_the_training_phase_only():
    from amptrain.common.reproducibility import MODEL_INIT, TRAINING, seed_phase

    torch.use_deterministic_algorithms(False)
    seed_phase(MODEL_INIT, 1, deterministic=True)
    assert not torch.are_deterministic_algorithms_enabled()
    seed_phase(TRAINING, 1, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()


def test_an_unknown_phase_is_refused():
    from amptrain.common.reproducibility import seed_phase

    with pytest.raises(ValueError, match="unknown seed phase 'eval'"):
        seed_phase("eval", 1)
