"""The deferred copy of a background save (checkpoint.background): the writer thread copies
the optimizer's parameters and state, the optimizer's next step waits for it, and the file
holds exactly the state of the step that saved; the CRC-32-free write (checkpoint.files).

The writer thread's copy is held back (a gate on ``background._copy_deferred``) so that a
step that did not wait for it would change what the file holds: each test can fail.
"""
from __future__ import annotations

import copy
import threading
import zipfile

import pytest
import torch
from torch import nn

from amptrain import checkpoint
from amptrain.checkpoint import BackgroundWriter
from amptrain.checkpoint import background


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    x, y = torch.randn(16, 6, generator=generator), torch.randint(0, 3, (16,), generator=generator)
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _state(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> dict:
    return {"format": checkpoint.FORMAT, "format_version": checkpoint.FORMAT_VERSION,
            "step": step, "epoch": 0, "window_in_epoch": step, "config": {},
            "model": model.state_dict(), "optimizer": optimizer.state_dict()}


def _write(directory, step: int, gate: threading.Event | None = None):
    def write(state):
        if gate is not None:
            gate.wait(timeout=60)
        return checkpoint.save_run_checkpoint(state, directory, step, keep_last=3)
    return write


def _equal(found, expected) -> None:
    """Bitwise equality of two nested states."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(found, torch.Tensor) and found.dtype == expected.dtype
        assert torch.equal(found, expected)
    elif isinstance(expected, dict):
        assert set(found) == set(expected)
        for key in expected:
            _equal(found[key], expected[key])
    elif isinstance(expected, (list, tuple)):
        assert len(found) == len(expected)
        for a, b in zip(found, expected):
            _equal(a, b)
    else:
        assert found == expected


@pytest.fixture
def held_copy(monkeypatch):
    """The writer thread's deferred copy waits for the returned gate (60 s at most)."""
    gate, started = threading.Event(), threading.Event()
    real = background._copy_deferred

    def copy_when_released(pending):
        started.set()
        gate.wait(timeout=60)
        real(pending)

    monkeypatch.setattr(background, "_copy_deferred", copy_when_released)
    gate.started = started  # type: ignore[attr-defined]
    return gate


def _release_later(gate: threading.Event, seconds: float = 0.3) -> threading.Timer:
    timer = threading.Timer(seconds, gate.set)
    timer.start()
    return timer


@pytest.mark.parametrize("optimizer_name", ["adamw", "sgd"])
def test_a_step_after_a_save_waits_for_the_copy_and_the_file_holds_the_saved_step(
        tmp_path, held_copy, optimizer_name):
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1) if optimizer_name == "adamw" \
        else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _step(model, optimizer, seed=1)
    expected = copy.deepcopy(_state(model, optimizer, step=1))
    writer = BackgroundWriter()
    writer.submit(_state(model, optimizer, step=1), _write(tmp_path, 1), tmp_path,
                  defer=[optimizer])
    assert held_copy.started.wait(timeout=60)
    _release_later(held_copy)
    # The next forward runs at once (it changes BatchNorm's running statistics, which the
    # save copied already); the step waits until the writer thread has its copy.
    _step(model, optimizer, seed=2)
    assert held_copy.is_set(), "the optimizer stepped before the copy was taken"
    writer.wait()
    saved = checkpoint.load(tmp_path / checkpoint.LAST)
    _equal(saved["model"], expected["model"])
    _equal(saved["optimizer"], expected["optimizer"])
    # The test means something: the step did change all of it.
    assert not torch.equal(model[0].weight, expected["model"]["0.weight"])
    assert not torch.equal(model[1].running_mean, expected["model"]["1.running_mean"])
    moment = "exp_avg" if optimizer_name == "adamw" else "momentum_buffer"
    assert not torch.equal(optimizer.state[model[0].weight][moment],
                           expected["optimizer"]["state"][0][moment])


def test_the_wait_runs_before_a_pre_step_hook_that_writes_the_weights(tmp_path, held_copy):
    # Kahan/stochastic decoupled decay writes the fp32 weights in a pre-step hook of its own,
    # registered when the precision was set up (before any save): the copy must come first.
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ran: list[str] = []

    @torch.no_grad()
    def decay(opt, args, kwargs):
        ran.append("decay")
        for group in opt.param_groups:
            for p in group["params"]:
                p.mul_(0.5)

    optimizer.register_step_pre_hook(decay)
    expected = copy.deepcopy(model.state_dict())
    writer = BackgroundWriter()
    writer.submit(_state(model, optimizer, step=0), _write(tmp_path, 0), tmp_path,
                  defer=[optimizer])
    optimizer.register_step_pre_hook(lambda *a: ran.append("later"))  # after the save
    _release_later(held_copy)
    _step(model, optimizer, seed=1)
    writer.wait()
    _equal(checkpoint.load(tmp_path / checkpoint.LAST)["model"], expected)
    assert ran == ["decay", "later"]

    # A second save puts the wait in front again, also of hooks registered since.
    expected = copy.deepcopy(model.state_dict())
    held_copy.clear()
    writer.submit(_state(model, optimizer, step=1), _write(tmp_path, 1), tmp_path,
                  defer=[optimizer])
    _release_later(held_copy)
    _step(model, optimizer, seed=2)
    writer.wait()
    _equal(checkpoint.load(tmp_path / checkpoint.LAST)["model"], expected)
    assert len(optimizer._optimizer_step_pre_hooks) == 3  # one wait hook, not one per save


