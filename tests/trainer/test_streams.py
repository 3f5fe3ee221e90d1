"""Trainer.fit on what users pass besides a Dataset: generators, iterables,
IterableDatasets and lists of samples."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from amptrain import Trainer
from amptrain.data import TensorData
from amptrain.common.errors import UserError
from amptrain.trainer.streams import StreamWindows, as_dataset, is_sample, is_stream
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


def test_a_sized_loader_keeps_its_short_last_window_where_a_shared_stream_drops_it():
    from amptrain.trainer.streams import LoaderWindows

    batches = list(_batches())[:5]
    cpu = torch.device("cpu")
    # This rank's own loader (a distributed sampler shards it): every batch is its own.
    loader = LoaderWindows(batches, 2, cpu, world_size=2)
    assert [(w.micro_samples, w.global_samples) for w in loader.epoch(0)] == \
        [([8, 8], 32), ([8, 8], 32), ([8], 16)]
    # One stream read by both ranks: alternate batches; the fifth has no partner.
    stream = StreamWindows(batches, micro=8, accumulate=1, device=cpu, world_size=2,
                           rank=1, steps=3)
    got = [w.micro_batches[0][1] for w in stream.epoch(0)]
    assert len(got) == 2 and torch.equal(torch.cat(got), torch.cat([Y[8:16], Y[24:32]]))


def test_an_evaluation_limit_stops_reading_the_source():
    pulled = []

    def counted():
        for i, batch in enumerate(_batches()):
            pulled.append(i)
            yield batch

    stream = StreamWindows(counted(), micro=8, accumulate=1, device=torch.device("cpu"),
                           limit=2)
    assert len(stream) == 2 and len(list(stream.epoch(0))) == 2
    assert pulled == [0, 1, 2]  # the third batch only told it there was more


def test_a_distributed_samplers_epoch_is_set_for_each_pass():
    from torch.utils.data.distributed import DistributedSampler

    from amptrain.trainer.streams import LoaderWindows

    sampler = DistributedSampler(DATA, num_replicas=2, rank=0, shuffle=True, seed=3)
    windows = LoaderWindows(DataLoader(DATA, batch_size=8, sampler=sampler), 1,
                            torch.device("cpu"), world_size=2)
    for epoch in (0, 1):
        seen = torch.cat([w.micro_batches[0][1] for w in windows.epoch(epoch)])
        sampler.set_epoch(epoch)
        assert torch.equal(seen, Y[list(sampler)])
    assert not torch.equal(*(torch.cat([w.micro_batches[0][1] for w in windows.epoch(e)])
                             for e in (0, 1)))


def test_a_list_of_samples_becomes_a_dataset_once_where_it_enters(monkeypatch):
    from amptrain.trainer import assembly, core

    calls = []

    def spy(data, keyword):
        calls.append(keyword)
        return as_dataset(data, keyword)

    monkeypatch.setattr(assembly, "as_dataset", spy)
    monkeypatch.setattr(core, "as_dataset", spy)
    samples = [(X[i], int(Y[i])) for i in range(64)]
    trainer = _trainer(epochs=1)
    trainer.fit(tiny_mlp(), samples, samples[:16])  # windows_of converts nothing again
    assert calls == ["train_data", "val_data"]
    result = trainer.evaluate(data=samples[:24])  # the library's other door
    assert calls[2:] == ["data"] and result.samples == 24
