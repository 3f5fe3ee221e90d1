"""data/protocol.py: the dataset protocol built-in and user data implement, and the one
place that asks a dataset which optional capabilities it has."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from amptrain.data import DataOptions, TensorData, TextOptions, TokenData, build_data, protocol
from amptrain.data.core import ImageTensors
from amptrain.data.protocol import (BatchReading, BatchShaping, ColumnData, DeviceFinishing,
                                    DeviceMovable, MapData)

X = torch.arange(12, dtype=torch.float32).reshape(6, 2)
Y = torch.tensor([0, 1, 0, 1, 1, 0])


def _finish(batch, *, training, key):
    return (batch[0] * 2, batch[1])


def _capabilities(data) -> set[str]:
    kinds = (MapData, ColumnData, BatchShaping, BatchReading, DeviceMovable, DeviceFinishing)
    return {kind.__name__ for kind in kinds if isinstance(data, kind)}


def _token_blocks(tmp_path: Path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"line {i}: the quick brown fox\n" for i in range(40)))
    return build_data(f"text:{corpus}", DataOptions(text=TextOptions(seq_len=16),
                                                    val_fraction=0.25)).train


def test_built_in_data_declares_what_it_can_do(tmp_path):
    tokens = TokenData(torch.ones(4, 5, dtype=torch.long), torch.ones(4, 5, dtype=torch.long),
                       torch.zeros(4, dtype=torch.long), lengths=torch.full((4,), 5))
    images = ImageTensors(torch.zeros(4, 1, 2, 2, dtype=torch.uint8), torch.zeros(4).long(),
                          on_device=_finish)
    assert _capabilities(TensorData(X, Y)) == {"MapData", "ColumnData", "DeviceMovable"}
    assert _capabilities(tokens) == {"MapData", "ColumnData", "DeviceMovable", "BatchShaping"}
    assert _capabilities(images) == {"MapData", "ColumnData", "DeviceMovable",
                                     "DeviceFinishing"}
    assert _capabilities(_token_blocks(tmp_path)) == {"MapData", "BatchReading"}


def test_user_data_implements_it_without_inheriting_from_amptrain():
    class Columns:  # no base class at all
        def __init__(self):
            self.tensors = (X, Y)

        def __len__(self):
            return len(Y)

        def __getitem__(self, i):
            return X[i], Y[i]

    class Reads(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return X[i], Y[i]

        def read_batch(self, indices):
            return X[list(indices)], Y[list(indices)]

    assert _capabilities(TensorDataset(X, Y)) == {"MapData", "ColumnData"}  # torch's own
    assert _capabilities(Columns()) == {"MapData", "ColumnData"}
    assert _capabilities(Reads()) == {"MapData", "BatchReading"}
    assert torch.equal(protocol.batch_reader_of(Reads())([4, 1])[1], Y[[4, 1]])
    assert protocol.batch_reader_of(TensorDataset(X, Y)) is None
    assert protocol.reads_in_process(Reads()) and protocol.reads_in_process(TensorData(X, Y))
    assert not protocol.reads_in_process([(X[0], Y[0])])


@pytest.mark.parametrize("tensors", [(), [1, 2], (X, "labels"), None])
def test_tensors_that_are_not_tensor_columns_are_not_column_data(tensors):
    class Odd(Dataset):
        def __init__(self):
            self.tensors = tensors

    assert protocol.columns_of(Odd()) is None and protocol.targets_of(Odd()) is None


def test_columns_and_targets_of_column_data():
    columns = protocol.columns_of(TensorDataset(X, Y))
    assert isinstance(columns, tuple) and columns[0] is X and columns[1] is Y
    assert protocol.targets_of(TensorData(X, Y)) is Y
    assert protocol.targets_of([(X[0], Y[0])]) is None  # a list is not column data


def test_the_on_device_step_is_found_through_a_dataloader_and_none_means_none():
    images = ImageTensors(torch.zeros(4, 1, 2, 2, dtype=torch.uint8), torch.zeros(4).long(),
                          on_device=_finish)
    assert protocol.finish_of(images) is _finish
    assert protocol.finish_of(DataLoader(images, batch_size=2)) is _finish
    plain = ImageTensors(torch.zeros(4, 1, 2, 2, dtype=torch.uint8), torch.zeros(4).long(),
                         on_device=None)
    assert isinstance(plain, DeviceFinishing) and protocol.finish_of(plain) is None
    assert protocol.finish_of(TensorData(X, Y)) is None


def test_a_stream_is_no_map_data():
    class Stream(IterableDataset):
        def __iter__(self):
            yield X[0], Y[0]

    assert not isinstance(Stream(), MapData) and protocol.columns_of(Stream()) is None
    assert isinstance([1, 2], MapData)
    assert not isinstance(DataLoader(TensorData(X, Y)), MapData)  # sized, not indexable
