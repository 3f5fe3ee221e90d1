"""Tokenizing a text corpus once, in parallel processes, into token shards on disk.

``amptrain prepare`` calls :func:`prepare_corpus`; ``text:PATH`` calls :func:`cached_corpus`,
which prepares into a per-user cache the first time and reads the shards after that,
so a second run (or compare's next seed) starts without reading the text again.

Work is cut into units of at most :data:`CHUNK_BYTES` (a file, or a piece of a large
file ending at a newline, so no UTF-8 character is split); worker processes read and
tokenize units, the parent writes their ids in corpus order, so the shards are the same
whatever the number of processes. Files are documents, in sorted path order; between
two documents goes the tokenizer's end-of-text id when it has one, else the tokens of a
blank line ("\\n\\n", which is what the byte tokenizer has always used).
"""
from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import sys
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..common.errors import UserError, flag
from ..common.pathkind import not_regular_reason
from .shards import ShardsMeta, ShardWriter, dtype_for, open_stream

log = logging.getLogger("amptrain")

#: The largest piece of text one worker tokenizes at a time (bounds memory per worker).
CHUNK_BYTES = 8 << 20
#: Corpora smaller than this are tokenized in this process: starting workers costs more.
PARALLEL_BYTES = 8 << 20
#: Bytes read to decide that a file is binary (a NUL byte among them).
SNIFF_BYTES = 8192
SEPARATOR = "\n\n"


@dataclass(frozen=True)
class Unit:
    """A piece of one file: bytes ``start``..``end``; ``first`` marks a document start."""

    path: str
    start: int
    end: int
    first: bool


def tokenizer_identity(tokenizer: Any) -> tuple[str, str, int | None]:
    """(name, fingerprint, end-of-text id) of a tokenizer. The fingerprint names its
    vocabulary, not its path: the same tokenizer saved elsewhere reuses a cache."""
    name = str(getattr(tokenizer, "name", type(tokenizer).__name__))
    fingerprint = getattr(tokenizer, "fingerprint", None) \
        or hashlib.sha256(f"name:{name}".encode()).hexdigest()
    eot = getattr(tokenizer, "eot_id", None)
    return name, str(fingerprint), (int(eot) if eot is not None else None)


def corpus_files(path: Path, glob: str | None, spec: str) -> list[Path]:
    """The files of a ``text:`` corpus: ``path`` itself, or a directory's files (recursive,
    sorted, matching ``glob``)."""
    special = not_regular_reason(path)
    if special:  # reading a FIFO blocks, /dev/zero never ends
        raise UserError(f"--data {spec}: {special} (amptrain reads text files or directories)")
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise UserError(f"--data {spec}: {path} is neither a file nor a directory")
    files = sorted(p for p in path.rglob(glob or "*") if p.is_file())
    if not files:
        matching = f" matching {flag('text_glob')} {glob!r}" if glob else ""
        raise UserError(f"--data {spec}: the directory holds no files{matching}")
    return files


def plan_units(files: list[Path], spec: str) -> tuple[list[Unit], int, int]:
    """Units of the text files (binary ones, with a NUL byte early on, are skipped);
    returns (units, total bytes, files skipped as binary)."""
    units: list[Unit] = []
    total = binary = 0
    for file in files:
        try:
            size = file.stat().st_size
            with open(file, "rb") as f:
                head = f.read(SNIFF_BYTES)
                if b"\0" in head:
                    binary += 1
                    continue
                start = 0
                while start < size:
                    end = min(size, start + CHUNK_BYTES)
                    if end < size:  # end the piece after a newline: no character is split
                        f.seek(end)
                        tail = f.read(1 << 16)
                        cut = tail.find(b"\n")
                        end = min(size, end + (cut + 1 if cut >= 0 else len(tail)))
                    units.append(Unit(str(file), start, end, start == 0))
                    start = end
        except OSError as exc:
            raise UserError(f"--data {spec}: cannot read {file} ({exc.strerror})") from None
        total += size
    return units, total, binary


# Set in the parent before the pool forks: workers inherit the tokenizer (no pickling).
_TOKENIZER: Any = None
_DTYPE: Any = None


