"""trainer/batching.py: the Trainer's side of micro-batch planning (the sizer's own tests
are tests/test_autobatch.py): what ``auto`` needs, and the one place a new plan takes effect."""
from __future__ import annotations

import pytest
import yaml
from torch.utils.data import DataLoader

from amptrain.trainer.autobatch import MicroBatchSplit
from amptrain.common.errors import UserError
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification, tiny_mlp
from tests.trainer.test_autobatch import _train


def test_auto_needs_a_dataset_that_amptrain_batches():
    loader = DataLoader(tiny_classification(n=64), batch_size=16)
    with pytest.raises(UserError, match="a DataLoader's batch_size is its micro-batch"):
        _train(tiny_mlp(), loader, batch_size=64, micro_batch_size="auto")


def test_a_new_plan_takes_effect_in_one_place(tmp_path, capsys):
    trainer = Trainer(precision="32-true", device="cpu", no_progress=True, batch_size=32,
                      max_steps=2, out=str(tmp_path))
    trainer.setup(tiny_mlp(), tiny_classification(n=200))
    assert (trainer.micro_batch_size, trainer.accumulate) == (32, 1)
    capsys.readouterr()
    trainer.sizer.oom_events.append({"step": 1, "micro_batch_size": [32, 8],
                                       "accumulate": [1, 4], "message": "out of memory: 32 -> 8"})
    trainer._use_split(MicroBatchSplit(8, 4))
    assert (trainer.micro_batch_size, trainer.accumulate) == (8, 4)
    # Later epochs are cut the new way: same global batches, smaller micro-batches.
    window = next(trainer.train_windows.epoch(1))
    assert window.micro_samples == [8, 8, 8, 8] and window.global_samples == 32
    resolved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert (resolved["micro_batch_size"], resolved["accumulate"]) == (8, 4)
    assert resolved["oom_events"] == [{"step": 1, "micro_batch_size": [32, 8],
                                       "accumulate": [1, 4]}]
    trainer._use_split(MicroBatchSplit(8, 4))  # an event is told once
    assert capsys.readouterr().err.count("amptrain: out of memory: 32 -> 8") == 1


def test_the_split_is_decided_once_at_set_up_and_every_step_reads_it():
    from amptrain.config import MicroBatchSplit

    trainer = Trainer(precision="32-true", device="cpu", no_progress=True, batch_size=32,
                      micro_batch_size=8, max_steps=2)
    with pytest.raises(UserError, match="set the Trainer up first"):
        _ = trainer.accumulate  # reading the property before setup must raise
    trainer.setup(tiny_mlp(), tiny_classification(n=200))
    decided = trainer.sizer.split
    assert decided == MicroBatchSplit(8, 4) and trainer.accumulate == 4
    trainer.fit(tiny_mlp(), tiny_classification(n=200))
    assert trainer.sizer.split == decided  # no step derived another
    trainer._use_split(MicroBatchSplit.of(4, 32))  # after out-of-memory: re-derived
    assert (trainer.micro_batch_size, trainer.accumulate) == (4, 8)
