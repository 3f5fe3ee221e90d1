"""trainer/reporting.py: what the Trainer tells: log records (metrics.jsonl, TensorBoard,
callbacks), the banner, the eval report, the result, and where a halt began."""
from __future__ import annotations

import json
import statistics

import pytest
import torch

from amptrain.data import TensorData
from amptrain.common.errors import AmptrainWarning, TrainingHalted
from amptrain.models import MLP
from amptrain.precision import MODES
from amptrain.precision.hardware.support import auto_mode
from amptrain.trainer import Trainer
from amptrain.trainer.reporting import banners_once
from tests.conftest import tiny_classification, tiny_mlp

DOCUMENTED_FIELDS = {"step", "epoch", "loss", "lr", "loss_scale", "grad_norm", "skipped_steps",
                     "samples_per_s", "peak_mem_bytes"}


def test_outputs_metrics_tensorboard_and_report(digits, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    torch.manual_seed(0)
    trainer = Trainer(precision="16-mixed", device="cpu", no_progress=True, batch_size=64,
                      epochs=2, log_every=5, out=str(tmp_path))
    trainer.fit(MLP(64, 10, hidden=64), digits.train, digits.val, class_names=digits.class_names)

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "val_acc" in r]
    assert train and evals
    assert all(DOCUMENTED_FIELDS <= set(r) for r in train)
    assert all(r["loss_scale"] == 65536.0 for r in train)
    assert all({"val_loss", "val_acc", "step", "epoch"} <= set(r) for r in evals)

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/loss_scale", "train/grad_norm", "train/skipped_steps",
            "train/samples_per_s", "val/loss", "val/acc", "system/peak_mem_bytes"} <= tags
    scale = events.Scalars("train/loss_scale")
    assert [e.step for e in scale] == [r["step"] for r in train]
    assert all(e.value == 65536.0 for e in scale)

    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    per_class = report["classification_report"]
    assert len([k for k in per_class if k.isdigit()]) == 10
    assert {"macro avg", "weighted avg"} <= set(per_class)
    assert len(report["confusion_matrix"]) == 10
    text = (tmp_path / "eval" / "classification_report.txt").read_text()
    assert "macro avg" in text and "weighted avg" in text
    assert (tmp_path / "checkpoints" / "last.pt").is_file()
    assert (tmp_path / "config.yaml").is_file()


def test_bf16_nonfinite_loss_halts_with_one_line_naming_step_and_module():
    x = torch.randn(64, 8)
    y = torch.randint(0, 3, (64,))
    model = tiny_mlp()
    with torch.no_grad():
        model.body[0].weight.fill_(float("nan"))  # every step is non-finite from the start
    trainer = Trainer(precision="bf16-mixed", device="cpu", no_progress=True, batch_size=8,
                      epochs=1, max_bad_steps=4)
    with pytest.raises(TrainingHalted) as err:
        trainer.fit(model, TensorData(x, y))
    message = str(err.value)
    assert "4 consecutive steps" in message and "step 4" in message
    assert "module 'body.0'" in message
    assert "\n" not in message
    assert trainer.precision.skipped_steps == 4