def _tokenize_unit(unit: Unit) -> tuple[Unit, np.ndarray | None, int]:
    """(unit, its ids or None when it is not UTF-8, its bytes)."""
    with open(unit.path, "rb") as f:
        f.seek(unit.start)
        raw = f.read(unit.end - unit.start)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return unit, None, len(raw)
    return unit, encode(_TOKENIZER, text, _DTYPE), len(raw)


def encode(tokenizer: Any, text: str, dtype: Any) -> np.ndarray:
    """A text's ids as an array of ``dtype`` (the tokenizer's fast path when it has one)."""
    if hasattr(tokenizer, "encode_array"):
        return np.asarray(tokenizer.encode_array(text)).astype(dtype, copy=False)
    return np.asarray(tokenizer.encode_stream(text), dtype=np.int64).astype(dtype)


def _results(units: list[Unit], workers: int) -> Iterator[tuple[Unit, np.ndarray | None, int]]:
    if workers <= 1:
        yield from map(_tokenize_unit, units)
        return
    # fork: the tokenizer object is inherited; Hugging Face's own threads would be
    # duplicated into the children, so they are told not to start any.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        yield from pool.imap(_tokenize_unit, units, chunksize=1)


def prepare_corpus(path: Path, out: Path, tokenizer: Any, *, glob: str | None = None,
                   val_fraction: float | None = None, workers: int = 1,
                   progress: bool | None = True,
                   spec: str | None = None, shard_tokens: int = 1 << 27) -> ShardsMeta:
    """Tokenize the corpus at ``path`` into shards in the (new, empty) directory ``out``.

    ``val_fraction`` None leaves the split to the reader; ``progress`` None shows a bar
    only for corpora large enough to take a while. Returns what ``meta.json`` says.
    """
    global _TOKENIZER, _DTYPE
    spec = spec or f"text:{path}"
    files = corpus_files(path, glob, spec)
    units, total_bytes, binary = plan_units(files, spec)
    name, fingerprint, eot = tokenizer_identity(tokenizer)
    vocab = int(tokenizer.vocab_size)
    dtype = dtype_for(vocab)
    separator = (np.array([eot], dtype=dtype) if eot is not None
                 else encode(tokenizer, SEPARATOR, dtype))
    workers = max(1, workers if total_bytes >= PARALLEL_BYTES else 1)
    writer = ShardWriter(out, dtype, fingerprint, shard_tokens=shard_tokens)
    _TOKENIZER, _DTYPE = tokenizer, dtype
    tokens = text_bytes = documents = 0
    not_utf8: set[str] = set()
    bar = _progress(total_bytes, progress if progress is not None
                    else total_bytes >= PARALLEL_BYTES)
    try:
        for unit, ids, size in _results(units, workers):
            bar.update(size)
            if ids is None:
                not_utf8.add(unit.path)
                continue
            if unit.first:
                if documents:
                    writer.write(separator)
                    tokens += len(separator)
                    text_bytes += len(SEPARATOR) if eot is None else 0
                documents += 1
            writer.write(ids)
            tokens += len(ids)
            text_bytes += size
    finally:
        bar.close()
        shards = writer.close()
        _TOKENIZER = _DTYPE = None
    skipped = [f"{n} {what}" for n, what in ((binary, "binary"), (len(not_utf8), "not UTF-8"))
               if n]
    if tokens < 2:
        why = f" ({', '.join(skipped)})" if skipped else ""
        raise UserError(f"--data {spec}: no UTF-8 text found in {len(files)} file(s){why}")
    if skipped:
        log.info("text: skipped %s file(s) of %d", " and ".join(skipped), len(files))
    val_tokens = None if val_fraction is None else max(1, int(round(tokens * val_fraction)))
    meta = ShardsMeta(tokenizer=name, fingerprint=fingerprint, vocab_size=vocab,
                      dtype=dtype.name, eot_id=eot, shards=shards, tokens=tokens,
                      text_bytes=text_bytes, documents=documents, val_tokens=val_tokens,
                      source=str(path))
    meta.write(out)
    return meta


