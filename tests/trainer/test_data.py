"""trainer/data.py: how data reaches the model: windows of micro-batches, small in-memory
data moved to the accelerator once, and the one-time check that outputs fit the targets."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from amptrain.trainer.windows import DatasetWindows
from amptrain.trainer.streams import LoaderWindows
from amptrain.data import TensorData
from amptrain.common.errors import UserError
from amptrain.trainer import DEVICE_DATA_LIMIT_BYTES, Trainer
from amptrain.trainer.data import maybe_on_device, windows_of
from tests.conftest import tiny_classification, tiny_mlp


def _trainer(**options) -> Trainer:
    return Trainer(**{"precision": "32-true", "device": "cpu", "no_progress": True,
                      "batch_size": 32, "max_steps": 2, **options})


class Noisy(nn.Module):
    """Draws from the RNG in every forward and remembers the mode of each forward."""

    def __init__(self) -> None:
        super().__init__()
        self.net = tiny_mlp()
        self.modes: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.modes.append(self.training)
        return self.net(x) + 0 * torch.rand(x.shape[0], 1)


def test_the_output_probe_runs_once_in_eval_mode_and_leaves_the_rng_alone():
    data = tiny_classification(n=64)
    probed = Noisy()
    _trainer().setup(probed, data)
    after_probe = torch.get_rng_state()
    assert probed.modes == [False] and probed.training  # one eval-mode forward, mode restored
    unprobed = Noisy()
    _trainer().setup(unprobed, data, loss_fn=F.cross_entropy)  # a caller's loss: no probe
    assert unprobed.modes == []
    # Both set-ups seeded the RNG alike; the probe's draws did not move it.
    assert torch.equal(after_probe, torch.get_rng_state())


def test_a_dataloader_is_checked_on_its_first_batch_before_any_update():
    data = tiny_classification(n=64)
    loader = DataLoader(TensorData(data.tensors[0], data.tensors[1] + 3), batch_size=16)
    model = Noisy()
    trainer = _trainer()
    trainer.setup(model, loader)
    assert model.modes == []  # nothing to probe in memory: the first batch is checked
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(UserError, match="outside the model's 3 outputs"):
        trainer.run()
    assert model.modes == [True]  # refused on the first forward, before its loss
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_a_dataset_is_cut_into_global_batches_of_micro_batches():
    data = tiny_classification(n=200)
    trainer = _trainer(micro_batch_size=8, seed=5)
    trainer.setup(tiny_mlp(), data)
    windows = trainer.train_windows
    assert isinstance(windows, DatasetWindows) and len(windows) == 7  # 6 x 32 + 8
    plan = windows.sample_order
    assert (plan.global_batch, plan.micro_batch, plan.seed, plan.shuffle) == (32, 8, 5, True)
    epoch = list(windows.epoch(0))
    assert epoch[0].micro_samples == [8, 8, 8, 8] and epoch[0].global_samples == 32
    assert epoch[-1].global_samples == 8
    seen = torch.cat([b[-1] for w in epoch for b in w.micro_batches])
    assert sorted(seen.tolist()) == sorted(data.tensors[1].tolist())  # each sample once
    assert not torch.equal(seen, data.tensors[1])                     # shuffled
    # Evaluation reads the data in order, one micro-batch per window.
    ordered = windows_of(data, micro=50, accumulate=1, shuffle=False, config=trainer.config,
                         strategy=trainer.strategy)
    assert [w.micro_samples for w in ordered.epoch(0)] == [[50]] * 4
    assert torch.equal(torch.cat([w.micro_batches[0][-1] for w in ordered.epoch(0)]),
                       data.tensors[1])


def test_a_dataloader_gives_windows_of_accumulate_batches():
    loader = DataLoader(tiny_classification(n=80), batch_size=16)
    trainer = _trainer(batch_size=48, accumulate=3)
    trainer.setup(tiny_mlp(), loader)
    windows = trainer.train_windows
    assert isinstance(windows, LoaderWindows) and len(windows) == 2
    assert [w.micro_samples for w in windows.epoch(0)] == [[16, 16, 16], [16, 16]]


def test_in_memory_data_moves_to_the_accelerator_once():
    moved = []

    class Data(TensorData):
        def to(self, device):
            moved.append(str(device))
            return self

    small = Data(torch.zeros(4, 2), torch.zeros(4, dtype=torch.long))
    fake = torch.device("cuda")
    assert maybe_on_device(small, fake) is small and moved == ["cuda"]
    on_cpu = torch.device("cpu")
    assert maybe_on_device(small, on_cpu) is small and moved == ["cuda"]

    class Huge(Data):
        def nbytes(self):
            return DEVICE_DATA_LIMIT_BYTES + 1

    huge = Huge(torch.zeros(4, 2), torch.zeros(4, dtype=torch.long))
    assert maybe_on_device(huge, fake) is huge and moved == ["cuda"]


class Sleepy(torch.utils.data.Dataset):
    """A dataset whose every sample takes a while to load (a slow disk, a slow decoder)."""

    def __init__(self, data: TensorData, seconds: float) -> None:
        self.data, self.seconds = data, seconds

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        import time

        time.sleep(self.seconds)
        return self.data[index]


def test_data_wait_is_logged_as_a_share_of_training_time(tmp_path):
    import json

    trainer = _trainer(max_steps=4, log_every=2, batch_size=8, out=str(tmp_path / "run"))
    result = trainer.fit(tiny_mlp(), Sleepy(tiny_classification(n=64), 0.01))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    waits = [r["data_wait_frac"] for r in records if "loss" in r]
    assert len(waits) == 2 and all(0.0 <= w <= 1.0 for w in waits)
    assert result.data_wait_frac == pytest.approx(sum(waits) / 2)  # the median of two
    from amptrain.trainer.logs import tb_tag

    assert tb_tag("data_wait_frac") == "train/data_wait_frac"
