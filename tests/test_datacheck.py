"""Checks of data and model outputs before the first step: each is one amptrain error
naming the argument, never an IndexError from inside the loss."""
from __future__ import annotations

import pytest
import torch

from amptrain import datacheck
from amptrain.data import TensorData
from amptrain.errors import UserError

X = torch.randn(20, 4)
Y = torch.arange(20) % 3


@pytest.mark.parametrize("data,fragment", [
    (TensorData(X[:0], Y[:0]), "train_data is empty"),
    (TensorData(X.masked_fill(X > 1, float("nan")), Y), "contains NaN or infinite values"),
    (TensorData(torch.zeros(20, 0), Y), "has no values per sample"),
    (TensorData(X, Y.float()), "labels are float32"),
    (TensorData(X, Y - 1), "label -1 is negative"),
    (None, "must be a Dataset, a DataLoader or an iterable"),
    (X, "must be a Dataset, a DataLoader or an iterable"),
])
def test_datasets_that_cannot_be_trained_on(data, fragment):
    with pytest.raises(UserError, match=fragment):
        datacheck.check_dataset(data, "train_data", classifier=True, class_names=None)


def test_labels_beyond_the_class_names():
    with pytest.raises(UserError, match="label 2 is outside the 2 classes"):
        datacheck.check_dataset(TensorData(X, Y), "val_data", classifier=True,
                                class_names=["a", "b"])
    # Any loss of the caller's own may take float targets.
    datacheck.check_dataset(TensorData(X, Y.float()), "train_data", classifier=False,
                            class_names=None)


def test_outputs_against_labels():
    logits = torch.zeros(4, 3)
    datacheck.check_outputs(logits, torch.tensor([0, 1, 2, 2]), num_classes=3, model_name=None)
    with pytest.raises(UserError, match="returns 3 outputs per sample, but the data has 10"):
        datacheck.check_outputs(logits, torch.tensor([0, 1]), num_classes=10, model_name="m")
    with pytest.raises(UserError, match="label 5 is outside the model's 3 outputs"):
        datacheck.check_outputs(logits, torch.tensor([0, 1]), num_classes=None, model_name=None,
                                all_labels=torch.tensor([0, 5]))
    with pytest.raises(UserError, match="one row of class logits per sample"):
        datacheck.check_outputs(torch.zeros(4), torch.tensor([0, 1, 0, 1]), num_classes=None,
                                model_name=None)
    # Class probabilities (same shape as the logits) are valid cross-entropy targets.
    datacheck.check_outputs(logits, torch.full((4, 3), 1 / 3), num_classes=3, model_name=None)


def test_batch_size_and_first_samples():
    with pytest.raises(UserError, match="batch_size 64 is larger than the training set"):
        datacheck.check_batch_size(20, 64)
    sample = datacheck.first_samples(TensorData(X, Y), torch.device("cpu"))
    assert [tuple(t.shape) for t in sample] == [(2, 4), (2,)]
    assert datacheck.first_samples([(X, Y)], torch.device("cpu")) is None
