"""Text from a trained language model, images from a trained GAN: ``amptrain generate``.

Sampling is the usual autoregressive loop: crop the sequence to the model's context, take
the last position's logits, divide by the temperature (0 = always the most likely token),
keep the ``top_k`` most likely, sample. A seeded generator makes a continuation repeatable.

A GAN checkpoint (``--task gan``) draws ``--samples N`` images instead (:func:`generate_images`):
seeded latents, the generator in eval mode, one PNG per image plus ``grid.png`` in ``--out``.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config.train import MAX_SEED
from ..data import ByteTokenizer
from ..common.errors import UserError
from .runner import text_encoder
from .saved_run import SavedRun, open_run
from ..common.forward import split_outputs
from ..tasks.imagegrid import save_grid, save_png, to_uint8
from ..common import outdir
from ..tasks.gan import unwrap


#: The most tokens one ``generate`` call draws: each token is a forward pass, and a
#: mistyped count (10^12) would run silently until killed. Longer texts: continue the output.
MAX_TOKENS = 10_000


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn (``--tokens``, ``--temperature``, ``--top-k``, ``--seed``)."""

    tokens: int = 200
    temperature: float = 0.8
    top_k: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, int) or self.tokens < 1:
            raise UserError(f"--tokens must be a positive integer (got {self.tokens!r})")
        if self.tokens > MAX_TOKENS:
            raise UserError(f"--tokens {self.tokens} is over the limit of {MAX_TOKENS} per call "
                            f"(one forward pass each); continue a longer text in pieces")
        if not 0 <= self.temperature < math.inf:  # also refuses NaN
            raise UserError(f"--temperature must be >= 0 and finite (got "
                            f"{self.temperature!r}); 0 always takes the most likely token")
        if not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise UserError(f"--seed must be an integer from 0 to {MAX_SEED} "
                            f"(got {self.seed!r})")
        if self.top_k is not None and self.top_k < 1:
            raise UserError(f"--top-k must be a positive integer (got {self.top_k!r})")


@torch.no_grad()
def sample(model: nn.Module, prompt: list[int], sampling: Sampling, *, context: int,
           device: torch.device, autocast: Any = None) -> list[int]:
    """``sampling.tokens`` new token ids after ``prompt`` (ids), drawn from ``model``."""
    generator = torch.Generator(device=device).manual_seed(sampling.seed)
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    new: list[int] = []
    for _ in range(sampling.tokens):
        with (autocast or contextlib.nullcontext)():
            logits, _ = split_outputs(model(ids[:, -context:]))
        assert logits is not None
        last = logits[0, -1].float()
        if not bool(torch.isfinite(last).all()):  # read anyway to pick the token
            raise UserError("the model's outputs are not finite for this prompt (NaN or "
                            "infinity, e.g. an fp16 overflow); generate with --precision "
                            "32-true")
        if sampling.temperature == 0:
            token = int(last.argmax())
        else:
            last = last / sampling.temperature
            if sampling.top_k is not None and sampling.top_k < last.numel():
                cutoff = torch.topk(last, sampling.top_k).values[-1]
                last = last.masked_fill(last < cutoff, float("-inf"))
            probabilities = torch.softmax(last, dim=-1)
            token = int(torch.multinomial(probabilities, 1, generator=generator))
        new.append(token)
        ids = torch.cat([ids, torch.tensor([[token]], device=device)], dim=1)
    return new


def generate_text(checkpoint_path: str, prompt: str, sampling: Sampling | None = None, *,
                  device: str = "auto", precision: str = "auto") -> str:
    """The continuation of ``prompt`` by the language model in ``checkpoint_path`` (a file
    or a run directory)."""
    sampling = sampling or Sampling()
    saved = open_run(checkpoint_path)
    _check_generates(saved, "text", checkpoint_path)
    fitted = saved.fitted
    tokenizer = text_encoder(saved.run["model"], fitted.get("tokenizer")) or ByteTokenizer()
    loaded = saved.load_model(precision=precision, device=device)
    context = int(getattr(loaded.model, "context", None)
                  or saved.run["inputs"]["input_shape"][0])
    ids = tokenizer.encode_stream(prompt) if prompt else tokenizer.encode_stream("\n")
    if not ids:
        raise UserError("--prompt encodes to no tokens; give some text")
    new = sample(loaded.model, ids, sampling, context=context, device=loaded.device,
                 autocast=loaded.precision.autocast)
    return str(tokenizer.decode(new))


