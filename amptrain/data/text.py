"""``csv-text:FILE``: labelled text in a CSV file, tokenised into fixed-length id sequences.

The tokenizer is deliberately simple (lowercase, runs of word characters): enough to
train the built-in ``lstm`` and ``transformer`` classifiers. The vocabulary is built
from the training split only, so validation text never leaks into it.
"""
from __future__ import annotations

import csv
import re
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

import torch

from ..errors import UserError
from .core import DataBundle, DataOptions, TensorData, labels_to_classes, path_and_options, \
    register, split_indices

PAD, UNK = "<pad>", "<unk>"          # ids 0 and 1
TOKEN = re.compile(r"\w+")
VAL_SPLITS = {"val", "valid", "validation", "dev", "test"}


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
        val_idx = torch.tensor([i for i, s in enumerate(splits) if s in VAL_SPLITS], dtype=torch.long)
        train_idx = torch.tensor([i for i, s in enumerate(splits) if s == "train"], dtype=torch.long)
        if len(val_idx) == 0 or len(train_idx) == 0:
            train_idx, val_idx = split_indices(len(texts), options.val_fraction)
    else:
        train_idx, val_idx = split_indices(len(texts), options.val_fraction)
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
