"""Text from a trained language model: ``amptrain generate``.

Sampling is the usual autoregressive loop: crop the sequence to the model's context, take
the last position's logits, divide by the temperature (0 = always the most likely token),
keep the ``top_k`` most likely, sample. A seeded generator makes a continuation repeatable.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .config.train import MAX_SEED
from .data import ByteTokenizer
from .errors import UserError
from .runner import (build_saved_model, checkpoint_file, load_run, saved_task,
                     text_encoder)
from .forward import split_outputs
from .trainer import Trainer


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
    path = str(checkpoint_file(checkpoint_path))
    state, run = load_run(path)
    task = saved_task(state, None)
    if task.name != "lm":
        raise UserError(f"--checkpoint {checkpoint_path} holds a {task.name} model; generate "
                        f"needs a language model (train one with --data text:PATH)")
    fitted = run.get("data_fitted") or {}
    tokenizer = text_encoder(run["model"], fitted.get("tokenizer")) or ByteTokenizer()
    model = build_saved_model(run)
    trainer = Trainer(precision=precision, device=device, no_progress=True)
    trainer.prepare(model, task=task)
    trainer.load_weights(state["model"])
    assert trainer.model is not None  # set by prepare()
    context = int(getattr(model, "context", None) or run["inputs"]["input_shape"][0])
    ids = tokenizer.encode_stream(prompt) if prompt else tokenizer.encode_stream("\n")
    if not ids:
        raise UserError("--prompt encodes to no tokens; give some text")
    new = sample(trainer.model, ids, sampling, context=context, device=trainer.device,
                 autocast=trainer.precision.autocast)
    return str(tokenizer.decode(new))


__all__ = ["MAX_TOKENS", "Sampling", "generate_text", "sample"]
