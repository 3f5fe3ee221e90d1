"""The Trainer loop: accumulation maths, clipping order, skipping, logging, evaluation."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from amptrain.data import TensorData
from amptrain.errors import TrainingHalted
from amptrain.models import MLP
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification, tiny_mlp

DOCUMENTED_FIELDS = {"step", "epoch", "loss", "lr", "loss_scale", "grad_norm", "skipped_steps",
                     "samples_per_s", "peak_mem_bytes"}


def _fit(data, **options):
    model = tiny_mlp()
    options = {"precision": "32-true", "device": "cpu", "no_progress": True, "epochs": 1,
               "scheduler": "none", **options}
    trainer = Trainer(**options)
    trainer.fit(model, data)
    return trainer, model


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_accumulation_equals_one_big_batch_including_partial_window(optimizer):
    data = tiny_classification(n=200)  # 200 = 3 x 64 + 8: the last window is partial
    common = dict(batch_size=64, optimizer=optimizer, lr=0.05, epochs=2)
    _, whole = _fit(data, accumulate=1, **common)
    trainer, accumulated = _fit(data, accumulate=4, **common)
    _, uneven = _fit(data, micro_batch_size=32, **common)
    assert trainer.accumulate == 4 and trainer.micro_batch_size == 16
    for a, b, c in zip(whole.parameters(), accumulated.parameters(), uneven.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)


def test_steps_count_optimizer_steps_not_micro_batches():
    data = tiny_classification(n=256)
    trainer, _ = _fit(data, batch_size=32, accumulate=4, max_steps=5, log_every=1)
    steps = [r["step"] for r in trainer.history if "loss" in r]
    assert steps == [1, 2, 3, 4, 5]
    assert trainer.step == 5


def test_grad_norm_is_logged_unscaled_in_fp16():
    data = tiny_classification(n=128)
    norms = {}
    for name in ("32-true", "16-mixed"):
        trainer, _ = _fit(data, precision=name, batch_size=64, max_steps=2, log_every=1,
                          clip_grad_norm=0.5)
        norms[name] = [r["grad_norm"] for r in trainer.history if "grad_norm" in r]
        if name == "16-mixed":
            assert trainer.history[0]["loss_scale"] == 65536.0
    assert norms["32-true"][0] > 0.5  # clipping was active
    torch.testing.assert_close(torch.tensor(norms["16-mixed"]), torch.tensor(norms["32-true"]),
                               rtol=2e-2, atol=0)


class _InfAt:
    """Poisons the gradient of the first layer on chosen optimizer steps."""

    def __init__(self, model, steps, trainer_ref):
        self.steps, self.trainer = set(steps), trainer_ref
        model.body[0].weight.register_hook(self._hook)

    def _hook(self, grad):
        if self.trainer[0].step in self.steps:
            return torch.full_like(grad, float("inf"))
        return grad


def test_fp16_skipped_step_does_not_advance_lr_schedule():
    data = tiny_classification(n=256)
    model = tiny_mlp()
    trainer = Trainer(precision="16-mixed", device="cpu", no_progress=True, batch_size=32,
                      epochs=1, scheduler="cosine", log_every=1, lr=0.01, init_scale=1024.0)
    _InfAt(model, {3}, [trainer])
    trainer.fit(model, data)
    logs = [r for r in trainer.history if "loss" in r]
    assert [r["skipped_steps"] for r in logs][2:4] == [0, 1]
    assert logs[3]["loss_scale"] == 512.0
    # The schedule is 8 steps long; one skip means the last step ran at the lr of step 7.
    lrs = [r["lr"] for r in logs]
    assert lrs[3] == lrs[2]  # the lr after the skipped step is the lr it would have used
    assert trainer.scheduler.last_epoch == 7


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


PRECISIONS = ["32-true", "tf32", "16-mixed", "bf16-mixed", "16-master", "bf16-master",
              "16-true", "bf16-true"]


@pytest.mark.parametrize("precision", PRECISIONS)
def test_every_precision_learns_digits(digits, precision, tmp_path):
    torch.manual_seed(0)
    model = MLP(64, 10, hidden=128)
    trainer = Trainer(precision=precision, device="cpu", no_progress=True, batch_size=32,
                      epochs=4, lr=3e-3, out=str(tmp_path))
    result = trainer.fit(model, digits.train, digits.val, class_names=digits.class_names)
    assert result.val_acc > 0.90, result
    expected = {"16-master": torch.float16, "bf16-master": torch.bfloat16,
                "16-true": torch.float16, "bf16-true": torch.bfloat16}.get(precision, torch.float32)
    assert model.head.weight.dtype == expected
    if precision.endswith("master"):
        assert all(p.dtype == torch.float32 for g in trainer.optimizer.param_groups
                   for p in g["params"])


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


def test_hf_style_outputs_and_dict_batches():
    class HFStyle(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = tiny_mlp()

        def forward(self, inputs, labels=None):
            logits = self.net(inputs)
            loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
            return {"loss": loss, "logits": logits}

    data = tiny_classification(n=96)
    batches = [{"inputs": data.tensors[0][i:i + 32], "labels": data.tensors[1][i:i + 32]}
               for i in range(0, 96, 32)]
    trainer = Trainer(precision="bf16-mixed", device="cpu", no_progress=True, batch_size=32,
                      epochs=2, log_every=1)
    result = trainer.fit(HFStyle(), batches, batches)
    assert result.steps == 6 and result.val_acc is not None


def test_user_dataloader_partial_last_window_normalised_by_samples():
    from torch.utils.data import DataLoader

    data = tiny_classification(n=80)
    whole_model, accumulated_model = tiny_mlp(), tiny_mlp()
    # 80 samples: batches of 16 -> windows of 3, 2 batches; one big batch of 48 then 32.
    small = DataLoader(data, batch_size=16, shuffle=False)
    big = DataLoader(data, batch_size=48, shuffle=False)
    common = dict(precision="32-true", device="cpu", no_progress=True, epochs=1,
                  scheduler="none", optimizer="sgd", lr=0.1)
    Trainer(batch_size=48, accumulate=3, **common).fit(accumulated_model, small)
    Trainer(batch_size=48, **common).fit(whole_model, big)
    for a, b in zip(whole_model.parameters(), accumulated_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_resolved_config_reruns_with_the_lr_actually_used(tmp_path):
    from amptrain.config import RunConfig, build_config, load_yaml
    from amptrain.optim import scaled_lr

    data = tiny_classification(n=64)
    trainer, _ = _fit(data, batch_size=32, lr=0.01, lr_scaling="linear", base_batch_size=8,
                      out=str(tmp_path / "run"), max_steps=2)
    again = build_config(RunConfig, load_yaml(tmp_path / "run" / "config.yaml"))
    assert scaled_lr(again) == pytest.approx(0.04) == scaled_lr(trainer.config)
    assert again.warmup_steps == trainer.lr_plan.warmup_steps


def test_the_package_exports_the_documented_api_and_the_own_loop_example_trains(capsys):
    import runpy
    from pathlib import Path

    import amptrain

    assert amptrain.Trainer is Trainer and amptrain.Precision.__name__ == "Precision"
    example = runpy.run_path(str(Path(__file__).parents[1] / "examples" / "own_loop.py"))
    example["main"]("16-mixed")
    lines = capsys.readouterr().out.splitlines()
    losses = [float(line.split()[3]) for line in lines if line.startswith("epoch")]
    assert len(losses) == 3 and losses[-1] < 0.6  # chance level is ln(10) = 2.3
    assert "steps 84  skipped 0" in lines[2] and "'scale': 2048.0" in lines[3]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_compile_trains_the_same_model_as_eager(precision):
    # torch.compile on the CPU generates C++ with the system compiler (Inductor).
    data = tiny_classification(n=128)
    common = dict(precision=precision, batch_size=32, optimizer="sgd", lr=0.1, epochs=2)
    _, eager = _fit(data, **common)
    compiled_trainer, compiled = _fit(data, compile=True, **common)
    assert type(compiled_trainer.train_model).__name__ == "OptimizedModule"
    tolerance = dict(rtol=1e-4, atol=1e-5) if precision == "32-true" else dict(rtol=0.05, atol=0.02)
    for a, b in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(a, b, **tolerance)
    assert compiled_trainer.precision.skipped_steps == 0


def test_cudnn_benchmark_is_on_for_cuda_training_unless_deterministic():
    from amptrain.trainer import tune_backends

    saved = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = False
        tune_backends(torch.device("cpu"), deterministic=False)
        assert torch.backends.cudnn.benchmark is False  # not ours to change off CUDA
        tune_backends(torch.device("cuda", 0), deterministic=False)
        assert torch.backends.cudnn.benchmark is True
        tune_backends(torch.device("cuda", 0), deterministic=True)
        assert torch.backends.cudnn.benchmark is False
    finally:
        torch.backends.cudnn.benchmark = saved