class _Watch:
    """A callback with every hook, recording what it was told in order."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.records: list[dict] = []

    def on_fit_start(self, trainer):
        self.events.append(("start", trainer.step))

    def on_step_end(self, trainer):
        self.events.append(("step", trainer.step))

    def on_log(self, trainer, record):
        self.records.append(record)
        self.events.append(("train" if "loss" in record else "eval", record["step"]))

    def on_fit_end(self, trainer):
        self.events.append(("end", trainer.step))


def test_callbacks_hear_every_record_and_event_in_order():
    data = tiny_classification(n=200)
    watch = _Watch()
    trainer = Trainer(precision="32-true", device="cpu", no_progress=True, batch_size=32,
                      max_steps=4, log_every=2, callbacks=[watch])
    trainer.fit(tiny_mlp(), data, data)
    assert watch.events == [("start", 0), ("step", 1), ("train", 2), ("step", 2), ("step", 3),
                            ("train", 4), ("step", 4), ("eval", 4), ("end", 4)]
    assert watch.records == trainer.history  # the very records metrics.jsonl gets
    assert set(watch.records[-1]) == {"step", "epoch", "val_loss", "val_acc"}


@pytest.mark.parametrize("precision", ["32-true", "auto"])
def test_the_banner_says_what_will_run_before_the_first_step(capsys, precision):
    trainer = Trainer(precision=precision, device="cpu", no_progress=True, batch_size=32,
                      accumulate=2, max_steps=3)
    trainer.setup(tiny_mlp(), tiny_classification(n=200))
    name = auto_mode(torch.device("cpu")) if precision == "auto" else precision
    chosen = f" (auto: {name})" if precision == "auto" else ""
    banner = (f"amptrain: precision {name}{chosen} [{MODES[name].summary}] on cpu; 3 steps "
              f"(max_steps 3; 0.4 epochs of 7 steps) of 32 samples (16 x 2 accumulated)")
    assert banner in capsys.readouterr().err.splitlines()


def test_the_banner_and_the_emulation_warning_name_a_left_out_part_of_the_recipe(capsys):
    # --nvfp4-without rht: the run is not the whole recipe, and its first lines say so
    trainer = Trainer(precision="nvfp4", nvfp4_without="rht", device="cpu", no_progress=True,
                      batch_size=32, max_steps=1)
    with pytest.warns(AmptrainWarning) as caught:
        trainer.setup(tiny_mlp(), tiny_classification(n=64))
    banner = next(line for line in capsys.readouterr().err.splitlines()
                  if line.startswith("amptrain: precision nvfp4 "))
    assert f"[{MODES['nvfp4'].summary}; without rht] on cpu" in banner
    note = next(str(w.message) for w in caught if "is emulated on this cpu" in str(w.message))
    assert "Hadamard transform on the weight-gradient GEMM; without rht)" in note
    plain = Trainer(precision="nvfp4", device="cpu", no_progress=True, batch_size=32,
                    max_steps=1)
    with pytest.warns(AmptrainWarning):
        plain.setup(tiny_mlp(), tiny_classification(n=64))
    assert f"[{MODES['nvfp4'].summary}] on cpu" in capsys.readouterr().err


def test_the_result_sums_up_the_records():
    data = tiny_classification(n=200)
    trainer = Trainer(precision="32-true", device="cpu", no_progress=True, batch_size=32,
                      epochs=2, log_every=3)
    result = trainer.fit(tiny_mlp(), data, data)
    train = [r for r in trainer.history if "loss" in r]
    last_eval = [r for r in trainer.history if "val_acc" in r][-1]
    assert (result.precision, result.steps, result.epochs_completed) == ("32-true", 14, 2)
    assert result.final_loss == train[-1]["loss"]
    assert (result.val_loss, result.val_metrics["acc"]) == (last_eval["val_loss"],
                                                            last_eval["val_acc"])
    assert result.val_metrics == {"acc": last_eval["val_acc"]}
    assert result.samples_per_s == pytest.approx(
        statistics.median(r["samples_per_s"] for r in train if r["samples_per_s"]))
    assert result.skipped_steps == 0 and result.peak_mem_bytes == trainer.reporter.memory.peak()
    assert result.out is None and result.history == trainer.history
    assert result.history is not trainer.history  # a copy: the caller may keep it


def test_final_evaluation_reuses_an_eval_every_pass_of_the_same_step(tmp_path):
    class Count:
        def __init__(self) -> None:
            self.val_records = []

        def on_log(self, trainer, record) -> None:
            if "val_loss" in record:
                self.val_records.append(record["step"])

    counter = Count()
    trainer = Trainer(precision="32-true", batch_size=50, epochs=1, eval_every=2,
                      no_progress=True, device="cpu", out=str(tmp_path / "run"),
                      callbacks=[counter])
    trainer.fit(tiny_mlp(), tiny_classification(n=200), tiny_classification(n=40, seed=1))
    assert trainer.step == 4 and counter.val_records == [2, 4]  # not [2, 4, 4]
    report = json.loads((tmp_path / "run" / "eval" / "report.json").read_text())
    assert report["accuracy"] == trainer.last_eval.accuracy


def test_separate_loss_scales_put_one_scale_per_loss_in_the_records():
    """A two-part task with separate_loss_scales: each record carries ``loss_scale/<id>``
    (D's loss 0, G's loss 1) beside the first scale's ``loss_scale``; one shared scale
    adds nothing."""
    from amptrain.precision import Precision
    from tests.distributed.two_part_worker import ToyGan, TwoPartTask, data

    records = {}
    for separate in (False, True):
        trainer = Trainer(precision="16-mixed", device="cpu", no_progress=True, batch_size=32,
                          max_steps=6, log_every=2, optimizer="adamw", lr=0.01,
                          init_scale=2.0 ** 18)
        trainer.precision = Precision("16-mixed", device="cpu", init_scale=2.0 ** 18,
                                      separate_loss_scales=separate)
        trainer.fit(ToyGan(), data(), task=TwoPartTask(class_names=["real"]))
        records[separate] = [r for r in trainer.history if "d_loss" in r]
        assert len(records[separate]) == 3
    assert not any(k.startswith("loss_scale/") for r in records[False] for k in r)
    last = records[True][-1]
    assert {"loss_scale/0", "loss_scale/1"} <= set(last)
    assert last["loss_scale"] == last["loss_scale/0"]
    assert {last["loss_scale/0"], last["loss_scale/1"]} <= {2.0 ** k for k in range(10, 19)}


def test_a_study_shows_each_banner_once(capsys):
    data = tiny_classification(n=200)
    options = dict(device="cpu", no_progress=True, batch_size=32, max_steps=1)
    with banners_once():
        for precision in ("32-true", "bf16-mixed", "32-true"):
            Trainer(precision=precision, **options).setup(tiny_mlp(), data)
    Trainer(precision="32-true", **options).setup(tiny_mlp(), data)  # outside: shown again
    lines = [line for line in capsys.readouterr().err.splitlines() if "precision" in line]
    assert [line.split()[2] for line in lines] == ["32-true", "bf16-mixed", "32-true"]