def _progress(total: int, enabled: bool) -> Any:
    """The tokenizing bar, on stderr only when it is a terminal (a log file gets no bar,
    as a training run's)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc="tokenizing", leave=False,
                disable=not (enabled and sys.stderr.isatty()), mininterval=0.5)


# ----------------------------------------------------------------------------- cache
def cache_root() -> Path:
    """Where ``text:`` keeps its tokens: ``$AMPTRAIN_CACHE``, else
    ``$XDG_CACHE_HOME/amptrain``, else ``~/.cache/amptrain`` (never the data's directory)."""
    if os.environ.get("AMPTRAIN_CACHE"):
        return Path(os.environ["AMPTRAIN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "amptrain"


def cache_key(files: list[Path], tokenizer: Any, glob: str | None) -> str:
    """The corpus and tokenizer identity: a hash of every file's bytes (streamed; an edit
    that keeps a file's size and modification time still changes it) with its name, the
    tokenizer's fingerprint, the glob and the format version."""
    _, fingerprint, _ = tokenizer_identity(tokenizer)
    listing = []
    for file in files:
        digest = hashlib.blake2b(digest_size=32)
        with open(file, "rb") as handle:
            while block := handle.read(1 << 22):
                digest.update(block)
        listing.append([file.name, digest.hexdigest()])
    blob = json.dumps({"tokenizer": fingerprint, "files": listing, "glob": glob,
                       "format": ShardsMeta.__dataclass_fields__["version"].default})
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _intact(entry: Path, spec: str) -> bool:
    """Whether a cache entry opens as a complete, checked token directory; a damaged one
    (a truncated shard, no meta.json) is removed with one line saying it is rebuilt."""
    if not entry.exists() and not entry.is_symlink():
        return False
    if entry.is_symlink() or not entry.is_dir():
        # Something else in amptrain's cache under the entry's name (a file): replaced.
        log.warning("text: the token cache entry %s is not a directory; rebuilding it", entry)
        entry.unlink(missing_ok=True)
        return False
    if not (entry / "meta.json").is_file():
        reason = "it has no meta.json: an interrupted write"
    else:
        try:
            open_stream(entry, spec).close()
            return True
        except UserError as exc:
            reason = str(exc).removeprefix(f"--data {spec}: ").split("; prepare")[0]
    log.warning("text: the token cache entry %s is damaged (%s); rebuilding it", entry, reason)
    shutil.rmtree(entry, ignore_errors=True)
    return False


def cached_corpus(path: Path, tokenizer: Any, *, glob: str | None, spec: str,
                  workers: int | None = None) -> Path | None:
    """The prepared directory of a ``text:`` corpus in the cache, preparing it on a miss;
    None when the cache cannot be written (the caller then tokenizes in memory). The cache
    is amptrain's: a damaged entry is rebuilt, never reported as the user's to prepare;
    an entry is written in a temporary directory and renamed into place whole."""
    files = corpus_files(path, glob, spec)
    key = cache_key(files, tokenizer, glob)
    root = cache_root() / "tokens"
    final = root / key
    if _intact(final, spec):
        log.debug("text: tokens from the cache %s", final)
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
        work = root / f".tmp-{key}-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
    except OSError as exc:
        log.warning("text: cannot write the token cache in %s (%s): tokenizing in memory "
                    "(set AMPTRAIN_CACHE to a writable directory)", root, exc.strerror)
        return None
    try:
        try:
            prepare_corpus(path, work, tokenizer, glob=glob, spec=spec,
                           workers=workers or default_workers(), progress=None)
        except (OSError, UserError) as exc:
            # The cache's own disk full (or failing): amptrain's cache, not the user's
            # output, so the run goes on tokenizing in memory, as with an unwritable cache.
            if isinstance(exc, UserError) and not str(exc).startswith(f"cannot write {work}"):
                raise
            shutil.rmtree(work, ignore_errors=True)
            reason = exc.strerror if isinstance(exc, OSError) else str(exc).split(": ", 1)[-1]
            log.warning("text: cannot write the token cache in %s (%s): tokenizing in memory "
                        "(set AMPTRAIN_CACHE to a directory with room)", root, reason)
            return None
        try:
            work.rename(final)
        except OSError:  # another run cached the same corpus meanwhile: use theirs
            shutil.rmtree(work, ignore_errors=True)
            if not _intact(final, spec):
                log.warning("text: cannot cache the tokens in %s: tokenizing in memory", final)
                return None
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    log.debug("text: tokens cached in %s", final)
    return final


def default_workers() -> int:
    """Processes for tokenizing: the CPUs this process may use, at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


__all__ = ["CHUNK_BYTES", "cache_root", "cached_corpus", "corpus_files", "default_workers",
           "prepare_corpus", "tokenizer_identity"]
