"""tasks/step.py: the supervised step written against a StepContext. Over micro-batches it
gives the full batch's step (each loss weighted by its share), the first micro-batch alone
is checked, and a user's own step sees a working context through ``Trainer.fit``.

The bit-for-bit comparison of a hand-written step with the default one is
tests/trainer/test_stepping.py.
"""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest
import torch
from torch.nn import functional as F

from amptrain.tasks.step import supervised_step
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification, tiny_mlp

DATA = tiny_classification(n=96)


class _PlainContext:
    """The smallest real :class:`~amptrain.tasks.step.StepContext`: one model, SGD, fp32,
    no gradient sync (the Trainer's context on one CPU in 32-true, without the scaler and
    the logs window)."""

    def __init__(self, model: torch.nn.Module, micro_batches: list[Any]) -> None:
        self._model = model
        self._optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        self.micro_batches = micro_batches
        self.micro_samples = [len(batch[-1]) for batch in micro_batches]
        self.global_samples = sum(self.micro_samples)
        self.step_number = 1
        self.logged: list[tuple[str, float, int]] = []
        self.steps = 0

    def model(self, name: str = "model") -> torch.nn.Module:
        return self._model

    def optimizer(self, name: str = "model") -> torch.optim.Optimizer:
        return self._optimizer

    def autocast(self):
        return nullcontext()

    def micro(self, name: str = "model"):
        for batch, n in zip(self.micro_batches, self.micro_samples):
            yield batch, n, n / self.global_samples

    def backward(self, loss: torch.Tensor, *, loss_id: int = 0) -> None:
        loss.backward()

    def step(self, name: str = "model") -> None:
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)
        self.steps += 1

    def log(self, key: str, value: torch.Tensor, samples: int) -> None:
        self.logged.append((key, float(value), samples))


def _batches(sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = DATA.tensors
    x, y = x[:sum(sizes)].double(), y[:sum(sizes)]
    out, start = [], 0
    for size in sizes:
        out.append((x[start:start + size], y[start:start + size]))
        start += size
    return out


@pytest.mark.parametrize("split", [[16, 16], [20, 12], [8, 8, 8, 8]],
                         ids=["halves", "uneven", "quarters"])
def test_micro_batches_give_the_full_batchs_step(split):
    whole, parts = tiny_mlp().double(), tiny_mlp().double()
    one = _PlainContext(whole, _batches([32]))
    many = _PlainContext(parts, _batches(split))
    supervised_step(one, F.cross_entropy)
    supervised_step(many, F.cross_entropy)
    assert one.steps == many.steps == 1
    moved = False
    for p, q, start in zip(whole.parameters(), parts.parameters(), tiny_mlp().parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12)
        moved |= not torch.allclose(p.float(), start)
    assert moved  # a real step was taken
    # One loss per micro-batch, each the mean over its own samples.
    assert [(key, n) for key, _, n in many.logged] == [("loss", n) for n in split]
    full_loss = one.logged[0][1]
    assert sum(value * n for _, value, n in many.logged) / 32 == pytest.approx(full_loss,
                                                                                 abs=1e-12)


def test_without_the_shares_the_step_would_differ():
    """The test above can fail: summing unweighted micro-batch means is twice the step."""
    whole, parts = tiny_mlp().double(), tiny_mlp().double()
    one = _PlainContext(whole, _batches([32]))
    many = _PlainContext(parts, _batches([16, 16]))
    many.micro = lambda name="model": ((b, n, 1.0) for b, n in
                                       zip(many.micro_batches, many.micro_samples))
    supervised_step(one, F.cross_entropy)
    supervised_step(many, F.cross_entropy)
    assert not all(torch.allclose(p, q) for p, q in zip(whole.parameters(), parts.parameters()))


def test_the_check_sees_only_the_first_micro_batchs_outputs():
    seen: list[tuple[torch.Size, torch.Tensor]] = []
    context = _PlainContext(tiny_mlp().double(), _batches([12, 10, 10]))
    supervised_step(context, F.cross_entropy,
                    check=lambda outputs, targets: seen.append((outputs.shape, targets)))
    assert len(seen) == 1
    assert seen[0][0] == torch.Size([12, 3])
    assert torch.equal(seen[0][1], context.micro_batches[0][1])


def test_a_users_step_gets_a_working_context_from_fit():
    """Through the Trainer: micro-batches and shares, the step counter, a logged value of
    the user's own, and the step moving the weights with the Trainer's optimizer."""
    seen: list[dict[str, Any]] = []

    def my_step(ctx) -> None:
        model = ctx.model()
        shares, sizes = [], []
        for (x, y), n, share in ctx.micro():
            with ctx.autocast():
                loss = F.cross_entropy(model(x), y)
            ctx.backward(loss * share)
            ctx.log("loss", loss.detach(), n)
            ctx.log("doubled", 2 * loss.detach(), n)
            shares.append(share)
            sizes.append(n)
        before = [p.detach().clone() for p in model.parameters()]
        ctx.step()
        seen.append({"step": ctx.step_number, "shares": shares, "sizes": sizes,
                     "micro": len(ctx.micro_batches), "global": ctx.global_samples,
                     "optimizer": ctx.optimizer(),
                     "moved": any(not torch.equal(a, p) for a, p in
                                  zip(before, model.parameters()))})

    trainer = Trainer(device="cpu", deterministic=True, no_progress=True, batch_size=32,
                      micro_batch_size=16, max_steps=3, log_every=1, lr=0.05)
    trainer.fit(tiny_mlp(), DATA, training_step=my_step)
    assert [s["step"] for s in seen] == [1, 2, 3]
    for s in seen:
        assert s["sizes"] == [16, 16] and s["micro"] == 2 and s["global"] == 32
        assert s["shares"] == [0.5, 0.5]
        assert s["optimizer"] is trainer.optimizer and s["moved"]
    records = [r for r in trainer.history if "doubled" in r]
    assert [r["step"] for r in records] == [1, 2, 3]
    for r in records:
        assert r["doubled"] == pytest.approx(2 * r["loss"], rel=1e-6)
