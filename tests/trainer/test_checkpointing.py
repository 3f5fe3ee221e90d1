"""trainer/checkpointing.py: the Trainer's state as checkpoints hold it, the resolved
config.yaml, and a second fit or a resume into a run directory."""
from __future__ import annotations

import json

import pytest
import torch

from amptrain.precision.hardware.support import auto_mode
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification, tiny_mlp


def _mlp3():
    return tiny_mlp(features=8, classes=3)


def _fit(data, **options):
    model = tiny_mlp()
    options = {"precision": "32-true", "device": "cpu", "no_progress": True, "epochs": 1,
               "scheduler": "none", **options}
    trainer = Trainer(**options)
    trainer.fit(model, data)
    return trainer, model


def test_resolved_config_reruns_with_the_lr_actually_used(tmp_path):
    from amptrain.config import RunConfig, build_config, load_yaml
    from amptrain.optim import scaled_lr

    data = tiny_classification(n=64)
    trainer, _ = _fit(data, batch_size=32, lr=0.01, lr_scaling="linear", base_batch_size=8,
                      out=str(tmp_path / "run"), max_steps=2)
    again = build_config(RunConfig, load_yaml(tmp_path / "run" / "config.yaml"))
    assert scaled_lr(again) == pytest.approx(0.04) == scaled_lr(trainer.config)
    assert again.schedule.warmup_steps == trainer.lr_plan.warmup_steps



def test_second_fit_into_the_same_out_is_refused_and_a_finished_run_resumes_quietly(tmp_path):
    from amptrain.errors import UserError

    data = tiny_classification(n=200)
    options = dict(no_progress=True, epochs=1, batch_size=32, out=str(tmp_path),
                   precision="32-true")
    Trainer(**options).fit(_mlp3(), data, data)
    metrics = (tmp_path / "metrics.jsonl").read_text()
    with pytest.raises(UserError, match="already holds a run"):
        Trainer(**options).fit(_mlp3(), data, data)
    assert (tmp_path / "metrics.jsonl").read_text() == metrics
    # Resuming the finished run trains nothing and logs no second final record.
    result = Trainer(**options, resume="auto").fit(_mlp3(), data, data)
    assert (tmp_path / "metrics.jsonl").read_text() == metrics
    assert result.val_metrics["acc"] == json.loads(metrics.splitlines()[-1])["val_acc"]




def test_resolved_config_holds_what_was_decided_at_set_up():
    trainer = Trainer(precision="auto", device="cpu", no_progress=True, batch_size=32,
                      micro_batch_size=8, max_steps=2,
                      run_info={"model": "mlp", "data": "digits", "note": "not a config key"})
    trainer.setup(tiny_mlp(), tiny_classification(n=64))
    resolved = trainer.resolved_config()
    assert resolved["precision"] == auto_mode(torch.device("cpu")) != "auto"
    assert (resolved["device"], resolved["world_size"]) == ("cpu", 1)
    assert (resolved["micro_batch_size"], resolved["accumulate"]) == (8, 4)
    assert (resolved["model"], resolved["data"]) == ("mlp", "digits")
    assert "note" not in resolved
    assert resolved["lr_scaling"] == "none" and "lr_schedule" in resolved


def test_save_checkpoint_to_a_path_of_ones_choice(tmp_path):
    data = tiny_classification(n=64)
    trainer, model = _fit(data, batch_size=32, max_steps=2)
    assert trainer.save_checkpoint() is None  # no --out and no path: nowhere to write
    path = trainer.save_checkpoint(tmp_path / "mine.pt")
    assert path == tmp_path / "mine.pt" and path.is_file()
    assert not (tmp_path / "checkpoints").exists()
    state = torch.load(path, weights_only=False)
    assert (state["step"], state["epoch"], state["precision_name"]) == (2, 1, "32-true")
    assert all(torch.equal(v, state["model"][k]) for k, v in model.state_dict().items())
