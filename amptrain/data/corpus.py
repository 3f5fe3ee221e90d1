"""``text:PATH``: a corpus for language modelling -- a UTF-8 file or a directory of them.

The text becomes one token stream, cut into non-overlapping blocks of ``--seq-len``
tokens: a sample is a block ``x`` and the same tokens shifted by one, ``y`` (next-token
targets). Validation is the last ``--val-fraction`` of the stream, so no training block
overlaps it. The tokens are cached as token shards (see :mod:`.tokenizing`: keyed by the
files and the tokenizer, under ``$AMPTRAIN_CACHE`` or ``~/.cache/amptrain``) and read
from disk as :class:`~amptrain.data.tokens.TokenBlockData`, so a second run starts
without tokenizing again; when the cache cannot be written, the stream is tokenized into
memory as :class:`TokenBlocks`. Either way blocks are batched, shuffled and sharded exactly
as every other dataset (the order depends only on the seed and the global batch).

Tokenizers: the built-in :class:`ByteTokenizer` (UTF-8 bytes, vocabulary 256, no files,
nothing to download), or a model's own (``--tokenizer hf:DIR``, or the tokenizer of an
``hf:DIR`` model), handed in as :attr:`DataOptions.text_encoder`; it must offer
``encode_stream(text)`` and ``decode(ids)`` (see :class:`StreamTokenizer`).

Directories are read recursively in sorted order, files matching ``--text-glob``
(default: every file). Binary files (a NUL byte) are skipped; files that are not UTF-8
are skipped and counted; nothing left is an error naming ``--data``.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from ..common.errors import UserError, flag
from ..common.pathkind import not_regular_reason
from .core import DataBundle, DataOptions, TensorData, register
from .shards import open_stream
from .tokenizing import cached_corpus
from .tokens import DEFAULT_SEQ_LEN, stream_bundle

log = logging.getLogger("amptrain")
#: Bytes read to decide that a file is binary (a NUL byte among them).
_SNIFF_BYTES = 8192


class StreamTokenizer(Protocol):
    """What ``text:`` data needs of a tokenizer (and ``amptrain generate`` to decode)."""

    name: str
    vocab_size: int

    def encode_stream(self, text: str) -> list[int]:
        """The token ids of a whole text, no special tokens added, no truncation."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text from token ids."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocabulary 256, no files, fully offline, lossless."""

    name = "byte"
    vocab_size = 256
    #: Identity of the vocabulary (token shards and the ``text:`` cache record it).
    fingerprint = "6279746573" + "0" * 54   # b"bytes", padded to 64 hex digits
    #: No end-of-text id: documents are separated by a blank line.
    eot_id = None

    def encode_stream(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        """The ids as an array (fast path for large corpora)."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def decode(self, ids: list[int]) -> str:
        # A block boundary may split a multi-byte character: show it, do not fail.
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class TokenBlocks(TensorData):
    """Blocks ``x`` [n, seq_len] and next-token targets ``y`` of one token stream (views,
    no copy); ``task = "lm"`` tells ``--task auto`` what the data is."""

    task = "lm"

    def __init__(self, stream: torch.Tensor, seq_len: int, *,
                 bytes_per_token: float | None = None) -> None:
        blocks = (len(stream) - 1) // seq_len
        x = stream[:blocks * seq_len].view(blocks, seq_len)
        y = stream[1:blocks * seq_len + 1].view(blocks, seq_len)
        super().__init__(x, y)
        self.seq_len = seq_len
        self.bytes_per_token = bytes_per_token

    def to(self, device: torch.device) -> TensorData:
        moved = TensorData(*(t.to(device) for t in self.tensors))
        moved.task = self.task  # type: ignore[attr-defined]
        moved.bytes_per_token = self.bytes_per_token  # type: ignore[attr-defined]
        return moved


