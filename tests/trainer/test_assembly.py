"""trainer/assembly.py: a task's parts and optimizers are checked before any step."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from amptrain.common.errors import UserError
from amptrain.tasks import ClassificationTask
from amptrain.trainer import Trainer
from tests.distributed.two_part_worker import ToyGan, TwoPartTask, data


class StrayOptimizerTask(TwoPartTask):
    """The generator's optimizer also holds a parameter that belongs to no part."""

    def __init__(self, stray: nn.Parameter, **kwargs) -> None:
        super().__init__(**kwargs)
        self.stray = stray

    def build_optimizers(self, parts, build):
        optimizers = super().build_optimizers(parts, build)
        optimizers["generator"].add_param_group({"params": [self.stray]})
        return optimizers


class CrossedOptimizerTask(TwoPartTask):
    """The discriminator's optimizer steps the generator's weights."""

    def build_optimizers(self, parts, build):
        return {"discriminator": build(parts["generator"]),
                "generator": build(parts["generator"])}


class MissingOptimizerTask(TwoPartTask):
    def build_optimizers(self, parts, build):
        return {"generator": build(parts["generator"])}


def _fit(task) -> None:
    Trainer(device="cpu", no_progress=True, batch_size=32, max_steps=1,
            logger="none").fit(ToyGan(), data(), task=task)


@pytest.mark.parametrize("task,message", [
    (StrayOptimizerTask(nn.Parameter(torch.zeros(3)), class_names=["real"]),
     "the optimizer of part 'generator' updates parameters that are not that part's"),
    (CrossedOptimizerTask(class_names=["real"]),
     "the optimizer of part 'discriminator' updates parameters that are not that part's"),
    (MissingOptimizerTask(class_names=["real"]),
     "returned optimizers for generator; its parts are discriminator, generator"),
], ids=["parameter-of-no-part", "another-parts-parameters", "a-part-without-optimizer"])
def test_optimizers_over_parameters_of_no_part_or_another_part_are_refused(task, message):
    with pytest.raises(UserError, match=message):
        _fit(task)


def test_the_two_part_task_itself_is_accepted_and_trains_both_parts():
    model = ToyGan()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(device="cpu", no_progress=True, batch_size=32, max_steps=2,
                      logger="none", optimizer="adamw", lr=0.01)
    trainer.fit(model, data(), task=TwoPartTask(class_names=["real"]))
    assert set(trainer.optimizers) == {"discriminator", "generator"}
    after = model.state_dict()
    for part in ("generator.", "discriminator."):
        assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith(part))
    assert isinstance(trainer.task, ClassificationTask)