def _check_generates(saved: SavedRun, wanted: str, checkpoint_path: str) -> None:
    """Refuse a checkpoint whose task cannot generate ``wanted`` ("text" or "images"),
    saying what it can generate instead (the task declares it: ``task.offers.generates``)."""
    task = saved.task()
    if task.offers.generates == wanted:
        return
    if wanted == "images":
        raise UserError(f"--samples draws images from a GAN; --checkpoint {checkpoint_path} "
                        f"holds a {task.name} model")
    if task.offers.generates == "images":
        raise UserError(f"--checkpoint {checkpoint_path} holds a GAN: generate images with "
                        f"--samples N --out DIR")
    raise UserError(f"--checkpoint {checkpoint_path} holds a {task.name} model; generate "
                    f"needs a language model (train one with --data text:PATH)")


#: The most images one ``generate --samples`` call draws (each is a PNG file).
MAX_SAMPLES = 10_000
#: Images in grid.png (the first ones drawn).
GRID_IMAGES = 64


def check_image_request(samples: int | None, out: str | None, seed: int = 0) -> None:
    """Refuse ``--samples`` without ``--out``, or a count or seed out of range."""
    if samples is None:
        if out:
            raise UserError("--out is where --samples writes a GAN's images; give --samples N")
        return
    if not isinstance(samples, int) or not 1 <= samples <= MAX_SAMPLES:
        raise UserError(f"--samples must be an integer from 1 to {MAX_SAMPLES} (got {samples!r})")
    if not out:
        raise UserError("--samples writes image files: give --out DIR")
    if not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise UserError(f"--seed must be an integer from 0 to {MAX_SEED} (got {seed!r})")


def generate_images(checkpoint_path: str, samples: int, out: str, *, seed: int = 0,
                    device: str = "auto", precision: str = "auto") -> list[Path]:
    """Draw ``samples`` images from the GAN in ``checkpoint_path`` (a file or a run
    directory) into ``out``: ``sample_00000.png`` ... at the data's resolution and
    ``grid.png`` (the first :data:`GRID_IMAGES`, enlarged); returns the files written."""

    check_image_request(samples, out, seed)
    # Before the checkpoint is read: never a user's grid.png or sample_00000.png replaced.
    outdir.claim_locked(out, image_outputs(samples))
    saved = open_run(checkpoint_path)
    _check_generates(saved, "images", checkpoint_path)

    loaded = saved.load_model(precision=precision, device=device)
    model: Any = unwrap(loaded.model)  # a generator: .sample(n, generator)
    # The data's value range (restored with the weights); else each image's own.
    low, high = model.output_range() if hasattr(model, "output_range") else (None, None)
    generator = torch.Generator(device=loaded.device).manual_seed(seed)
    directory = outdir.make(Path(out))
    written: list[Path] = []
    first: list[torch.Tensor] = []
    model.eval()
    with torch.no_grad():
        for start in range(0, samples, 256):
            with loaded.precision.autocast():
                images = model.sample(min(256, samples - start), generator).float()
            if not bool(torch.isfinite(images).all()):
                raise UserError("the generator's outputs are not finite (NaN or infinity, e.g. "
                                "an fp16 overflow); generate with --precision 32-true")
            for i, pixels in enumerate(to_uint8(images, low, high)):
                written.append(save_png(pixels, directory / f"sample_{start + i:05d}.png",
                                        replace=False))
            if len(first) * 256 < GRID_IMAGES:
                first.append(images[:GRID_IMAGES].cpu())
    grid = torch.cat(first)[:GRID_IMAGES]
    written.append(save_grid(grid, directory / "grid.png", low=low, high=high, replace=False))
    return written


def image_outputs(samples: int) -> tuple[str, ...]:
    """The files ``generate --samples N --out DIR`` writes into DIR."""
    return (*(f"sample_{i:05d}.png" for i in range(samples)), "grid.png")


__all__ = ["GRID_IMAGES", "MAX_SAMPLES", "MAX_TOKENS", "Sampling", "check_image_request",
           "generate_images", "generate_text", "sample"]
