"""Attention, softmax, norms and recurrent layers under fp16 autocast on the CPU.

What torch does (checked here, so a torch upgrade that changes it is noticed): CPU fp16
autocast leaves layer_norm in the input's dtype (CUDA's autocast puts it on its fp32
list), its softmax and scaled_dot_product_attention kernels accumulate in fp32 and stay
finite, and oneDNN's fp16 LSTM fails when gradients are needed. amptrain's precision
layer runs norm and recurrent layers as fp32 islands under CPU fp16, so a post-norm
residual stream stays fp32 as on a GPU and LSTMs train in 16-mixed.
"""
from __future__ import annotations

import csv
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from amptrain.config import RunConfig
from amptrain.data import DataOptions, TensorData, build_data
from amptrain.precision.hardware.devices import cpu_isa, cpu_reaches
from amptrain.models import build_model
from amptrain.precision import Precision
from amptrain.precision.islands import CPU_FP16_FP32_TYPES
from amptrain.workflows.runner import model_inputs, run_training
from amptrain.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="checks CUDA autocast; no CUDA GPU here")


# ------------------------------------------------------------ what torch does
def test_cpu_fp16_autocast_leaves_layer_norm_and_softmax_in_fp16():
    x = torch.randn(4, 32, dtype=torch.float16)
    norm = nn.LayerNorm(32)
    with torch.autocast("cpu", dtype=torch.float16):
        assert norm(x).dtype == torch.float16            # CUDA autocast: float32
        assert torch.softmax(x, -1).dtype == torch.float16
        assert norm(x.float()).dtype == torch.float32    # an fp32 input stays fp32


def test_cpu_fp16_softmax_and_attention_accumulate_in_fp32():
    torch.manual_seed(0)
    logits = (torch.randn(4, 128) * 1e4).clamp(-6e4, 6e4).half()
    with torch.autocast("cpu", dtype=torch.float16):
        probs = torch.softmax(logits, -1)
    assert torch.isfinite(probs).all()
    torch.testing.assert_close(probs.float(), torch.softmax(logits.float(), -1), atol=1e-3, rtol=0)
    # Attention scores beyond fp16's range (|q.k| ~ 1e5 > 65504) stay finite.
    q, k = (torch.randn(2, 2, 16, 64) * 60).half(), (torch.randn(2, 2, 16, 64) * 60).half()
    v = torch.randn(2, 2, 16, 64).half()
    assert (q.float() @ k.float().transpose(-1, -2)).abs().max() > 65504
    out = F.scaled_dot_product_attention(q, k, v)
    assert torch.isfinite(out).all()
    reference = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    torch.testing.assert_close(out.float(), reference, atol=2e-2, rtol=0)


@needs_cuda
def test_cuda_fp16_autocast_runs_layer_norm_and_softmax_in_fp32():
    x = torch.randn(4, 32, device="cuda", dtype=torch.float16)
    norm = nn.LayerNorm(32).cuda()
    with torch.autocast("cuda", dtype=torch.float16):
        assert norm(x).dtype == torch.float32
        assert torch.softmax(x, -1).dtype == torch.float32


