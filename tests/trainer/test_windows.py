"""Data order: global batches depend only on seed, epoch and global batch size."""
from __future__ import annotations

import pytest
import torch

from amptrain.trainer.windows import DatasetWindows, SampleOrder, batch_size_of
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

    from amptrain.trainer.streams import LoaderWindows

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


class _ReadsBatches(torch.utils.data.Dataset):
    """A user's dataset (no amptrain base class) that reads whole micro-batches and
    finishes them on the device."""

    def __init__(self) -> None:
        self.x, self.y = torch.arange(12, dtype=torch.float32)[:, None], torch.arange(12)
        self.read: list[list[int]] = []
        self.keys: list[tuple] = []

    def __len__(self) -> int:
        return 12

    def __getitem__(self, index):
        raise AssertionError("read sample by sample")

    def read_batch(self, indices):
        self.read.append(list(indices))
        return self.x[list(indices)], self.y[list(indices)]

    def on_device(self, batch, *, training, key):
        self.keys.append(key)
        return batch[0] * 10, batch[1]


def test_a_users_batch_reader_is_read_a_micro_batch_at_a_time_and_finished_on_device():
    data = _ReadsBatches()
    windows = DatasetWindows(data, SampleOrder(12, 6, 3, shuffle=False, seed=7),
                             torch.device("cpu"))
    epoch = list(windows.epoch(2, start=1))
    assert data.read == [[6, 7, 8], [9, 10, 11]]  # window 1's two micro-batches
    assert [(w.micro_samples, w.global_samples) for w in epoch] == [([3, 3], 6)]
    assert torch.equal(epoch[0].micro_batches[1][0][:, 0], torch.tensor([90., 100., 110.]))
    assert data.keys == [(7, 2, 1, 0, 0), (7, 2, 1, 0, 1)]  # (seed, epoch, window, rank, m)


def test_every_kind_of_data_gives_the_one_windows_type():
    from torch.utils.data import DataLoader

    from amptrain.trainer.windows import Windows
    from amptrain.trainer.streams import LoaderWindows, StreamWindows

    data = TensorData(torch.randn(20, 3), torch.arange(20))
    cpu = torch.device("cpu")
    indexed = DatasetWindows(data, SampleOrder(20, 8, 4), cpu)
    loader = LoaderWindows(DataLoader(data, batch_size=5), 2, cpu)
    stream = StreamWindows(iter(DataLoader(data, batch_size=5)), micro=5, accumulate=2,
                           device=cpu, steps=9)
    assert all(type(w).epoch is Windows.epoch for w in (indexed, loader, stream))
    assert indexed.sample_order is not None and indexed.sample_order.global_batch == 8
    assert loader.sample_order is None and stream.sample_order is None
    assert indexed.known_length and loader.known_length and not stream.known_length
    assert (len(indexed), len(loader), len(stream)) == (3, 2, 9)  # a stream's stands in
    assert indexed.dataset is data and stream.device == cpu


def test_an_epoch_left_midway_has_not_ended():
    windows = DatasetWindows(TensorData(torch.randn(20, 3), torch.arange(20)),
                             SampleOrder(20, 8, 4), torch.device("cpu"))
    epoch = windows.epoch(0)
    next(epoch)
    epoch.close()  # e.g. the micro-batch probe takes one window
    assert not windows.ended
    assert len(list(windows.epoch(1))) == 3 and windows.ended
