"""trainer/stepping.py: the step runs as a task hook against a StepContext; a user's own
step (``fit(training_step=fn)``) written the Lightning way trains bit for bit like the
default supervised step."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from amptrain.common.errors import UserError
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification, tiny_mlp

DATA = tiny_classification(n=200)


def manual_step(ctx) -> None:
    """The supervised step by hand: what a user writes."""
    model = ctx.model()
    for (x, y), n, share in ctx.micro():
        with ctx.autocast():
            loss = F.cross_entropy(model(x), y)
        ctx.backward(loss * share)
        ctx.log("loss", loss.detach(), n)
    ctx.step()


@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_a_users_step_trains_bit_for_bit_like_the_default(precision):
    options = dict(precision=precision, device="cpu", no_progress=True, batch_size=32,
                   micro_batch_size=16, epochs=1, log_every=2, lr=0.05, clip_grad_norm=1.0)
    default, mine = tiny_mlp(), tiny_mlp()
    a = Trainer(**options)
    a.fit(default, DATA)
    b = Trainer(**options)
    b.fit(mine, DATA, training_step=manual_step)
    for p, q in zip(default.parameters(), mine.parameters()):
        assert torch.equal(p, q)
    keys = ("step", "loss", "lr", "grad_norm", "loss_scale", "skipped_steps")
    assert [{k: r[k] for k in keys} for r in a.history] \
        == [{k: r[k] for k in keys} for r in b.history]


def test_a_step_that_names_no_part_of_the_run_is_refused():
    def wrong(ctx):
        ctx.step("generator")

    with pytest.raises(UserError, match="names the part 'generator'; this run's parts are "
                                        "'model'"):
        Trainer(device="cpu", no_progress=True, max_steps=2, batch_size=32).fit(
            tiny_mlp(), DATA, training_step=wrong)


def test_training_step_must_be_a_function():
    with pytest.raises(UserError, match="training_step must be a function"):
        Trainer(device="cpu", no_progress=True, max_steps=2).fit(
            tiny_mlp(), DATA, training_step="sgd")
