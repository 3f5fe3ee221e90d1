"""Data order: global batches depend only on seed, epoch and global batch size."""
from __future__ import annotations

import pytest
import torch

from amptrain.batches import DatasetWindows, SampleOrder, batch_size_of
from amptrain.data import TensorData


def _global_batches(n, batch, micro, world, seed=3, epoch=1):
    per_rank = [list(SampleOrder(n, batch, micro, world_size=world, rank=r, seed=seed)
                     .epoch(epoch)) for r in range(world)]
    windows = []
    for step in zip(*per_rank):
        assert len({len(w.micro_indices) for w in step}) == 1  # ranks stay in lock-step
        assert all(len(idx) > 0 for w in step for idx in w.micro_indices)
        windows.append(sorted(i for w in step for idx in w.micro_indices for i in idx))
        assert {w.global_samples for w in step} == {len(windows[-1])}
    return windows


@pytest.mark.parametrize("micro,world", [(8, 1), (4, 1), (16, 2), (4, 2), (2, 4), (1, 4)])
def test_same_samples_form_same_steps_whatever_the_split(micro, world):
    n, batch = 203, 32  # 6 full steps and one partial step of 11 samples
    assert _global_batches(n, batch, micro, world) == _global_batches(n, batch, batch, 1)


def test_order_changes_with_epoch_and_seed_but_covers_everything():
    plan = SampleOrder(100, 10, 10)
    assert plan.order(0) != plan.order(1)
    assert plan.order(0) != SampleOrder(100, 10, 10, seed=1).order(0)
    assert sorted(plan.order(0)) == list(range(100))


def test_partial_window_smaller_than_world_is_dropped():
    plan = SampleOrder(33, 16, 4, world_size=4, rank=0)
    assert len(plan) == 2  # 1 leftover sample cannot be shared by 4 processes
    assert len(SampleOrder(33, 16, 4)) == 3


def test_resume_start_yields_the_remaining_windows():
    plan = SampleOrder(50, 8, 4, seed=0)
    full = list(plan.epoch(2))
    assert list(plan.epoch(2, start=3)) == full[3:]


def test_dataset_windows_index_in_memory_tensors():
    x = torch.arange(20, dtype=torch.float32)[:, None]
    y = torch.arange(20)
    windows = DatasetWindows(TensorData(x, y), SampleOrder(20, 8, 4, shuffle=False),
                             torch.device("cpu"))
    first = next(windows.epoch(0))
    assert first.micro_samples == [4, 4] and first.global_samples == 8
    assert torch.equal(first.micro_batches[1][1], torch.arange(4, 8))
    assert batch_size_of(first.micro_batches[0]) == 4


def test_windows_own_their_micro_batch_and_say_when_an_epoch_ended():
    from torch.utils.data import DataLoader

    from amptrain.streams import LoaderWindows

    data = TensorData(torch.randn(20, 3), torch.arange(20))
    windows = DatasetWindows(data, SampleOrder(20, 8, 4), torch.device("cpu"))
    assert windows.micro_batch == 4 and not windows.ended
    epoch = windows.epoch(0)
    assert next(epoch).micro_samples == [4, 4] and not windows.ended
    windows.resize(2)  # after out-of-memory: later epochs are cut the new way
    assert windows.micro_batch == 2
    assert [w.micro_samples for w in epoch] == [[4, 4], [4]]  # this epoch was planned
    assert windows.ended
    assert [w.micro_samples for w in windows.epoch(1)] == [[2, 2, 2, 2]] * 2 + [[2, 2]]
    loader = LoaderWindows(DataLoader(data, batch_size=5), 2, torch.device("cpu"))
    assert loader.micro_batch == 5 and len(loader) == 2
    assert [w.micro_samples for w in loader.epoch(0)] == [[5, 5], [5, 5]] and loader.ended
    loader.resize(2)
    assert loader.micro_batch == 2
