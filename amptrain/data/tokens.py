"""``tokens:DIR``: a corpus tokenized by ``amptrain prepare``, read from disk a batch at a time.

A sample is a block of ``--seq-len`` ids and the same ids shifted by one (next-token
targets), exactly as ``text:`` data. Blocks sit on a fixed grid (block ``i`` starts at
token ``i * seq_len``), not at random offsets as nanoGPT's ``get_batch`` draws them:
a grid makes the corpus a map-style dataset of known length, so the Trainer's
:class:`~amptrain.trainer.windows.SampleOrder` applies unchanged -- an epoch sees every token
once, the order depends only on the seed and the global batch, a resumed run continues
with the very next window, and DDP ranks take disjoint shares of each global batch.
Random offsets would need an RNG position in every checkpoint for the same guarantees.

Validation is the last ``val_tokens`` of the stream (``meta.json``; ``prepare
--val-fraction``), so no training block overlaps it.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ..common.errors import UserError, flag
from .core import DataBundle, DataOptions, register
from .shards import TokenStream, open_stream
from .text_options import DEFAULT_SEQ_LEN
from .tokenizing import tokenizer_identity

log = logging.getLogger("amptrain")


class TokenBlockData(Dataset):
    """Next-token blocks of a :class:`~amptrain.data.shards.TokenStream` on disk.

    The Trainer reads micro-batches with :meth:`read_batch` in the training process (a
    batch is a few strided reads of the map: no workers, no per-sample collation).
    """

    task = "lm"

    def __init__(self, stream: TokenStream, start: int, end: int, seq_len: int, *,
                 bytes_per_token: float | None = None) -> None:
        self.stream = stream
        self.start = start
        self.seq_len = seq_len
        self.blocks = max(0, (end - start - 1) // seq_len)
        self.bytes_per_token = bytes_per_token

    def __len__(self) -> int:
        return self.blocks

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= index < self.blocks:
            raise IndexError(index)
        ids = torch.from_numpy(self.stream.read(self.start + index * self.seq_len,
                                                self.seq_len + 1))
        return ids[:-1], ids[1:]

    def read_batch(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Blocks ``indices`` as ``(x, y)``, int64 ``[len(indices), seq_len]`` each."""
        rows = np.empty((len(indices), self.seq_len + 1), dtype=np.int64)
        for row, index in enumerate(indices):
            rows[row] = self.stream.read(self.start + int(index) * self.seq_len,
                                         self.seq_len + 1)
        ids = torch.from_numpy(rows)
        # Contiguous copies, not strided views of ``rows``: a model may ``.view`` its
        # inputs (nanoGPT's does; issue 49), and the copy is B*T integers per step.
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def stream_bundle(stream: TokenStream, val_tokens: int, seq_len: int, spec: str,
                  vocab_size: int, tokenizer_name: str) -> DataBundle:
    """Training and validation blocks of ``stream``: validation is its last
    ``val_tokens`` ids; both splits must hold a block of ``seq_len``."""
    total = len(stream)
    n_val = max(seq_len + 1, val_tokens)
    if total - n_val < seq_len + 1:
        raise UserError(f"--data {spec}: {total} tokens are too few for a training and a "
                        f"validation block of {flag('seq_len')} {seq_len} tokens; lower "
                        f"{flag('seq_len')} or give more text")
    bpt = stream.meta.bytes_per_token
    train = TokenBlockData(stream, 0, total - n_val, seq_len, bytes_per_token=bpt)
    val = TokenBlockData(stream, total - n_val, total, seq_len, bytes_per_token=bpt)
    log.debug("%s: %d tokens (%s tokenizer, %.2f bytes/token) -> %d training and %d "
              "validation blocks of %d", spec, total, tokenizer_name, bpt, len(train), len(val),
              seq_len)
    return DataBundle(train, val, vocab_size, (seq_len,), "tokens", vocab_size=vocab_size,
                      task="lm", fitted={"tokenizer": tokenizer_name, "seq_len": seq_len,
                                         "bytes_per_token": bpt})


@register("tokens")
def tokens(argument: str, options: DataOptions) -> DataBundle:
    """``tokens:DIR``: the shards ``amptrain prepare --out DIR`` wrote."""
    spec = f"tokens:{argument}"
    if not argument:
        raise UserError("--data tokens:DIR needs the directory `amptrain prepare --out DIR` "
                        "wrote")
    directory = Path(argument).expanduser()
    if not directory.is_dir():
        problem = "not a directory" if directory.exists() else "no such directory"
        raise UserError(f"--data {spec}: {problem} {argument!r}")
    stream = open_stream(directory, spec)
    meta = stream.meta
    _check_tokenizer(meta.tokenizer, meta.fingerprint, options, spec)
    fitted = options.fitted or {}
    seq_len = int(options.text.seq_len or fitted.get("seq_len") or DEFAULT_SEQ_LEN)
    val_tokens = meta.val_tokens if meta.val_tokens is not None \
        else int(round(meta.tokens * options.val_fraction))
    return stream_bundle(stream, val_tokens, seq_len, spec, meta.vocab_size, meta.tokenizer)


def _check_tokenizer(name: str, fingerprint: str, options: DataOptions, spec: str) -> None:
    """A model that brings a tokenizer (or a run trained on one) must use the shards'."""
    encoder: Any = options.text_encoder
    if encoder is not None and hasattr(encoder, "encode_stream"):
        other, other_print, _ = tokenizer_identity(encoder)
        if other_print != fingerprint:
            raise UserError(f"--data {spec}: the shards were prepared with the tokenizer "
                            f"{name}, but this run uses {other}; prepare the corpus with "
                            f"{flag('tokenizer')} {other}")
    trained = (options.fitted or {}).get("tokenizer")
    if trained and encoder is None and trained != name:
        raise UserError(f"--data {spec}: the model was trained on the tokenizer {trained}, "
                        f"the shards hold ids of {name}")


__all__ = ["DEFAULT_SEQ_LEN", "TokenBlockData", "stream_bundle", "tokens"]
