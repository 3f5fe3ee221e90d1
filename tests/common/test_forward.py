"""steps.py: one batch through a model: (logits, loss) out of whatever the model returns,
tuple and dict batches, a model's own loss, and the one-time check before the loss."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from amptrain.common.errors import UserError
from amptrain.common.forward import forward_batch, split_outputs

LOGITS = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
LOSS = torch.tensor(0.25)


@pytest.mark.parametrize("output, logits, loss", [
    (LOGITS, LOGITS, None),                                     # a plain tensor
    ({"logits": LOGITS, "loss": LOSS}, LOGITS, LOSS),           # a dict (HF ModelOutput is one)
    ({"logits": LOGITS}, LOGITS, None),
    ({"loss": LOSS}, None, LOSS),
    ((LOGITS, torch.zeros(4, 8)), LOGITS, None),                # (logits, hidden state, ...)
    ([LOGITS], LOGITS, None),
    (SimpleNamespace(logits=LOGITS, loss=LOSS), LOGITS, LOSS),  # an HF-style object
    (SimpleNamespace(logits=LOGITS), LOGITS, None),
    (SimpleNamespace(hidden=LOGITS), None, None),               # nothing to train on
    ((), None, None),
])
def test_split_outputs(output, logits, loss):
    got_logits, got_loss = split_outputs(output)
    assert got_logits is logits and got_loss is loss


class _Two(nn.Module):
    """Two inputs, logits out; records what it was called with."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def forward(self, a, b=None, labels=None):
        self.calls.append((a, b, labels))
        return a + (b if b is not None else 0)


def test_a_tuple_batch_is_inputs_then_targets():
    model, a, b, y = _Two(), LOGITS, torch.ones(4, 3), torch.tensor([0, 1, 2, 0])
    loss, logits, targets = forward_batch(model, (a, b, y), F.cross_entropy)
    assert model.calls == [(a, b, None)]
    assert torch.equal(logits, a + b) and targets is y
    assert torch.equal(loss, F.cross_entropy(a + b, y))


def test_a_dict_batch_is_keyword_inputs_with_labels_as_targets():
    model, y = _Two(), torch.tensor([2, 2, 1, 0])
    loss, logits, targets = forward_batch(model, {"a": LOGITS, "labels": y}, F.cross_entropy)
    assert model.calls == [(LOGITS, None, y)]  # the labels reach the model too
    assert targets is y and torch.equal(loss, F.cross_entropy(LOGITS, y))


def test_a_loss_the_model_computed_wins_and_skips_the_check():
    def model(inputs, labels):
        return {"loss": LOSS, "logits": inputs}

    def refuse(*_):
        raise AssertionError("not to be called when the model computed its loss")

    loss, logits, targets = forward_batch(model, {"inputs": LOGITS, "labels": torch.zeros(4)},
                                          refuse, check=refuse)
    assert loss is LOSS and logits is LOGITS


def test_check_sees_logits_and_targets_before_the_loss_is_computed():
    order: list[str] = []
    y = torch.tensor([0, 1, 2, 0])

    def check(logits, targets):
        assert logits is LOGITS and targets is y
        order.append("check")

    def loss_fn(logits, targets):
        order.append("loss")
        return F.cross_entropy(logits, targets)

    forward_batch(lambda x: x, (LOGITS, y), loss_fn, check)
    assert order == ["check", "loss"]

    def reject(logits, targets):
        raise UserError("label 2 is outside the model's 2 outputs")

    order.clear()
    with pytest.raises(UserError, match="outside the model's 2 outputs"):
        forward_batch(lambda x: x, (LOGITS, y), loss_fn, reject)
    assert order == []  # refused before any loss


@pytest.mark.parametrize("model, batch", [
    (lambda x: SimpleNamespace(hidden=x), (LOGITS, torch.zeros(4, dtype=torch.long))),
    (lambda inputs: inputs, {"inputs": LOGITS}),  # logits, but no labels to compare them with
])
def test_no_loss_and_no_logits_with_targets_is_a_user_error(model, batch):
    with pytest.raises(UserError, match="returned no loss and no logits with targets"):
        forward_batch(model, batch, F.cross_entropy)


# ------------------------------------------- issue 48: samples the model does not take
class _Samples(torch.utils.data.Dataset):
    """A user's Dataset of 7-feature samples (the model takes 5)."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int):
        return torch.randn(7), i % 2


def test_a_dataset_whose_samples_the_model_cannot_take_is_one_line_naming_the_data():
    from amptrain.trainer import Trainer

    model = nn.Sequential(nn.Linear(5, 2))
    with pytest.raises(UserError) as refused:
        Trainer(max_steps=1, batch_size=8, no_progress=True, logger="none").fit(model,
                                                                                 _Samples())
    message = str(refused.value)
    assert message.startswith("the model fails on the first batch of the training data "
                              "(inputs (8, 7) float32, targets (8,) int64): RuntimeError: "
                              "mat1 and mat2 shapes cannot be multiplied")
    assert "\n" not in message and "forward() takes" in message


def test_only_the_first_batch_is_checked_and_out_of_memory_passes_through():
    def out_of_memory(x):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 1 TB")

    batch = (torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(RuntimeError, match="can't allocate memory"):  # the redo's to retry
        forward_batch(out_of_memory, batch, F.cross_entropy, lambda o, t: None)
    with pytest.raises(ZeroDivisionError):  # a later batch: the model's own error
        forward_batch(lambda x: 1 / 0, batch, F.cross_entropy)