def test_a_save_requested_while_one_is_in_flight_with_deferred_copies(tmp_path):
    # Save 1's write is held; the step after it goes on (its copy is done); save 2 waits
    # for write 1, then copies step 2's state. Each file holds its own step exactly.
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    _step(model, optimizer, seed=1)
    first = copy.deepcopy(_state(model, optimizer, step=1))
    writer, gate = BackgroundWriter(), threading.Event()
    writer.submit(_state(model, optimizer, step=1), _write(tmp_path, 1, gate), tmp_path,
                  defer=[optimizer])
    _step(model, optimizer, seed=2)  # does not wait for the write, only for the copy
    assert writer.busy
    second = copy.deepcopy(_state(model, optimizer, step=2))

    def save_again():
        writer.submit(_state(model, optimizer, step=2), _write(tmp_path, 2), tmp_path,
                      defer=[optimizer])

    saver = threading.Thread(target=save_again)
    saver.start()
    saver.join(timeout=0.5)
    assert saver.is_alive(), "the second save did not wait for the first write"
    gate.set()
    saver.join(timeout=60)
    writer.wait()
    for name, expected in (("step-1.pt", first), ("step-2.pt", second)):
        saved = checkpoint.load(tmp_path / name)
        _equal(saved["model"], expected["model"])
        _equal(saved["optimizer"], expected["optimizer"])


def test_without_defer_everything_is_copied_at_once(tmp_path, held_copy):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = copy.deepcopy(model.state_dict())
    writer = BackgroundWriter()
    writer.submit(_state(model, optimizer, step=0), _write(tmp_path, 0), tmp_path)
    _step(model, optimizer, seed=1)  # nothing to wait for
    held_copy.set()
    writer.wait()
    _equal(checkpoint.load(tmp_path / checkpoint.LAST)["model"], expected)
    assert not optimizer._optimizer_step_pre_hooks


def test_checkpoints_are_written_without_crc32_and_the_option_is_put_back(tmp_path):
    if not hasattr(torch.serialization, "set_crc32_options"):
        pytest.skip("torch < 2.6 has no CRC-32 option")
    path = tmp_path / "x.pt"
    checkpoint.atomic_save({"format": checkpoint.FORMAT, "w": torch.arange(1000.0)}, path)
    with zipfile.ZipFile(path) as archive:
        assert all(info.CRC == 0 for info in archive.infolist())
    assert torch.serialization.get_crc32_options() is True
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.arange(1000.0))
    torch.save({"w": torch.ones(3)}, tmp_path / "theirs.pt")  # the user's own saves keep it
    with zipfile.ZipFile(tmp_path / "theirs.pt") as archive:
        assert any(info.CRC != 0 for info in archive.infolist())


@pytest.mark.parametrize("precision, options", [
    ("32-true", {}),
    ("bf16-true", {"weight_update": "kahan", "weight_decay": 0.1}),
    ("16-master", {}),
], ids=["32-true", "bf16-true-kahan", "16-master"])
def test_a_run_resumed_from_a_background_save_equals_the_unbroken_run(
        tmp_path, monkeypatch, precision, options):
    # Every deferred copy is slow, so every step after a save waits for it: had the step
    # not waited, the files would hold later weights and moments. (Under bf16-true the
    # file's fp32 weights are fresh conversions of the bf16 ones, copied at once; the hook
    # order is the unit test's above.)
    from tests.checkpoint.helpers import _train

    real = background._copy_deferred

    def slow_copy(pending):
        threading.Event().wait(0.05)
        real(pending)

    monkeypatch.setattr(background, "_copy_deferred", slow_copy)
    full = _train(tmp_path / "full", precision, save_every=3, keep_last=10, **options)
    assert full.step == 21
    resumed = _train(tmp_path / "cut", precision, save_every=3, keep_last=10,
                     resume=str(tmp_path / "full" / "checkpoints" / "step-9.pt"), **options)
    assert resumed.step == 21
    final = checkpoint.load(tmp_path / "full" / "checkpoints" / "last.pt")
    again = checkpoint.load(tmp_path / "cut" / "checkpoints" / "last.pt")
    _equal(again["model"], final["model"])
    _equal(again["optimizers"]["model"]["optimizer"]["state"],
           final["optimizers"]["model"]["optimizer"]["state"])
    _equal(again["precision"], final["precision"])
