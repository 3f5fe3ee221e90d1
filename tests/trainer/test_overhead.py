"""trainer/core.py's overhead: the steady-state step reads nothing back from the device.

A host-device synchronisation in every step (``.item()``, ``bool(tensor)``, ``.cpu()``,
``.tolist()``, an index built from a Python list on the GPU, ...) stalls the Python
thread until the GPU has caught up, so the GPU then idles while the next step is being
launched. On a CPU machine we cannot see CUDA syncs, but every such read goes through
a Python-level tensor method, and ``torch.overrides.TorchFunctionMode`` sees each call:
the spy below records them during steps that are not log steps, in the Trainer's real
loop. (``.to(device)`` cannot be told apart from a copy to the host when the device is
the CPU; the CUDA test at the end covers copies with ``set_sync_debug_mode("error")``.)
The one read the design allows is :meth:`StepOutcome.skipped`, which the Trainer calls one
step late (on CUDA it reads pinned host memory copied without blocking). Gradients freed
between steps and channels_last for conv nets are the loop's other overhead points.
"""
from __future__ import annotations

import sys
import traceback
from typing import Any

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from amptrain.data import TensorData
from amptrain.models import SmallCNN
from amptrain.precision import StepOutcome
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification, tiny_mlp

#: Tensor methods and functions that copy a device value to the host (or need one).
SYNCING = {"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__",
           "nonzero", "argwhere", "unique", "masked_select", "repeat_interleave",
           "_local_scalar_dense"}
#: The reads the design allows: the skip flag, one step late.
ALLOWED_CALLERS = {StepOutcome.skipped.__code__}


class SyncSpy(TorchFunctionMode):
    """Records every host-reading tensor call while ``active`` (with where it came from)."""

    def __init__(self) -> None:
        super().__init__()
        self.active = False
        self.calls: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        name = getattr(func, "__name__", "")
        if self.active and (name in SYNCING or _from_python_to_device(name, kwargs)) \
                and not _called_from(ALLOWED_CALLERS):
            where = "".join(traceback.format_stack(limit=6)[:-1])
            self.calls.append(f"{name}\n{where}")
        return func(*args, **(kwargs or {}))


def _from_python_to_device(name: str, kwargs: Any) -> bool:
    # torch.tensor(list, device=d) / torch.as_tensor(list, device=d): on a GPU this is a
    # blocking copy from pageable memory (a sync); the fix is a pinned tensor copied with
    # non_blocking=True. Here the training device is the CPU, so any device= counts.
    return name in ("tensor", "as_tensor") and (kwargs or {}).get("device") is not None


def _called_from(codes: set) -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


class SpiedWindows:
    """The Trainer's windows, with the spy active while steps ``first``..``last`` run.

    The spy is switched on when window ``first`` is fetched and off when window ``last``
    is (before that step runs), so it covers whole steps and the loop's bookkeeping
    between them, but not the loop's start and end.
    """

    def __init__(self, inner: Any, spy: SyncSpy, first: int, last: int) -> None:
        self.inner, self.spy, self.first, self.last = inner, spy, first, last
        self.fetched = 0

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def epoch(self, epoch: int, start: int = 0):
        for window in self.inner.epoch(epoch, start):
            self.fetched += 1
            self.spy.active = self.first <= self.fetched < self.last
            yield window
        self.spy.active = False


def spied_run(trainer: Trainer, model: nn.Module, data: Any, steps: int, *,
              optimizer: torch.optim.Optimizer | None = None) -> SyncSpy:
    """Train ``steps`` steps; spy on steps 3..steps-1 (none of them a log step)."""
    trainer.config.schedule.max_steps = steps
    trainer.setup(model, data, optimizer=optimizer)
    spy = SyncSpy()
    trainer.train_windows = SpiedWindows(trainer.train_windows, spy, 3, steps)
    with spy:
        trainer.run()
    return spy


def _trainer(precision: str, **options: Any) -> Trainer:
    # numerics off: a sampled telemetry step (auto's first is step 10) reads the device
    # by design; tests/numerics/test_session.py spies on the steps between samples.
    options = {"batch_size": 16, "epochs": 100, "log_every": 1000, "no_progress": True,
               "device": "cpu", "optimizer": "adamw", "scheduler": "cosine",
               "numerics": "off", **options}
    return Trainer(precision=precision, **options)


def _cnn_data(n: int = 64) -> TensorData:
    g = torch.Generator().manual_seed(0)
    return TensorData(torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 4, (n,), generator=g))


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed"])
def test_steady_state_steps_read_nothing_from_the_device(precision):
    trainer = _trainer(precision)
    spy = spied_run(trainer, tiny_mlp(), tiny_classification(), steps=12)
    assert trainer.optimizer.defaults.get("fused"), "the Trainer builds fused AdamW"
    assert spy.calls == [], "host reads in steady-state steps:\n" + "\n".join(spy.calls)
    assert trainer.step == 12


