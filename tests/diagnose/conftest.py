"""Helpers shared by the diagnose tests: a model whose activations are scaled on purpose,
and a ``gpt`` whose attention scores leave fp16's range."""
from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from amptrain.config import TrainConfig
from amptrain.data import DataBundle, TensorData
from amptrain.models import ModelInputs, build_model
from amptrain.models.range_demos import Scale
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification


def scaled_model(factor: float, seed: int = 0) -> nn.Module:
    """Linear + Tanh, then a layer that multiplies activations by ``factor``, then a head."""
    torch.manual_seed(seed)
    return nn.Sequential(OrderedDict(
        body=nn.Sequential(nn.Linear(8, 32), nn.Tanh()),
        amplify=Scale(factor),
        head=nn.Linear(32, 3)))


def peaked_model(seed: int = 0) -> nn.Module:
    """Linear(8, 32), Tanh, ``mid`` = Linear(32, 32), a head: every 32-value block of
    ``mid``'s weight (a row) peaks at 0.99 x 2^-3, just below a power of two. MXFP4's
    FLOOR scale (2^-5) puts that peak at 7.92, beyond e2m1's 6: saturated, one value per
    block; RCEIL's (2^-4) at 3.96 (RCEIL never saturates a block's maximum). The other
    values stay within 0.8 of the peak (in range under both)."""
    torch.manual_seed(seed)
    net = nn.Sequential(OrderedDict(body=nn.Linear(8, 32), act=nn.Tanh(),
                                    mid=nn.Linear(32, 32), head=nn.Linear(32, 3)))
    with torch.no_grad():
        top = 0.99 * 2.0 ** -3
        weight = (torch.rand(32, 32) * 2 - 1) * 0.8 * top
        weight[:, 0] = top
        net.mid.weight.copy_(weight)
    return net


def tiled_model() -> nn.Module:
    """``peaked_model``'s layout, ``mid``'s weight 0.5 in rows 0 and 16 and below 1e-3
    elsewhere: NVFP4's 16x16 weight tiles scale every row by its tile's 0.5 and flush the
    small ones (below a quarter of 0.5 / 6); 1x16 blocks (without 2d) give each row its
    own scale, and only its values near zero flush."""
    net = peaked_model()
    with torch.no_grad():
        weight = (torch.rand(32, 32) * 2 - 1) * 1e-3
        weight[[0, 16]] = 0.5
        net.mid.weight.copy_(weight)
    return net


def bundle(n: int = 256) -> DataBundle:
    return DataBundle(tiny_classification(n=n), None, 3, (8,), "features")


def config(**options) -> TrainConfig:
    base = {"device": "cpu", "batch_size": 32, "no_progress": True, "scheduler": "none"}
    return TrainConfig.from_options(**{**base, **options})


def train_16_mixed(factor: float, steps: int, **options) -> Trainer:
    trainer = Trainer(precision="16-mixed", device="cpu", batch_size=32, max_steps=steps,
                      epochs=steps, log_every=1, no_progress=True, scheduler="none", **options)
    trainer.fit(scaled_model(factor), bundle().train)
    return trainer


GPT_SEQ = 16


def lm_bundle() -> DataBundle:
    """Byte blocks of a repeated sentence, each with its next-token targets."""
    text = torch.tensor(list(b"the quick brown fox jumps over the lazy dog. " * 10))
    starts = torch.arange(0, len(text) - GPT_SEQ - 1, 3)
    x = torch.stack([text[s:s + GPT_SEQ] for s in starts])
    y = torch.stack([text[s + 1:s + GPT_SEQ + 1] for s in starts])
    return DataBundle(TensorData(x, y), None, 256, (GPT_SEQ,), "lm", vocab_size=256, task="lm")


def inflated_gpt(factor: float, seed: int = 0) -> nn.Module:
    """A 2-block gpt with its query and key weights multiplied by ``factor``: q and k stay
    well inside fp16's range, their dot products (the attention scores) do not."""
    torch.manual_seed(seed)
    model = build_model("gpt:layers=2,heads=2,width=32",
                        ModelInputs(256, (GPT_SEQ,), "lm", vocab_size=256))
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[:64] *= factor  # rows 0-31 make q, 32-63 make k
    return model


def overflowing_gan(num_classes: int, input_shape: tuple[int, ...]) -> nn.Module:
    """A ``module:`` factory: a small DCGAN whose discriminator multiplies its features by
    1e6 before the head, so its logits leave fp16's range (trained with ``--task gan``)."""
    from amptrain.models.dcgan import DCGAN

    torch.manual_seed(0)
    gan = DCGAN(input_shape[0], input_shape[1], input_shape[2], 8, 8)
    gan.discriminator.head = nn.Sequential(OrderedDict(amplify=Scale(1e6),
                                                       head=gan.discriminator.head))
    return gan
