"""Checks of what fit() is given, before the first step: each is one amptrain error naming
the argument, never a TypeError or an IndexError from deep inside."""
from __future__ import annotations

import pytest
import torch

from amptrain.trainer import datacheck
from amptrain.data import TensorData
from amptrain.common.errors import UserError
from tests.conftest import tiny_mlp

X = torch.randn(20, 4)
Y = torch.arange(20) % 3


@pytest.mark.parametrize("data,fragment", [
    (TensorData(X[:0], Y[:0]), "train_data is empty"),
    (TensorData(X.masked_fill(X > 1, float("nan")), Y), "contains NaN or infinite values"),
    (TensorData(torch.zeros(20, 0), Y), "has no values per sample"),
    (None, "must be a Dataset, a DataLoader or an iterable"),
    (X, "must be a Dataset, a DataLoader or an iterable"),
])
def test_datasets_that_cannot_be_trained_on(data, fragment):
    with pytest.raises(UserError, match=fragment):
        datacheck.check_dataset(data, "train_data")


@pytest.mark.parametrize("arguments,fragment", [
    (dict(model=None), "model must be a torch.nn.Module"),
    (dict(optimizer="adam"), "optimizer must be a torch.optim.Optimizer"),
    (dict(loss_fn=3), "loss_fn must be callable"),
    (dict(class_names="abc"), "class_names must be a list of strings"),
    (dict(val_data=TensorData(X[:0], Y[:0])), "val_data is empty"),
])
def test_fit_arguments(arguments, fragment):
    given = {"model": tiny_mlp(features=4), "train_data": TensorData(X, Y), "val_data": None,
             "optimizer": None, "loss_fn": None, "class_names": None, **arguments}
    with pytest.raises(UserError, match=fragment):
        datacheck.check_fit_arguments(given.pop("model"), given.pop("train_data"),
                                      given.pop("val_data"), **given)


def test_batch_size_and_first_samples():
    with pytest.raises(UserError, match="batch_size 64 is larger than the training set"):
        datacheck.check_batch_size(20, 64)
    sample = datacheck.first_samples(TensorData(X, Y), torch.device("cpu"))
    assert [tuple(t.shape) for t in sample] == [(2, 4), (2,)]
    assert datacheck.first_samples([(X, Y)], torch.device("cpu")) is None


# ----------------------------------------------------------------- issue 48, class 7
def _optimizer_case(kind: str):
    import torch
    from torch import nn

    model = nn.Linear(4, 2)
    other = nn.Linear(4, 2)
    params = {"other": list(other.parameters()),
              "mixed": [*model.parameters(), *other.parameters()],
              "stray-tensor": [torch.zeros(3, requires_grad=True)]}[kind]
    return model, torch.optim.SGD(params, lr=0.1)


@pytest.mark.parametrize("kind,count", [("other", "2 of 2"), ("mixed", "2 of 4"),
                                        ("stray-tensor", "1 of 1")])
def test_an_optimizer_over_other_parameters_is_refused(kind, count):
    import torch

    from amptrain.common.errors import UserError
    from amptrain.trainer import Trainer

    model, optimizer = _optimizer_case(kind)
    before = [p.detach().clone() for p in model.parameters()]
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randint(0, 2, (16,)))
    trainer = Trainer(max_steps=1, batch_size=8, no_progress=True, logger="none")
    with pytest.raises(UserError) as caught:
        trainer.fit(model, data, optimizer=optimizer)
    message = str(caught.value)
    assert message.startswith(f"optimizer holds {count} parameters that are not the model's")
    assert "\n" not in message
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
