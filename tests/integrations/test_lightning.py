"""The Lightning DiagnoseCallback in a real ``lightning.Trainer`` on the CPU: an fp16 run
(Lightning's MixedPrecision plugin with a real GradScaler) whose layer overflows fp16
is named at its first inf and its skipped steps and loss scale are logged; an fp32 run
says which layer would overflow fp16; diagnose.md/.json land in default_root_dir."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

L = pytest.importorskip("lightning")

from lightning.pytorch.plugins import MixedPrecision  # noqa: E402

from amptrain.integrations.lightning import DiagnoseCallback  # noqa: E402

from .models import Overflowing, dataset  # noqa: E402


class Module(L.LightningModule):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.net = Overflowing(factor)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.net(x, y)["loss"]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def _train(tmp_path, factor: float, steps: int = 6, plugins=None, **options):
    callback = DiagnoseCallback(every=2, check_every=2, **options)
    metrics = []

    class Keep(L.Callback):  # what Lightning's loggers receive
        def on_train_batch_end(self, trainer, *args):
            metrics.append(dict(trainer.logged_metrics))

    trainer = L.Trainer(max_steps=steps, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, log_every_n_steps=2, plugins=plugins,
                        callbacks=[callback, Keep()], default_root_dir=str(tmp_path / "out"))
    trainer.fit(Module(factor), torch.utils.data.DataLoader(dataset(), batch_size=8))
    return trainer, callback, tmp_path / "out", metrics


def test_fp16_names_the_overflowing_layer_and_logs_scale_and_skips(tmp_path):
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    trainer, callback, out, metrics = _train(
        tmp_path, 1e5, plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    first = callback.session.first
    assert first is not None and (first.module, first.phase, first.step) == ("net.scale",
                                                                             "forward", 1)
    report = json.loads((out / "diagnose.json").read_text())
    assert report["precision"] == "16-mixed" and report["trainer"].startswith("lightning ")
    assert report["skipped_steps"] == 6  # every step overflowed: the scaler backed off 6 times
    assert report["loss_scale"] == 2.0 ** 10 * 0.5 ** 6
    logged = [m for m in metrics if "amp/loss_scale" in m]
    assert [float(m["amp/skipped_steps"]) for m in logged][-1] == 6.0
    assert report["recommendations"]["keep_fp32"][0]["pattern"] == "net.scale"
    bf16 = report["recommendations"]["bf16"]  # fp16's inf is not taken for out of bf16's range
    assert bf16["fp16_problem"] is True and bf16["avoids_problem"] is True
    assert "module 'net.scale' (forward" in (out / "diagnose.md").read_text()


def test_an_fp32_run_says_which_layer_would_overflow_fp16(tmp_path):
    trainer, callback, out, _ = _train(tmp_path, 1e5)
    assert callback.session.first is None
    report = json.loads((out / "diagnose.json").read_text())
    keep = [k["pattern"] for k in report["recommendations"]["keep_fp32"]]
    assert keep[0] == "net.scale" and report["recommendations"]["bf16"]["avoids_problem"]
    assert report["sampled_steps"] == 3 and report["steps"] == 6
    assert report["modules"]["net.scale"]["activation"]["fp16"]["above_max"] > 0
    assert callback.session.audit_report.findings == [] and report["audit"] == []


def test_the_audit_measures_updates_lost_in_bf16_true(tmp_path):
    # Lightning's bf16-true keeps the weights in bf16: SGD's updates of lr 1e-3 round away.
    callback = DiagnoseCallback(every=2, check_every=2, verbose=False)
    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, precision="bf16-true",
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[callback],
                        default_root_dir=str(tmp_path / "out"))
    trainer.fit(Module(1.0), torch.utils.data.DataLoader(dataset(), batch_size=8))
    found = callback.session.audit_report.findings
    assert [f.kind for f in found] == ["update-below-ulp"], found
    assert "torch.bfloat16 weights were under half an ulp" in found[0].detail


def test_an_exception_still_writes_the_report(tmp_path):
    class Failing(Module):
        def training_step(self, batch, batch_idx):
            if batch_idx == 3:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    callback = DiagnoseCallback(every=1)
    trainer = L.Trainer(max_steps=6, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[callback],
                        default_root_dir=str(tmp_path / "out"))
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Failing(1e5), torch.utils.data.DataLoader(dataset(), batch_size=8))
    report = json.loads((tmp_path / "out" / "diagnose.json").read_text())
    assert report["steps"] == 3 and report["sampled_steps"] == 3  # the steps completed


def test_hooks_come_off_after_training(tmp_path):
    trainer, callback, _, _ = _train(tmp_path, 1.0, steps=2)
    model = trainer.lightning_module
    assert all(not m._forward_hooks for m in model.modules())
    assert isinstance(model.net.head, nn.Linear)


def test_numerics_and_the_first_nonfinite_through_the_callback(tmp_path):
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    _, _, out, _ = _train(tmp_path, 1e5, numerics=3,
                          plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    records = [json.loads(line) for line in (out / "numerics.jsonl").open()]
    assert {r["step"] for r in records} == {3, 6}
    assert {r["format"] for r in records} == {"fp16"}
    # behind the x1e5 layer the head computes inf in fp16: a non-finite amax (null)
    head = [r for r in records if r["module"] == "net.head" and r["tensor"] == "activation"]
    assert head and all(r["amax"] is None for r in head)
    trace = json.loads((out / "nonfinite.json").read_text())
    assert (trace["module"], trace["step"]) == ("net.scale", 1)
