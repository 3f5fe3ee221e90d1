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
    from amptrain.trainer.optim import scaled_lr

    data = tiny_classification(n=64)
    trainer, _ = _fit(data, batch_size=32, lr=0.01, lr_scaling="linear", base_batch_size=8,
                      out=str(tmp_path / "run"), max_steps=2)
    again = build_config(RunConfig, load_yaml(tmp_path / "run" / "config.yaml"))
    assert scaled_lr(again) == pytest.approx(0.04) == scaled_lr(trainer.config)
    assert again.schedule.warmup_steps == trainer.lr_schedule.warmup_steps



def test_second_fit_into_the_same_out_is_refused_and_a_finished_run_resumes_quietly(tmp_path):
    from amptrain.common.errors import UserError

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


# ------------------------------------- files of format 1 (amptrain before sections)
def format_1(state):
    """``state`` (format 2) in the layout amptrain wrote before versioned sections (main
    at 5336435, trainer/checkpointing.collect_state): the position at the top, the log
    interval as ``log_window`` (one part logging only loss: its own entries), one part's
    optimizer and scheduler at the top."""
    import torch

    old = {k: v for k, v in state.items()
           if k not in ("sections", "position", "log_interval", "optimizers")}
    old["format_version"] = 1
    ((_, part),) = state["optimizers"].items()
    old["optimizer"], old["scheduler"] = part["optimizer"], part["scheduler"]
    interval = state["log_interval"]
    assert set(interval["sums"]) <= {"loss"} and set(interval["grad_norms"]) <= {"model"}
    old["log_window"] = {"loss_sum": interval["sums"].get("loss", torch.zeros(())),
                         "loss_samples": interval["counts"].get("loss", 0),
                         "samples_since_log": interval["samples_since_log"],
                         "grad_norm": interval["grad_norms"].get("model"),
                         "step_epoch": state["position"]["step_epoch"]}
    return old


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_a_format_1_checkpoint_resumes_as_exactly_as_todays(tmp_path, precision):
    import shutil

    from amptrain import checkpoint

    data, val = tiny_classification(n=96), tiny_classification(n=32, seed=1)
    options = dict(precision=precision, device="cpu", no_progress=True, batch_size=16,
                   micro_batch_size=8, log_every=2, logger="none", seed=3)
    Trainer(**options, max_steps=5, out=str(tmp_path / "today")).fit(tiny_mlp(), data, val)
    shutil.copytree(tmp_path / "today", tmp_path / "old")
    for path in (tmp_path / "old" / "checkpoints").glob("*.pt"):
        state = torch.load(path, weights_only=False)
        assert state["format_version"] == 2 and state["sections"]["position"] == 1
        checkpoint.atomic_save(format_1(state), path)
        assert "sections" not in checkpoint.load(path)
    models = {}
    for run in ("today", "old"):
        models[run] = tiny_mlp()
        Trainer(**options, max_steps=12, out=str(tmp_path / run), resume="auto").fit(
            models[run], data, val)

    def records(run):
        drop = ("samples_per_s", "data_wait_frac", "peak_mem_bytes")
        return [{k: v for k, v in json.loads(line).items() if k not in drop}
                for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]

    assert records("old") == records("today") and records("today")[-1]["step"] == 12
    today = models["today"].state_dict()
    assert all(torch.equal(v, today[k]) for k, v in models["old"].state_dict().items())


@pytest.mark.parametrize("edit, fragment", [
    (lambda s: s["sections"].update(position=9),
     "'position' section has layout 9; this amptrain reads up to 1: upgrade amptrain"),
    (lambda s: s.pop("log_interval"), "'log_interval' section is missing (a damaged"),
    (lambda s: s["sections"].update(rng="one"), "its 'rng' section has layout 'one' (a damaged"),
    (lambda s: s["position"].update(step=-2), "its 'step' is -2, outside 0.."),
], ids=["newer-layout", "section-missing", "layout-not-a-number", "position-negative"])
def test_an_edited_section_is_refused_in_one_line(tmp_path, edit, fragment):
    from amptrain import checkpoint
    from amptrain.common.errors import UserError

    data = tiny_classification(n=64)
    _fit(data, batch_size=32, max_steps=2, out=str(tmp_path))
    path = tmp_path / "checkpoints" / "last.pt"
    state = torch.load(path, weights_only=False)
    edit(state)
    checkpoint.atomic_save(state, path)
    with pytest.raises(UserError, match=str(path)) as error:
        _fit(data, batch_size=32, max_steps=4, out=str(tmp_path), resume=str(path))
    assert fragment in str(error.value)
