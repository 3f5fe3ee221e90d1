"""trainer/optimizers.py: the optimizer-step unit, through the real Trainer: a task with
two parts gets two optimizers, two schedules, per-part records and checkpoint sections,
and resumes bitwise (32-true: every precision keeps one pair per setup there)."""
from __future__ import annotations

import json
from collections import OrderedDict

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from amptrain.common.errors import UserError
from amptrain.tasks import ClassificationTask
from amptrain.trainer import Trainer
from tests.checkpoint.helpers import StopAt
from tests.conftest import tiny_classification

DATA = tiny_classification(n=200)


class TwoParts(nn.Module):
    """Two linear classifiers whose logits add up: each is one trained part."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.left = nn.Sequential(OrderedDict(fc=nn.Linear(8, 3)))
        self.right = nn.Sequential(OrderedDict(fc=nn.Linear(8, 3), drop=nn.Dropout(0.2)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.left(x) + self.right(x)


class TwoPartTask(ClassificationTask):
    """Each part learns the classes on its own, one loss and one optimizer step each."""

    def models(self, model):
        return {"left": model.left, "right": model.right}

    def training_step(self, ctx):
        for name in ("left", "right"):
            part = ctx.model(name)
            for (x, y), n, share in ctx.micro(name):
                with ctx.autocast():
                    loss = F.cross_entropy(part(x), y)
                ctx.backward(loss * share, loss_id=0)
                ctx.log(f"{name}_loss", loss.detach(), n)
            ctx.step(name)


OPTIONS = dict(precision="32-true", device="cpu", no_progress=True, batch_size=32,
               micro_batch_size=16, epochs=2, log_every=2, lr=0.05, scheduler="cosine",
               deterministic=True)


def _fit(out=None, **options) -> tuple[Trainer, TwoParts]:
    model = TwoParts()
    trainer = Trainer(**{**OPTIONS, **({"out": str(out)} if out else {}), **options})
    trainer.fit(model, DATA, DATA, task=TwoPartTask())
    return trainer, model


def test_two_parts_both_train_with_their_own_optimizer_and_schedule():
    before = {k: v.clone() for k, v in TwoParts().state_dict().items()}
    trainer, model = _fit()
    assert list(trainer.parts) == ["left", "right"]
    left, right = trainer.optimizers["left"], trainer.optimizers["right"]
    assert left is not right
    assert {id(p) for g in left.param_groups for p in g["params"]} \
        == {id(p) for p in model.left.parameters()}
    for key, value in model.state_dict().items():
        assert not torch.equal(value, before[key]), key  # every part moved
    assert trainer.parts["left"].scheduler.last_epoch == trainer.step == 14
    assert trainer.parts["right"].scheduler.last_epoch == 14
    with pytest.raises(UserError, match="trains 2 parts"):
        _ = trainer.optimizer  # one optimizer asked of a two-part run


def test_two_parts_log_per_part_keys():
    trainer, _ = _fit()
    train = [r for r in trainer.history if "samples_per_s" in r]
    assert [r["step"] for r in train] == list(range(2, 15, 2))
    for record in train:
        assert {"left_loss", "right_loss", "lr/left", "lr/right", "grad_norm/left",
                "grad_norm/right", "skipped_steps/left", "skipped_steps/right"} <= set(record)
        assert not {"loss", "lr", "grad_norm"} & set(record)
        assert record["skipped_steps/left"] == record["skipped_steps/right"] == 0
        assert record["grad_norm/left"] > 0 and record["grad_norm/right"] > 0
    assert train[0]["left_loss"] > train[-1]["left_loss"]
    assert "val_acc" in trainer.history[-1]


def test_two_parts_checkpoint_sections_and_bitwise_resume(tmp_path):
    straight, straight_model = _fit(tmp_path / "straight")
    state = torch.load(tmp_path / "straight" / "checkpoints" / "last.pt", weights_only=False)
    assert "optimizer" not in state and set(state["optimizers"]) == {"left", "right"}
    assert state["sections"]["optimizers"] == 1
    assert state["optimizers"]["left"]["scheduler"]["last_epoch"] == 14

    with pytest.raises(Exception, match="SIGTERM|preempt|stopp"):
        _fit(tmp_path / "resumed", callbacks=[StopAt(5)])
    resumed, resumed_model = _fit(tmp_path / "resumed", resume="auto")
    assert resumed.step == straight.step == 14
    for key, value in straight_model.state_dict().items():
        assert torch.equal(value, resumed_model.state_dict()[key]), key

    def records(run):
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        drop = ("samples_per_s", "data_wait_frac", "peak_mem_bytes")
        return [{k: v for k, v in json.loads(line).items() if k not in drop} for line in lines]

    assert records("resumed") == records("straight")


def test_a_one_part_checkpoint_does_not_resume_a_two_part_run(tmp_path):
    # The same model trained as one part (the default task): the weights fit, the
    # optimizer state does not.
    Trainer(**{**OPTIONS, "out": str(tmp_path), "max_steps": 2}).fit(TwoParts(), DATA)
    with pytest.raises(UserError, match="resume .*optimizers for one model; this run trains "
                                        "left, right"):
        _fit(tmp_path, resume="auto")


def test_one_optimizer_of_the_caller_with_two_parts_is_refused():
    model = TwoParts()
    with pytest.raises(UserError, match="optimizer is one optimizer; task classification "
                                        "trains 2 parts"):
        Trainer(**OPTIONS).fit(model, DATA, task=TwoPartTask(),
                               optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


def test_gradients_one_loss_leaves_on_another_part_do_not_leak():
    """The right part's loss backpropagates through the left part too (a GAN's G loss
    through D); the Trainer zeroes every part's gradients before each step."""
    seen = []

    class Leaky(TwoPartTask):
        def training_step(self, ctx):
            seen.append(all(p.grad is None for p in ctx.model("left").parameters()))
            x, y = ctx.micro_batches[0]
            with ctx.autocast():
                loss = F.cross_entropy(ctx.model("left")(x) + ctx.model("right")(x), y)
            ctx.backward(loss)
            ctx.log("loss", loss.detach(), len(y))
            ctx.step("right")  # the left part's gradients stay behind

    Trainer(**{**OPTIONS, "micro_batch_size": 32, "max_steps": 3}).fit(TwoParts(), DATA,
                                                                       task=Leaky())
    assert seen == [True, True, True]


def test_a_tasks_optimizers_must_match_its_parts():
    class Crossed(TwoPartTask):
        def build_optimizers(self, parts, build):
            return {"left": build(parts["right"]), "right": build(parts["left"])}

    class Missing(TwoPartTask):
        def build_optimizers(self, parts, build):
            return {"left": build(parts["left"])}

    with pytest.raises(UserError, match="optimizer of part 'left' updates parameters that "
                                        "are not that part's"):
        Trainer(**OPTIONS).fit(TwoParts(), DATA, task=Crossed())
    with pytest.raises(UserError, match="returned optimizers for left; its parts are left, "
                                        "right"):
        Trainer(**OPTIONS).fit(TwoParts(), DATA, task=Missing())
