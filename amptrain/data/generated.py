"""Data that needs no files: sklearn's bundled digits and two learnable generated sets.

Generated content depends only on the spec (its ``seed=`` option), never on --seed, so
every precision and seed of a ``compare`` sees the same data and ``eval`` rebuilds it.
"""
from __future__ import annotations

import torch

from .core import DataBundle, DataOptions, parse_options, register, require_at_least, split


@register("digits")
def digits(argument: str, options: DataOptions) -> DataBundle:
    """sklearn's bundled 8x8 handwritten digits (1797 images), standardised."""
    from sklearn.datasets import load_digits

    parse_options(argument, {}, f"digits:{argument}")  # takes no options
    raw = load_digits()
    x = torch.tensor(raw.images, dtype=torch.float32).unsqueeze(1) / 16.0
    x = (x - 0.3) / 0.4  # roughly zero mean, unit variance (fixed: independent of the split)
    y = torch.tensor(raw.target, dtype=torch.long)
    train, val = split(x, y, options.val_fraction)
    return DataBundle(train, val, 10, (1, 8, 8), "image")


@register("synthetic-image")
def synthetic_image(argument: str, options: DataOptions) -> DataBundle:
    """Learnable random images: each class is a fixed random pattern plus noise."""
    spec = f"synthetic-image:{argument}"
    o = parse_options(argument, {"samples": 2048, "size": 32, "channels": 3, "classes": 10,
                                 "noise": 1.0, "seed": 0}, spec)
    require_at_least(o, spec, samples=2, size=1, channels=1, classes=2, noise=0.0)
    g = torch.Generator().manual_seed(o["seed"] + 17)
    prototypes = torch.randn(o["classes"], o["channels"], o["size"], o["size"], generator=g)
    y = torch.randint(0, o["classes"], (o["samples"],), generator=g)
    x = prototypes[y] + o["noise"] * torch.randn(o["samples"], o["channels"], o["size"],
                                                 o["size"], generator=g)
    train, val = split(x, y, options.val_fraction)
    return DataBundle(train, val, o["classes"], (o["channels"], o["size"], o["size"]), "image")


@register("synthetic-seq")
def synthetic_seq(argument: str, options: DataOptions) -> DataBundle:
    """Learnable token sequences: the class decides which tokens are over-represented.

    Token 0 is padding and never drawn, as in text data.
    """
    spec = f"synthetic-seq:{argument}"
    o = parse_options(argument, {"samples": 2048, "length": 64, "vocab": 1000, "classes": 4,
                                 "signal": 0.3, "seed": 0}, spec)
    require_at_least(o, spec, samples=2, length=1, classes=2, signal=0.0)
    require_at_least(o, spec, vocab=o["classes"] + 1)
    g = torch.Generator().manual_seed(o["seed"] + 29)
    y = torch.randint(0, o["classes"], (o["samples"],), generator=g)
    tokens = torch.randint(1, o["vocab"], (o["samples"], o["length"]), generator=g)
    # Each class owns a band of the vocabulary; a share of positions draw from that band.
    band = max(1, (o["vocab"] - 1) // o["classes"])
    marked = torch.rand(o["samples"], o["length"], generator=g) < o["signal"]
    class_tokens = 1 + y[:, None] * band + torch.randint(0, band, tokens.shape, generator=g)
    x = torch.where(marked, class_tokens, tokens)
    train, val = split(x, y, options.val_fraction)
    return DataBundle(train, val, o["classes"], (o["length"],), "sequence",
                      vocab_size=o["vocab"])
