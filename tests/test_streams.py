"""Trainer.fit on what users pass besides a Dataset: generators, iterables,
IterableDatasets and lists of samples."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from amptrain import Trainer
from amptrain.data import TensorData
from amptrain.errors import UserError
from amptrain.streams import StreamWindows, as_dataset, is_sample, is_stream
from tests.conftest import tiny_classification, tiny_mlp

DATA = tiny_classification(n=64)
X, Y = DATA.tensors


class Samples(IterableDataset):
    def __iter__(self):
        for i in range(len(Y)):
            yield X[i], Y[i]


def _batches():
    for i in range(0, 64, 8):
        yield X[i:i + 8], Y[i:i + 8]


def _trainer(**options):
    return Trainer(**{"precision": "32-true", "device": "cpu", "batch_size": 8,
                      "no_progress": True, "lr": 0.05, "optimizer": "sgd", **options})


def test_a_generator_of_batches_trains_like_the_same_batches_in_a_list():
    streamed = _trainer(max_steps=8, epochs=1, scheduler="none")
    streamed.fit(tiny_mlp(), _batches())
    listed = _trainer(max_steps=8, epochs=1, scheduler="none")
    listed.fit(tiny_mlp(), DataLoader(DATA, batch_size=8))
    assert streamed.step == listed.step == 8
    for a, b in zip(streamed.model.parameters(), listed.model.parameters()):
        assert torch.equal(a, b)


def test_an_iterable_dataset_of_samples_is_batched_and_passes_epochs():
    trainer = _trainer(max_steps=12, epochs=3)
    trainer.fit(tiny_mlp(), Samples(), Samples())
    assert trainer.step == 12 and trainer.epoch == 1  # 8 windows an epoch, 4 into the next
    assert trainer.last_eval.samples == 64


def test_a_list_of_samples_is_a_dataset():
    samples = [(X[i], int(Y[i])) for i in range(64)]
    data = as_dataset(samples, "train_data")
    assert isinstance(data, TensorData) and torch.equal(data.tensors[1], Y)
    result = _trainer(epochs=1).fit(tiny_mlp(), samples, samples[:16])
    assert result.steps == 8 and result.val_metrics["acc"] is not None
    assert not is_sample((X[:4], Y[:4])) and is_sample({"x": X[0], "labels": Y[0]})


def test_a_stream_without_max_steps_is_refused_naming_the_option():
    assert is_stream(_batches()) and is_stream(Samples()) and not is_stream([1])
    with pytest.raises(UserError, match="train_data is a stream without a length "
                                        r"\(generator\): set max_steps"):
        _trainer().fit(tiny_mlp(), _batches())


def test_a_generator_read_twice_says_why_the_second_epoch_is_empty(caplog):
    trainer = _trainer(max_steps=20, epochs=2)
    trainer.fit(tiny_mlp(), _batches())
    assert trainer.step == 8
    assert "a generator can be read once" in caplog.text


def test_ranks_take_alternate_micro_batches_of_the_same_stream():
    def windows(rank):
        stream = StreamWindows(list(_batches()), micro=8, accumulate=1,
                               device=torch.device("cpu"), world_size=2, rank=rank, steps=4)
        return [w.micro_batches[0][1] for w in stream.epoch(0)]

    zero, one = windows(0), windows(1)
    assert len(zero) == len(one) == 4
    assert torch.equal(torch.cat([t for pair in zip(zero, one) for t in pair]), Y)


def test_stream_windows_own_their_micro_batch():
    samples = [(torch.randn(3), i % 2) for i in range(10)]
    stream = StreamWindows(samples, micro=4, accumulate=1, device=torch.device("cpu"), steps=5)
    assert stream.micro_batch == 4
    stream.resize(2)  # after out-of-memory: samples are collated in smaller micro-batches
    assert stream.micro_batch == 2
    assert [w.micro_samples for w in stream.epoch(0)] == [[2]] * 5 and stream.ended