def test_dataloader_steps_read_nothing():
    from torch.utils.data import DataLoader

    loader = DataLoader(tiny_classification(), batch_size=16, shuffle=True)
    spy = spied_run(_trainer("16-mixed"), tiny_mlp(), loader, steps=10)
    assert spy.calls == [], "host reads in steady-state steps:\n" + "\n".join(spy.calls)


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_no_reads_with_clipping_accumulation_and_batchnorm(precision):
    # Clipping (norm stays on the device), 2 micro-batches per step, BatchNorm buffers
    # (saved every step for out-of-memory redo) and channels_last.
    trainer = _trainer(precision, clip_grad_norm=1.0, accumulate=2, channels_last=True)
    torch.manual_seed(0)
    spy = spied_run(trainer, SmallCNN(3, 4, width=4), _cnn_data(), steps=8)
    assert spy.calls == [], "host reads in steady-state steps:\n" + "\n".join(spy.calls)


def test_transformer_steps_read_nothing():
    from amptrain.models import TransformerClassifier

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 50, (64, 12), generator=g)
    tokens[::3, 8:] = 0  # padding
    data = TensorData(tokens, torch.randint(0, 3, (64,), generator=g))
    torch.manual_seed(0)
    model = TransformerClassifier(50, 12, 3, d_model=16, layers=1, heads=2, ff=32)
    spy = spied_run(_trainer("bf16-mixed"), model, data, steps=8)
    assert spy.calls == [], "host reads in steady-state steps:\n" + "\n".join(spy.calls)


def test_spy_sees_the_read_a_non_fused_optimizer_needs():
    # Without a fused optimizer, skipping a non-finite step means asking the host whether
    # to call optimizer.step(): one read per step. The spy must see it (else it proves
    # nothing above).
    model = tiny_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, foreach=True)
    spy = spied_run(_trainer("bf16-mixed"), model, tiny_classification(), steps=8,
                    optimizer=optimizer)
    assert len(spy.calls) == 8 - 3 and all(c.startswith("item") for c in spy.calls)


def test_log_steps_do_read():
    trainer = _trainer("16-mixed", log_every=2)
    spy = spied_run(trainer, tiny_mlp(), tiny_classification(), steps=10)
    assert any(c.startswith("item") for c in spy.calls)  # loss, scale, grad norm


def test_skip_flag_is_read_one_step_late():
    """Step t's skip flag is read only after step t+1's forward/backward was queued."""
    events: list[str] = []
    original = StepOutcome.skipped

    def skipped(self):
        events.append("read")
        return original(self)

    model = tiny_mlp()
    trainer = _trainer("16-mixed")
    trainer.config.schedule.max_steps = 5
    trainer.setup(model, tiny_classification())
    # Registered after setup: its one probe forward (do outputs fit labels?) is no step.
    model.register_forward_pre_hook(lambda *_: events.append("forward"))
    StepOutcome.skipped = skipped
    try:
        trainer.run()
    finally:
        StepOutcome.skipped = original
    # forward(1) forward(2) read(1) forward(3) read(2) ... then the last read at the end.
    assert events[:2] == ["forward", "forward"]
    assert events[2:8] == ["read", "forward"] * 3
    assert events.count("read") == 5


def test_gradients_are_freed_between_steps():
    model = tiny_mlp()
    seen: list[bool] = []
    trainer = _trainer("bf16-mixed", max_steps=4)

    class Check:
        def on_step_end(self, t):
            seen.append(all(p.grad is None for p in t.model.parameters()))

    trainer.callbacks.append(Check())
    trainer.fit(model, tiny_classification())
    assert seen == [True] * 4  # zero_grad(set_to_none=True): no memset, memory returned


def test_channels_last_applies_to_conv_nets():
    torch.manual_seed(0)
    trainer = _trainer("bf16-mixed", channels_last=True, max_steps=2)
    trainer.fit(SmallCNN(3, 4, width=4), _cnn_data())
    conv = trainer.model.features[0][0]
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert not conv.weight.is_contiguous()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_cuda_steady_state_has_no_sync(precision):
    trainer = Trainer(precision=precision, batch_size=16, epochs=100, max_steps=12,
                      log_every=1000, no_progress=True, device="cuda", numerics="off")
    trainer.setup(tiny_mlp(), tiny_classification())

    class SyncErrors(SpiedWindows):
        def epoch(self, epoch, start=0):
            for window in self.inner.epoch(epoch, start):
                self.fetched += 1
                torch.cuda.set_sync_debug_mode("error" if 3 <= self.fetched < 12 else 0)
                yield window
            torch.cuda.set_sync_debug_mode(0)

    trainer.train_windows = SyncErrors(trainer.train_windows, SyncSpy(), 3, 12)
    try:
        trainer.run()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert trainer.step == 12
