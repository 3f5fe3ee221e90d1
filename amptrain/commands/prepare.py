"""``amptrain prepare``: tokenize a text corpus once into token shards (``tokens:DIR``).

Imports nothing heavy at import time (numpy, torch and tokenizers load in :func:`run`):
``amptrain --help`` stays fast.
"""
from __future__ import annotations

import argparse
import errno
import shutil
import time
from pathlib import Path

from ..common import outdir
from ..common.errors import UserError
from ..data.text_options import check_tokenizer

HELP = "tokenize a text corpus once into token shards for --data tokens:DIR"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The corpus, its tokenizer, the split and where the shards go."""
    parser.add_argument("--data", required=True,
                        help="the corpus: text:PATH (a UTF-8 file or a directory of them)")
    parser.add_argument("--out", required=True,
                        help="new directory for the shards and meta.json (must not exist or "
                             "be empty)")
    parser.add_argument("--tokenizer", default=None,
                        help="byte (default: UTF-8 bytes, vocabulary 256) or hf:DIR (a local "
                             "Hugging Face tokenizer)")
    parser.add_argument("--text-glob", default=None,
                        help="which files of a directory are read (e.g. '*.py'; default: all)")
    parser.add_argument("--val-fraction", type=float, default=0.1,
                        help="share of tokens, at the end of the stream, that validates "
                             "(default: 0.1)")
    parser.add_argument("--workers", default="auto",
                        help="tokenizing processes: a number or auto (the usable CPUs, at "
                             "most 8; corpora under 8 MB use one)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    """Tokenize; print what was written and how to train on it."""
    # deferred: torch loads when the command runs, not for --help
    from ..data.tokenizing import PARALLEL_BYTES, default_workers, prepare_corpus
    from ..workflows.runner import text_encoder

    spec = str(args.data)
    kind, _, argument = spec.partition(":")
    if kind != "text" or not argument:
        raise UserError(f"--data {spec}: prepare reads text:PATH (a UTF-8 file or a directory "
                        f"of them)")
    path = Path(argument).expanduser()
    if not path.exists():
        raise UserError(f"--data {spec}: no such file or directory {argument!r}")
    if not 0.0 < args.val_fraction < 1.0:
        raise UserError(f"--val-fraction must be between 0 and 1 (got {args.val_fraction})")
    workers = _workers(args.workers, default_workers())
    check_tokenizer(args.tokenizer)
    tokenizer = text_encoder("", args.tokenizer) if args.tokenizer else None
    if tokenizer is None:
        # deferred: torch loads when the command runs, not for --help
        from ..data.corpus import ByteTokenizer

        tokenizer = ByteTokenizer()
    out = Path(args.out)

    def refuse_unless_empty() -> None:
        if out.exists() and (not out.is_dir() or any(p.name != outdir.LOCK_NAME
                                                     for p in out.iterdir())):
            raise UserError(f"--out {out} already exists and is not an empty directory; "
                            f"amptrain never overwrites what it did not write: choose a new "
                            f"directory")

    refuse_unless_empty()
    created = not out.exists()
    outdir.make(out)
    outdir.lock(out)  # two prepare runs on one --out: the second is refused here
    refuse_unless_empty()  # ... or here, when the first finished before it locked
    started = time.perf_counter()
    try:
        meta = prepare_corpus(path, out, tokenizer, glob=args.text_glob,
                              val_fraction=args.val_fraction, workers=workers,
                              progress=not args.no_progress, spec=spec)
        train_tokens = meta.tokens - (meta.val_tokens or 0)
        if train_tokens < MIN_TRAIN_TOKENS:  # a split with nothing to train on
            raise UserError(f"--val-fraction {args.val_fraction} leaves {max(train_tokens, 0)} "
                            f"of the {meta.tokens} tokens to train on; lower --val-fraction "
                            f"(nothing was written)")
    except OSError as exc:  # a full disk while the shards are written: one line
        _remove_own(out, created)
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise
        raise UserError(outdir.write_error(out, exc)) from None
    except BaseException:
        # Only what this invocation wrote goes: the directory when it made it, else the
        # files inside (it was empty before).
        _remove_own(out, created)
        raise
    seconds = time.perf_counter() - started
    workers = workers if meta.text_bytes >= PARALLEL_BYTES else 1
    mb = meta.text_bytes / 1e6
    print(f"prepared: {meta.tokens} tokens ({meta.dtype}, {meta.bytes_per_token:.2f} bytes per "
          f"token, {meta.tokenizer} tokenizer) from {meta.documents} documents in "
          f"{len(meta.shards)} shard(s); {meta.val_tokens} tokens validate")
    print(f"took {seconds:.1f} s ({mb / max(seconds, 1e-9):.1f} MB/s of text, {workers} "
          f"process(es)); train with: amptrain train --model gpt --data tokens:{out}")
    return 0


def _remove_own(out: Path, created: bool) -> None:
    """Only what this invocation wrote goes: the directory when it made it, else the
    files inside (it was empty before)."""
    outdir.release(out)
    if created:
        shutil.rmtree(out, ignore_errors=True)
    else:
        for child in out.iterdir():
            if child.name != outdir.LOCK_NAME:
                child.unlink(missing_ok=True)


#: The fewest training tokens a split may leave: one input token and its next-token target.
MIN_TRAIN_TOKENS = 2


def _workers(value: str, auto: int) -> int:
    if str(value) == "auto":
        return auto
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise UserError(f"--workers must be a positive integer or auto (got {value!r})")
    return number
