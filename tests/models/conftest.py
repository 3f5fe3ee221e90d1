"""Helpers shared by the model tests: data shapes, a batch for them, and the checks every
built-in model passes (forward and backward; a few bf16-mixed steps through the Trainer)."""
from __future__ import annotations

import torch
from torch import nn

from amptrain.data import TensorData
from amptrain.models import ModelInputs, build_model
from amptrain.trainer import Trainer

IMAGES = ModelInputs(num_classes=5, input_shape=(3, 16, 16), kind="image")
SEQUENCES = ModelInputs(num_classes=3, input_shape=(12,), kind="sequence", vocab_size=50)
FEATURES = ModelInputs(num_classes=4, input_shape=(10,), kind="features")


def batch_for(inputs: ModelInputs, n: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, inputs.num_classes, (n,), generator=g)
    if inputs.kind == "sequence":
        x = torch.randint(1, inputs.vocab_size, (n, *inputs.input_shape), generator=g)
        x[:, -3:] = 0  # padding at the end, as the loaders write it
        return x, y
    return torch.randn(n, *inputs.input_shape, generator=g), y


def check_forward_backward(spec: str, inputs: ModelInputs) -> None:
    torch.manual_seed(0)
    model = build_model(spec, inputs)
    x, y = batch_for(inputs)
    logits = model(x)
    assert logits.shape == (len(y), inputs.num_classes)
    nn.functional.cross_entropy(logits, y).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert isinstance(model.head, nn.Linear) and model.head.out_features == inputs.num_classes


def check_trains_under_bf16_mixed(spec: str, inputs: ModelInputs) -> None:
    torch.manual_seed(0)
    model = build_model(spec, inputs)
    before = [p.detach().clone() for p in model.parameters()]
    x, y = batch_for(inputs, n=32, seed=1)
    trainer = Trainer(precision="bf16-mixed", device="cpu", batch_size=8, max_steps=3,
                      log_every=1, no_progress=True, keep_fp32=["head"])
    result = trainer.fit(model, TensorData(x[:24], y[:24]), TensorData(x[24:], y[24:]))
    assert result.steps == 3 and result.skipped_steps == 0
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in result.history if "loss" in r)
    assert result.val_loss is not None and torch.isfinite(torch.tensor(result.val_loss))
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, model.parameters()))
