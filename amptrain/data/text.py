"""``csv-text:FILE``: labelled text in a CSV file, tokenised into fixed-length id sequences.

The built-in tokenizer is deliberately simple (lowercase, runs of word characters):
enough to train the built-in ``lstm`` and ``transformer`` classifiers. The vocabulary
is built from the training split only, so validation text never leaks into it.

A model that brings its own tokenizer (``hf:PATH``) passes it in as
:attr:`DataOptions.text_encoder` (any :class:`TextEncoder`); the data is then that
tokenizer's ids in a :class:`TokenData`, whose batches are dicts (``input_ids``,
``attention_mask``, ``labels``) padded only to the longest sequence of each
micro-batch. This package never imports the tokenizer's library.
"""
from __future__ import annotations

import csv
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from ..common.errors import UserError
from .core import (
    DataBundle,
    DataOptions,
    TensorData,
    TextEncoder,
    labels_to_classes,
    path_and_options,
    register,
    split_indices,
)

PAD, UNK = "<pad>", "<unk>"          # ids 0 and 1
TOKEN = re.compile(r"\w+")
VAL_SPLITS = {"val", "valid", "validation", "dev", "test"}


class TokenData(TensorData):
    """Token ids padded to a fixed width, their attention masks and labels, in memory.

    Batches are dicts ``{"input_ids", "attention_mask", "labels"}`` (what Hugging Face
    models take as keywords). :meth:`select`, which the Trainer uses to cut micro-batches,
    trims each one to its longest sequence (rounded up to ``pad_multiple``, which keeps
    Tensor-Core shapes), so short texts do not pay for the longest one in the file.
    The lengths it reads stay on the host: trimming needs no device-to-host sync.
    """

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 labels: torch.Tensor, *, lengths: torch.Tensor | None = None,
                 pad_multiple: int = 16) -> None:
        super().__init__(input_ids, attention_mask, labels)
        self.lengths = (lengths if lengths is not None
                        else attention_mask.sum(dim=1)).to("cpu", torch.long)
        self.pad_multiple = max(1, int(pad_multiple))

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:  # type: ignore[override]
        ids, mask, label = (t[index] for t in self.tensors)
        return {"input_ids": ids, "attention_mask": mask, "labels": label}

    def to(self, device: torch.device) -> "TokenData":
        return TokenData(*(t.to(device) for t in self.tensors), lengths=self.lengths,
                         pad_multiple=self.pad_multiple)

    def width_of(self, indices: Sequence[int]) -> int:
        """Columns a batch of these rows needs: the longest, rounded up to ``pad_multiple``."""
        full = self.tensors[0].shape[1]
        if len(indices) == 0:
            return full
        longest = int(self.lengths[list(indices)].max())
        rounded = -(-longest // self.pad_multiple) * self.pad_multiple
        return max(1, min(full, rounded))

    def select(self, indices: Sequence[int], index: torch.Tensor | None = None
               ) -> dict[str, torch.Tensor]:
        """The rows ``indices`` as one dict batch, trimmed to :meth:`width_of`.

        ``index`` is the same rows already on the data's device (the loader sends each
        epoch's indices once); the width is decided from the host-side ``indices``.
        """
        ids, mask, labels = self.tensors
        if index is None:
            index = torch.as_tensor(list(indices), device=ids.device)
        width = self.width_of(indices)
        return {"input_ids": ids[:, :width].index_select(0, index),
                "attention_mask": mask[:, :width].index_select(0, index),
                "labels": labels.index_select(0, index)}


def encode_with(encoder: TextEncoder, texts: Sequence[str], labels: torch.Tensor,
                max_len: int) -> TokenData:
    """Tokenise ``texts`` with a model's tokenizer into a :class:`TokenData`."""
    rows = encoder.encode(list(texts), max_len)
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    ids = torch.full((len(rows), max_len), int(encoder.pad_id), dtype=torch.long)
    mask = torch.zeros((len(rows), max_len), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.as_tensor(row[:max_len], dtype=torch.long)
        mask[i, :len(row)] = 1
    return TokenData(ids, mask, labels, lengths=lengths.clamp(max=max_len))


def tokenize(text: str) -> list[str]:
    """Lowercase words: ``"Don't STOP!"`` -> ``["don", "t", "stop"]``."""
    return TOKEN.findall(text.lower())


def build_vocabulary(texts: Iterable[Sequence[str]], max_size: int, min_freq: int) -> list[str]:
    """``[<pad>, <unk>, most frequent tokens...]`` (ties alphabetical), at most ``max_size``."""
    counts = Counter(token for tokens in texts for token in tokens)
    frequent = sorted((t for t, c in counts.items() if c >= min_freq),
                      key=lambda t: (-counts[t], t))
    return [PAD, UNK] + frequent[:max(0, max_size - 2)]


def encode(tokens: Sequence[str], index: dict[str, int], max_len: int) -> list[int]:
    """Token ids, truncated to ``max_len`` and padded with 0; unknown words are 1."""
    ids = [index.get(t, 1) for t in tokens[:max_len]]
    return ids + [0] * (max_len - len(ids))


def read_rows(path: Path, spec: str) -> tuple[list[str], list[str], list[str] | None]:
    """(texts, labels, split names or None) from a CSV with a header row."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise UserError(f"--data {spec}: the file is empty (expected a header row "
                                f"text,label)")
            columns = {name.strip().lower(): i for i, name in enumerate(header)}
            if "text" not in columns or "label" not in columns:
                raise UserError(f"--data {spec}: needs a header row with columns text and "
                                f"label (found {', '.join(header) or 'nothing'})")
            text_at, label_at, split_at = columns["text"], columns["label"], columns.get("split")
            width = max(columns.values()) + 1
            texts, labels, splits = [], [], []
            for row in reader:
                if not any(cell.strip() for cell in row):
                    continue  # blank line
                if len(row) < width:
                    raise UserError(f"--data {spec}: line {reader.line_num} has {len(row)} "
                                    f"fields, the header {width}")
                label = row[label_at].strip()
                if not label:
                    raise UserError(f"--data {spec}: line {reader.line_num} has an empty label")
                texts.append(row[text_at])
                labels.append(label)
                if split_at is not None:
                    splits.append(row[split_at].strip().lower())
    except UnicodeDecodeError:
        raise UserError(f"--data {spec}: not UTF-8 text") from None
    except csv.Error as exc:
        raise UserError(f"--data {spec}: not a readable CSV file ({exc})") from None
    if len(texts) < 2:
        raise UserError(f"--data {spec}: needs at least 2 rows of text,label (found {len(texts)})")
    return texts, labels, splits if split_at is not None else None


@register("csv-text")
def csv_text(argument: str, options: DataOptions) -> DataBundle:
    """``csv-text:FILE[,max_len=128][,vocab=20000][,min_freq=1]``: a CSV with a header
    row naming the columns ``text`` and ``label`` (others are ignored). An optional
    ``split`` column marks validation rows (val, valid, validation, dev or test);
    otherwise a seeded share of the rows validates.

    With ``options.text_encoder`` (a model's own tokenizer) the texts are that
    tokenizer's ids, at most ``max_len`` (and at most the model's longest sequence)
    long; ``vocab`` and ``min_freq`` then do not apply.
    """
    spec = f"csv-text:{argument}"
    path, o = path_and_options(argument, {"max_len": 128, "vocab": 20000, "min_freq": 1},
                               spec, what="file")
    for key, minimum in (("max_len", 1), ("vocab", 3), ("min_freq", 1)):
        if o[key] < minimum:
            raise UserError(f"--data {spec}: {key} must be >= {minimum} (got {o[key]})")
    texts, raw_labels, splits = read_rows(path, spec)
    fitted = options.fitted or {}
    labels, class_names = labels_to_classes(raw_labels, spec, known=fitted.get("class_names"))
    if splits is not None:
        unknown = sorted(set(splits) - VAL_SPLITS - {"train"})
        if unknown:
            raise UserError(f"--data {spec}: split column value {unknown[0]!r} is neither train "
                            f"nor one of {', '.join(sorted(VAL_SPLITS))}")
        val_idx = torch.tensor([i for i, s in enumerate(splits) if s in VAL_SPLITS],
                               dtype=torch.long)
        train_idx = torch.tensor([i for i, s in enumerate(splits) if s == "train"],
                                 dtype=torch.long)
        if len(val_idx) == 0 or len(train_idx) == 0:
            train_idx, val_idx = split_indices(len(texts), options.val_fraction)
    else:
        train_idx, val_idx = split_indices(len(texts), options.val_fraction)
    if options.text_encoder is not None:
        return _encoded_bundle(options.text_encoder, texts, labels, class_names, train_idx,
                               val_idx, o["max_len"], fitted, spec)
    if fitted.get("tokenizer"):
        raise UserError(f"--data {spec}: the run was trained on the tokenizer of "
                        f"{fitted['tokenizer']}; evaluate it with that model")
    tokens = [tokenize(t) for t in texts]
    vocabulary = fitted.get("vocabulary") or build_vocabulary(
        (tokens[i] for i in train_idx.tolist()), o["vocab"], o["min_freq"])
    index = {token: i for i, token in enumerate(vocabulary)}
    x = torch.tensor([encode(t, index, o["max_len"]) for t in tokens], dtype=torch.long)
    train = TensorData(x[train_idx], labels[train_idx])
    val = TensorData(x[val_idx], labels[val_idx])
    return DataBundle(train, val, len(class_names), (o["max_len"],), "sequence",
                      class_names=class_names, vocab_size=len(vocabulary),
                      fitted={"class_names": class_names, "vocabulary": vocabulary})


def _encoded_bundle(encoder: TextEncoder, texts: list[str], labels: torch.Tensor,
                    class_names: list[str], train_idx: torch.Tensor, val_idx: torch.Tensor,
                    max_len: int, fitted: dict[str, Any], spec: str) -> DataBundle:
    """The csv-text bundle tokenised by a model's own tokenizer."""
    if encoder.max_len:
        max_len = min(max_len, int(encoder.max_len))
    max_len = int(fitted.get("max_len") or max_len)
    data = encode_with(encoder, texts, labels, max_len)
    if int(data.lengths.max()) == 0:
        raise UserError(f"--data {spec}: the tokenizer of {encoder.name} produced no tokens")
    train_rows, val_rows = train_idx.tolist(), val_idx.tolist()

    def subset(rows: list[int]) -> TokenData:
        index = torch.tensor(rows, dtype=torch.long)
        return TokenData(*(t[index] for t in data.tensors), lengths=data.lengths[index],
                         pad_multiple=data.pad_multiple)

    return DataBundle(subset(train_rows), subset(val_rows), len(class_names), (max_len,),
                      "sequence", class_names=class_names, vocab_size=int(encoder.vocab_size),
                      fitted={"class_names": class_names, "tokenizer": encoder.name,
                              "max_len": max_len})