# ------------------------------------------------------------ what amptrain does
def test_norm_and_rnn_layers_run_in_fp32_under_cpu_fp16_only():
    model = nn.ModuleDict({"norm": nn.LayerNorm(16), "lstm": nn.LSTM(16, 8, batch_first=True),
                           "gru": nn.GRU(16, 8), "group": nn.GroupNorm(2, 16),
                           "linear": nn.Linear(16, 16)})
    precision = Precision("16-mixed", device="cpu")
    precision.setup(model, None)
    x = torch.randn(2, 5, 16, dtype=torch.float16)
    with precision.autocast():
        assert model["norm"](x).dtype == torch.float32
        assert model["lstm"](x)[0].dtype == torch.float32
        assert model["gru"](x)[0].dtype == torch.float32
        assert model["group"](x.transpose(1, 2)).dtype == torch.float32
        assert model["linear"](x.float()).dtype == torch.float16
    assert model["norm"](x.float()).dtype == torch.float32  # outside autocast: untouched
    precision.teardown()
    assert "forward" not in vars(model["norm"])
    # bf16 on the CPU is left alone: its kernels exist and its range is fp32's.
    other = nn.LayerNorm(16)
    bf16 = Precision("bf16-mixed", device="cpu")
    bf16.setup(other, None)
    with bf16.autocast():
        assert other(torch.randn(2, 16, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert set(CPU_FP16_FP32_TYPES) >= {nn.LayerNorm, nn.GroupNorm, nn.RNNBase}


class OutlierPostNorm(nn.Module):
    """A post-norm (BERT-style) encoder with outlier channels: its norms' bias puts 4e4
    in two residual channels and the blocks add 3e4 more, so ``x + block(x)`` reaches
    7e4 -- fine in fp32, inf in fp16. The input projection makes the first residual
    fp16 under autocast, as a patch or feature embedding does."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(16, 64)
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True,
                                           norm_first=False)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(62, 3)
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, nn.LayerNorm):
                    module.bias[:2] = 4e4
            for block in self.encoder.layers:
                block.linear2.bias[:2] = 3e4
                block.self_attn.out_proj.bias[:2] = 3e4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.proj(x))[..., 2:].mean(1))


def test_transformer_with_large_activations_stays_finite_in_16_mixed():
    x, y = torch.randn(4, 8, 16), torch.tensor([0, 1, 2, 0])
    model = OutlierPostNorm()
    with torch.no_grad():
        reference = model(x)
    assert torch.isfinite(reference).all()
    with torch.autocast("cpu", dtype=torch.float16):  # torch's CPU autocast alone overflows
        assert not torch.isfinite(model(x)).all()
    precision = Precision("16-mixed", device="cpu")
    precision.setup(model, None)
    with precision.autocast():
        out = model(x)
        loss = F.cross_entropy(out, y)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), reference, atol=1e-2, rtol=1e-2)
    precision.backward(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_transformer_with_large_activations_trains_in_16_mixed_without_skips():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, 16, generator=g)
    y = (x[:, :, 0].mean(1) > 0).long()
    model = OutlierPostNorm()
    trainer = Trainer(precision="16-mixed", device="cpu", batch_size=16, max_steps=8,
                      log_every=1, lr=1e-3, no_progress=True)
    result = trainer.fit(model, TensorData(x, y))
    assert result.skipped_steps == 0
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in result.history if "loss" in r)


# ------------------------------------------------------------ LSTM in 16-mixed
def test_lstm_trains_in_16_mixed_on_cpu(tmp_path):
    config = RunConfig.from_options(model="lstm:embed=32,hidden=32",
                                    data="synthetic-seq:samples=512,length=32,vocab=200,signal=0.5",
                                    precision="16-mixed", device="cpu", epochs=4, batch_size=32,
                                    lr=1e-2, no_progress=True, out=str(tmp_path))
    result = run_training(config)
    assert result.precision == "16-mixed" and result.skipped_steps == 0
    assert result.val_metrics["acc"] > 0.6, result      # 4 classes: chance is 0.25


@pytest.mark.parametrize("name", ["16-true", "16-master"])
def test_lstm_keeps_fp32_weights_in_half_weight_modes_on_cpu(name):
    torch.manual_seed(0)
    data = build_data("synthetic-seq:samples=64,length=12,vocab=50", DataOptions())
    model = build_model("lstm:embed=16,hidden=16", model_inputs(data))
    trainer = Trainer(precision=name, device="cpu", batch_size=16, max_steps=2, no_progress=True)
    result = trainer.fit(model, data.train)
    assert model.lstm.weight_ih_l0.dtype == torch.float32
    assert model.head.weight.dtype == torch.float16
    assert result.steps == 2


# ------------------------------------------------------ bert-tiny from scratch
def _topic_csv(path, rows: int = 240, seed: int = 0):
    rng = random.Random(seed)
    topics = {"sport": ["goal", "match", "team", "score", "coach"],
              "food": ["pizza", "bread", "soup", "cheese", "salad"],
              "tech": ["laptop", "code", "server", "chip", "cloud"]}
    filler = ["the", "a", "was", "today", "really", "new", "and", "of", "big", "my"]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        for _ in range(rows):
            label = rng.choice(sorted(topics))
            words = [rng.choice(filler) for _ in range(rng.randint(3, 10))]
            words.insert(rng.randrange(len(words) + 1), rng.choice(topics[label]))
            writer.writerow([" ".join(words), label])
    return path


@pytest.mark.slow
@pytest.mark.parametrize("data", ["synthetic-seq:samples=384,length=16,vocab=100,signal=0.5",
                                  "csv-text"])
@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_bert_tiny_transformer_trains_from_scratch(tmp_path, data, precision):
    """The default ``transformer`` (BERT-tiny: 2 layers, d_model 128, 2 heads, ff 512)."""
    epochs = 3
    if data == "csv-text":
        data, epochs = f"csv-text:{_topic_csv(tmp_path / 'topics.csv')},max_len=16", 5
    config = RunConfig.from_options(model="transformer", data=data, precision=precision,
                                    device="cpu", epochs=epochs, batch_size=32, lr=1e-3,
                                    no_progress=True, out=str(tmp_path / "run"))
    result = run_training(config)
    assert result.skipped_steps == 0
    train = [r["loss"] for r in result.history if "loss" in r]
    assert train[-1] < train[0]
    assert result.val_metrics["acc"] > 0.8, result      # chance: 0.25 (synthetic-seq) / 0.33 (csv)


# -------------------------------------------------- CPU classes through ONEDNN_MAX_CPU_ISA
@pytest.mark.slow
@pytest.mark.parametrize("isa", ["AVX2", "AVX512_CORE"])
def test_every_recurrent_and_conv_model_trains_in_bf16_on_older_cpu_classes(tmp_path, isa):
    """oneDNN has no bf16 LSTM on an AVX2-only CPU: the LSTM becomes an fp32 island there
    (said once) instead of a RuntimeError; AVX512 without BF16 emulates bf16 kernels.

    ``ONEDNN_MAX_CPU_ISA`` only lowers the ISA: a cap above what the real CPU has (AVX512 on
    an AVX2-only CPU) changes nothing, so that class can only be tested on a CPU with it."""
    if not cpu_reaches(isa):
        pytest.skip(f"ONEDNN_MAX_CPU_ISA={isa} cannot raise the ISA: this CPU reaches "
                    f"{cpu_isa()} (flags from /proc/cpuinfo)")
    script = (
        "import logging\n"
        "logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
        "from amptrain.config import RunConfig\n"
        "from amptrain.workflows.runner import run_training\n"
        "for model, data in [('lstm', 'synthetic-seq:samples=64'), ('cnn', 'digits'),\n"
        "                    ('transformer', 'synthetic-seq:samples=64')]:\n"
        "    for precision in ('bf16-mixed', 'bf16-true', '16-mixed'):\n"
        "        r = run_training(RunConfig.from_options(model=model, data=data,\n"
        "            precision=precision, max_steps=2, batch_size=16, no_progress=True))\n"
        "        print(model, precision, r.steps)\n")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": isa, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count(" 2\n") == 9
    said = "oneDNN has no bf16 kernels on this CPU; 1 recurrent layer(s) run as fp32 islands"
    assert (said in result.stderr) == (isa == "AVX2")