def read_texts(path: Path, glob: str | None, spec: str) -> list[str]:
    """The UTF-8 texts under ``path`` (a file, or a directory read recursively)."""
    special = not_regular_reason(path)
    if special:  # reading a FIFO blocks, /dev/zero never ends
        raise UserError(f"--data {spec}: {special} (amptrain reads text files or directories)")
    if path.is_file():
        files = [path]
    else:
        files = sorted(p for p in path.rglob(glob or "*") if p.is_file())
        if not files:
            matching = f" matching {flag('text_glob')} {glob!r}" if glob else ""
            raise UserError(f"--data {spec}: the directory holds no files{matching}")
    texts, binary, not_utf8 = [], 0, 0
    for file in files:
        try:
            raw = file.read_bytes()
        except OSError as exc:
            raise UserError(f"--data {spec}: cannot read {file} ({exc.strerror})") from None
        if b"\0" in raw[:_SNIFF_BYTES]:
            binary += 1
            continue
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            not_utf8 += 1
    skipped = [f"{n} {what}" for n, what in ((binary, "binary"), (not_utf8, "not UTF-8"))
               if n]
    if not [t for t in texts if t]:
        why = f" ({', '.join(skipped)})" if skipped else ""
        raise UserError(f"--data {spec}: no UTF-8 text found in {len(files)} file(s){why}")
    if skipped:
        log.info("text: skipped %s file(s) of %d", " and ".join(skipped), len(files))
    return texts


def tokenize(texts: list[str], tokenizer: Any) -> torch.Tensor:
    """One int64 stream of the texts' tokens, files separated by a blank line."""
    text = "\n\n".join(texts)
    if hasattr(tokenizer, "encode_array"):
        return torch.from_numpy(tokenizer.encode_array(text).astype(np.int64))
    return torch.tensor(tokenizer.encode_stream(text), dtype=torch.long)


@register("text")
def text_corpus(argument: str, options: DataOptions) -> DataBundle:
    """``text:PATH``: a UTF-8 file or a directory of them, as next-token blocks."""
    spec = f"text:{argument}"
    if not argument:
        raise UserError("--data text:PATH needs a text file or a directory, e.g. "
                        "--data text:notes.txt")
    path = Path(argument).expanduser()
    if not path.exists():
        raise UserError(f"--data {spec}: no such file or directory {argument!r}")
    fitted = options.fitted or {}
    seq_len = int(options.text.seq_len or fitted.get("seq_len") or DEFAULT_SEQ_LEN)
    tokenizer = options.text_encoder or ByteTokenizer()
    if not hasattr(tokenizer, "encode_stream"):
        raise UserError(f"--data {spec}: the tokenizer {getattr(tokenizer, 'name', '?')} "
                        f"cannot encode a running text")
    cached = cached_corpus(path, tokenizer, glob=options.text.text_glob, spec=spec)
    if cached is not None:  # shards read from disk: the text is not read again next time
        shards = open_stream(cached, spec)
        n_val = int(round(len(shards) * options.val_fraction))
        # The cache's place is documented (docs/own-data.md); an error that follows
        # (a model that cannot take text, say) stays the only line on stderr.
        log.debug("text: tokens from the cache %s", cached)
        return stream_bundle(shards, n_val, seq_len, spec, int(tokenizer.vocab_size),
                             tokenizer.name)
    texts = read_texts(path, options.text.text_glob, spec)
    stream = tokenize(texts, tokenizer)
    text_bytes = sum(len(t.encode("utf-8")) for t in texts) + 2 * (len(texts) - 1)
    bytes_per_token = text_bytes / max(len(stream), 1)
    n_val = max(seq_len + 1, int(round(len(stream) * options.val_fraction)))
    if len(stream) - n_val < seq_len + 1:
        raise UserError(f"--data {spec}: {len(stream)} tokens are too few for a training "
                        f"and a validation block of {flag('seq_len')} {seq_len} tokens; "
                        f"lower {flag('seq_len')} or give more text")
    train = TokenBlocks(stream[:-n_val], seq_len, bytes_per_token=bytes_per_token)
    val = TokenBlocks(stream[-n_val:], seq_len, bytes_per_token=bytes_per_token)
    vocab = int(tokenizer.vocab_size)
    log.debug("text: %d tokens (%s tokenizer, %.2f bytes/token) -> %d training and %d "
             "validation blocks of %d", len(stream), tokenizer.name, bytes_per_token,
             len(train), len(val), seq_len)
    return DataBundle(train, val, vocab, (seq_len,), "tokens", vocab_size=vocab, task="lm",
                      fitted={"tokenizer": tokenizer.name, "seq_len": seq_len,
                              "bytes_per_token": bytes_per_token})


__all__ = ["ByteTokenizer", "DEFAULT_SEQ_LEN", "StreamTokenizer", "TokenBlocks", "read_texts",
           "text_corpus", "tokenize"]
