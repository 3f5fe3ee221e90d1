"""Shared fixtures: small real datasets and models, CPU-only, seeded."""
from __future__ import annotations

import getpass
import logging
import os
import tempfile
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from amptrain.data import DataOptions, TensorData, build_data

# torch.compile's on-disk kernel cache is not keyed by ATEN_CPU_CAPABILITY (torch 2.13): a
# kernel built for the CPU's own vector ISA and loaded under ATEN_CPU_CAPABILITY=avx2 (the
# AVX2-class check in docs/development.md), or the reverse, computes wrong values or corrupts the
# heap. Each capability gets a cache of its own (subprocesses inherit the variable).
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(
    tempfile.gettempdir(), f"torchinductor-amptrain-tests-{getpass.getuser()}-"
    f"{os.environ.get('ATEN_CPU_CAPABILITY') or 'native'}"))


#: Intra-op threads for every test and the processes tests start (AMPTRAIN_TEST_THREADS to
#: change it). One: the suite's models are tiny, so a second thread gains little on a quiet
#: 2-core machine (the gpt study of tests/tasks/test_lm.py: 2.8 s with one or two; the GAN,
#: compare and examples tests 119 s against 105 s), while on a busy one each of OpenMP's
#: barriers waits for a descheduled thread (the gpt study: 4.6 s with one thread, 12.7 s
#: with two, beside two busy loops; in a loaded full run the slowest tests took 20-50x
#: their quiet time). docs/development.md has the suite's times.
TEST_THREADS = int(os.environ.get("AMPTRAIN_TEST_THREADS", "1"))
for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_variable] = str(TEST_THREADS)  # subprocesses inherit it


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(TEST_THREADS)
    yield


@pytest.fixture(autouse=True, scope="session")
def _token_cache(tmp_path_factory):
    # text: data caches its tokens (amptrain.data.tokenizing.cache_root): never in the
    # user's ~/.cache during tests; subprocesses inherit the variable.
    saved = os.environ.get("AMPTRAIN_CACHE")
    os.environ["AMPTRAIN_CACHE"] = str(tmp_path_factory.mktemp("amptrain-cache"))
    yield
    if saved is None:
        os.environ.pop("AMPTRAIN_CACHE", None)
    else:
        os.environ["AMPTRAIN_CACHE"] = saved


@pytest.fixture(autouse=True)
def _fresh_amptrain_warnings():
    # amptrain says each AmptrainWarning once per process: every test starts afresh.
    from amptrain.common.errors import forget_warnings

    forget_warnings()
    yield


@pytest.fixture(autouse=True)
def _fresh_amptrain_logger():
    # cli.main() installs a stderr handler and stops propagation; a test that ran it must
    # not hide later tests' notices from caplog.
    logger = logging.getLogger("amptrain")
    saved = logger.handlers[:], logger.propagate, logger.disabled
    level = logger.level
    yield
    logger.handlers[:], logger.propagate, logger.disabled = saved
    logger.setLevel(level)   # setLevel clears the isEnabledFor cache; an assignment does not


@pytest.fixture(scope="session")
def digits():
    return build_data("digits", DataOptions())


def tiny_classification(n: int = 200, features: int = 8, classes: int = 3, seed: int = 0
                        ) -> TensorData:
    """A linearly separable-ish problem, small enough for exact comparisons."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, classes, generator=g)
    y = (x @ w).argmax(dim=1)
    return TensorData(x, y)


def tiny_mlp(features: int = 8, classes: int = 3, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential()
    model.add_module("body", nn.Sequential(nn.Linear(features, 16), nn.Tanh()))
    model.add_module("head", nn.Linear(16, classes))
    return model


def fake_gpu(monkeypatch, name: str, major: int, minor: int, memory_gib: int = 80,
             count: int = 1) -> None:
    """Make torch.cuda.* report ``count`` GPUs of one kind (no CUDA needed)."""
    props = SimpleNamespace(name=name, major=major, minor=minor,
                            total_memory=memory_gib * 2 ** 30, multi_processor_count=80)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 90100)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))


class ManualClock:
    """Time that passes only when a test says so (:func:`amptrain.common.clock.use`): timing
    logic judged on step times the test decides, whatever else the machine is running."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds

    def advance(self, seconds: float) -> None:
        self.seconds += seconds


def steps_take(monkeypatch, clock: ManualClock, seconds) -> None:
    """Every training step (the loop's and ``Trainer.train_step``'s: both run inside
    ``TrainStep.on``) takes ``seconds(train_step)`` on ``clock`` (after the real step, which
    takes none of it)."""
    from amptrain.trainer.stepping import TrainStep

    original = TrainStep.__exit__

    def exit_(train_step, *error):
        result = original(train_step, *error)
        clock.advance(seconds(train_step))
        return result

    monkeypatch.setattr(TrainStep, "__exit__", exit_)
