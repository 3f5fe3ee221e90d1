"""Token shards on disk: the format ``amptrain prepare`` writes and ``tokens:DIR`` reads.

A prepared directory holds one token stream cut into shard files plus ``meta.json``:

* ``shard_00000.bin`` ... -- a 64-byte header, then the token ids as little-endian
  ``uint16`` (vocabularies up to 65536, as nanoGPT's ``train.bin``) or ``uint32``. The
  header (llm.c's shards carry one too) is ``b"AMPTOKS1"``, the format version, the
  bytes per id, the number of ids and the first 16 bytes of the tokenizer's fingerprint,
  so a truncated file or a shard of another tokenizer is caught before training, not as
  garbage batches.
* ``meta.json`` -- the tokenizer's name and fingerprint, vocabulary size, end-of-text id,
  dtype, each shard's token count, the text bytes and bytes per token (for bits per
  byte), and how many tokens at the end of the stream validate. It is written last:
  a directory without it is an unfinished ``prepare``.

Opening a 10 GB corpus costs a few file headers; a batch reads only its own blocks
(``pread`` of the shard files, see :class:`TokenStream`, which stitches the shards into
one stream), so resident memory does not grow with the corpus or with the run's length.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..common.errors import UserError
from ..common.pathkind import not_regular_reason

MAGIC = b"AMPTOKS1"
VERSION = 1
HEADER_BYTES = 64
_HEADER = struct.Struct("<8sIIQ16s")  # magic, version, itemsize, tokens, fingerprint[:16]
META = "meta.json"
FORMAT = "amptrain-tokens"


def dtype_for(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits (vocabulary up to 65536), else ``uint32``."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def shard_name(index: int) -> str:
    return f"shard_{index:05d}.bin"


@dataclass
class ShardsMeta:
    """What ``meta.json`` says about a prepared directory."""

    tokenizer: str
    fingerprint: str                 # hex sha256 of the tokenizer's identity
    vocab_size: int
    dtype: str                       # "uint16" or "uint32"
    eot_id: int | None               # documents end with it; None: separated by "\n\n"
    shards: list[dict[str, Any]] = field(default_factory=list)   # {"file", "tokens"}
    tokens: int = 0
    text_bytes: int = 0
    documents: int = 0
    #: Tokens at the end of the stream that validate; None: the reader decides
    #: (``text:`` caches split by --val-fraction when loaded).
    val_tokens: int | None = None
    source: str = ""
    format: str = FORMAT
    version: int = VERSION

    @property
    def bytes_per_token(self) -> float:
        return self.text_bytes / max(self.tokens, 1)

    def write(self, directory: Path) -> None:
        data = asdict(self)
        data["bytes_per_token"] = self.bytes_per_token
        tmp = directory / (META + ".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(directory / META)


class ShardWriter:
    """Appends token arrays to ``shard_NNNNN.bin`` files, starting a new one every
    ``shard_tokens`` ids; :meth:`close` fills in the headers and returns the shard list."""

    def __init__(self, directory: Path, dtype: np.dtype, fingerprint: str,
                 shard_tokens: int = 1 << 27) -> None:
        self.directory = directory
        self.dtype = np.dtype(dtype)
        self.fingerprint = bytes.fromhex(fingerprint)[:16]
        self.shard_tokens = shard_tokens
        self.shards: list[dict[str, Any]] = []
        self._file: Any = None
        self._count = 0

    def write(self, ids: np.ndarray) -> None:
        ids = np.ascontiguousarray(ids, dtype=self.dtype)
        while len(ids):
            if self._file is None:
                self._open()
            room = self.shard_tokens - self._count
            part, ids = ids[:room], ids[room:]
            self._file.write(part.astype("<" + self.dtype.str[1:], copy=False).tobytes())
            self._count += len(part)
            if self._count >= self.shard_tokens:
                self._finish()

    def close(self) -> list[dict[str, Any]]:
        if self._file is not None:
            self._finish()
        return self.shards

    def _open(self) -> None:
        name = shard_name(len(self.shards))
        self._file = open(self.directory / name, "wb")
        self._file.write(b"\0" * HEADER_BYTES)
        self._count = 0
        self.shards.append({"file": name, "tokens": 0})

    def _finish(self) -> None:
        self._file.seek(0)
        self._file.write(header_bytes(self.dtype.itemsize, self._count, self.fingerprint))
        self._file.close()
        self._file = None
        self.shards[-1]["tokens"] = self._count


def header_bytes(itemsize: int, tokens: int, fingerprint: bytes) -> bytes:
    head = _HEADER.pack(MAGIC, VERSION, itemsize, tokens, fingerprint[:16].ljust(16, b"\0"))
    return head.ljust(HEADER_BYTES, b"\0")


def write_shard(path: Path, ids: np.ndarray, fingerprint: str) -> None:
    """One shard file holding ``ids`` (its dtype decides the width); for tools and tests."""
    ids = np.asarray(ids)
    with open(path, "wb") as f:
        f.write(header_bytes(ids.dtype.itemsize, len(ids), bytes.fromhex(fingerprint)))
        f.write(ids.astype("<" + ids.dtype.str[1:], copy=False).tobytes())


def read_meta(directory: Path, spec: str) -> ShardsMeta:
    """``meta.json`` of a prepared directory, checked field by field."""
    path = directory / META
    if not path.is_file():
        raise UserError(f"--data {spec}: {directory} has no {META}: not a directory written by "
                        f"`amptrain prepare` (or an unfinished one: prepare it again)")
    try:
        data = json.loads(path.read_text())
        data.pop("bytes_per_token", None)
        meta = ShardsMeta(**data)
    except RecursionError:  # a hostile file nested past Python's recursion limit
        raise UserError(f"--data {spec}: {path} is nested too deeply to be a token-shard "
                        f"description") from None
    except (ValueError, TypeError, OSError, AttributeError) as exc:
        raise UserError(f"--data {spec}: {path} is not a readable token-shard description "
                        f"({type(exc).__name__})") from None
    _check_fields(meta, path, spec)
    if meta.format != FORMAT or meta.version != VERSION:
        raise UserError(f"--data {spec}: {path} is format {meta.format} v{meta.version}; this "
                        f"amptrain reads {FORMAT} v{VERSION}: prepare the corpus again")
    if meta.dtype not in ("uint16", "uint32") or meta.vocab_size < 1:
        raise UserError(f"--data {spec}: {path} names dtype {meta.dtype!r} and vocabulary "
                        f"{meta.vocab_size}; prepare the corpus again")
    if not meta.shards or meta.tokens < 2:
        raise UserError(f"--data {spec}: {directory} holds {meta.tokens} tokens: the corpus was "
                        f"empty when it was prepared")
    return meta


#: The largest vocabulary a meta.json may name: beyond every real tokenizer, small enough
#: that an embedding of it is no accidental terabyte allocation.
MAX_VOCAB = 1 << 24
#: A count no corpus reaches (2^50 ids: petabytes of shards).
_MAX_COUNT = 1 << 50


def _check_fields(meta: ShardsMeta, path: Path, spec: str) -> None:
    """Every field's type and range, and every shard a plain file name inside the
    directory, before anything is opened or allocated from them."""
    def damaged(what: str) -> UserError:
        return UserError(f"--data {spec}: {path} is damaged: {what}; prepare the corpus again")

    def count(name: str, value: Any, low: int = 0, high: int = _MAX_COUNT) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise damaged(f"'{name}' is {value!r}, not a whole number from {low} to {high}")

    for name in ("tokenizer", "fingerprint", "dtype", "source", "format"):
        if not isinstance(getattr(meta, name), str):
            raise damaged(f"'{name}' is {getattr(meta, name)!r}, not text")
    fingerprint = meta.fingerprint
    if len(fingerprint) < 32 or len(fingerprint) % 2 \
            or any(c not in "0123456789abcdefABCDEF" for c in fingerprint):
        raise damaged(f"'fingerprint' is {fingerprint[:80]!r}, not a hex digest")
    count("version", meta.version)
    count("vocab_size", meta.vocab_size, 1, MAX_VOCAB)
    for name in ("tokens", "text_bytes", "documents"):
        count(name, getattr(meta, name))
    if meta.eot_id is not None:
        count("eot_id", meta.eot_id, 0, meta.vocab_size - 1)
    if meta.val_tokens is not None:  # at most every token (an empty corpus is said later)
        count("val_tokens", meta.val_tokens, 0, max(meta.tokens, 1 << 20))
        if meta.tokens >= 2:
            count("val_tokens", meta.val_tokens, 0, meta.tokens)
    if not isinstance(meta.shards, list):
        raise damaged(f"'shards' is a {type(meta.shards).__name__}, not a list")
    seen: set[str] = set()
    for shard in meta.shards:
        if not isinstance(shard, dict) or not isinstance(shard.get("file"), str):
            raise damaged(f"a shard entry is {str(shard)[:80]}, not a file and a count")
        name = shard["file"]
        if not name or "\0" in name or name != Path(name).name or name.startswith(".") \
                or "\\" in name:
            raise damaged(f"a shard is named {name[:80]!r}, not a file inside the directory")
        if name in seen:  # its blocks would be both training and validation blocks
            raise damaged(f"the shard {name[:80]!r} is listed twice")
        seen.add(name)
        count(f"tokens of {name}", shard.get("tokens"))


class TokenStream:
    """The shards of a prepared directory as one read-only stream of token ids.

    Reads are ``pread`` calls of exactly the ids asked for, not a long-lived memory map:
    every page a map has touched counts toward the process's resident memory, so over a
    long run on a large corpus a map's RSS would grow towards the corpus size (nanoGPT
    re-creates its ``np.memmap`` every batch for this reason). The page cache still
    keeps hot data in memory, outside the process's RSS. :attr:`arrays` offers the
    shards memory-mapped for tools that want whole-array access.
    """

    def __init__(self, directory: Path, meta: ShardsMeta, spec: str) -> None:
        self.directory = directory
        self.meta = meta
        self.dtype = np.dtype(meta.dtype).newbyteorder("<")
        self.paths: list[Path] = []
        sizes = []
        files: dict[tuple[int, int], str] = {}
        for shard in meta.shards:
            path = directory / shard["file"]
            try:
                info = path.stat()
            except OSError:
                info = None  # _check_shard says what is wrong with it
            if info is not None:
                other = files.setdefault((info.st_dev, info.st_ino), shard["file"])
                if other != shard["file"]:
                    raise UserError(f"--data {spec}: the shards {other!r} and "
                                    f"{shard['file']!r} are the same file (a link); prepare "
                                    f"the corpus again")
            sizes.append(_check_shard(path, int(shard["tokens"]), self.dtype,
                                      meta.fingerprint, spec))
            self.paths.append(path)
        if sum(sizes) != meta.tokens:
            raise UserError(f"--data {spec}: the shards hold {sum(sizes)} tokens, {META} says "
                            f"{meta.tokens}; prepare the corpus again")
        self.starts = np.cumsum([0] + sizes)
        self._fds: dict[int, int] = {}
        self._pid = os.getpid()
        self._check_ids(spec)

    def _check_ids(self, spec: str) -> None:
        """Every id below the vocabulary (an id beyond it is an IndexError inside the
        embedding, mid-run): one vectorised pass over the memory-mapped shards, a few
        MB at a time (a uint16 vocabulary of 65536 needs none)."""
        if self.meta.vocab_size >= 1 << (8 * self.dtype.itemsize):
            return
        step = 1 << 24
        for path, array in zip(self.paths, self.arrays):
            for start in range(0, len(array), step):
                largest = int(array[start:start + step].max())
                if largest >= self.meta.vocab_size:
                    raise UserError(
                        f"--data {spec}: {path.name} holds token id {largest}, but {META} "
                        f"says the vocabulary has {self.meta.vocab_size} ids (a damaged or "
                        f"edited directory); prepare the corpus again")

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_fds"] = {}  # file descriptors are per process (DataLoader workers)
        return state

    @property
    def arrays(self) -> list[np.ndarray]:
        """Every shard memory-mapped (whole-array access for tools; training reads)."""
        return [np.memmap(p, dtype=self.dtype, mode="r", offset=HEADER_BYTES,
                          shape=(int(n),)) if n else np.zeros(0, self.dtype)
                for p, n in zip(self.paths, np.diff(self.starts))]

    def _fd(self, shard: int) -> int:
        if os.getpid() != self._pid:  # a forked worker opens its own
            self._fds, self._pid = {}, os.getpid()
        fd = self._fds.get(shard)
        if fd is None:
            fd = self._fds[shard] = os.open(self.paths[shard], os.O_RDONLY)
        return fd

    def read(self, start: int, count: int) -> np.ndarray:
        """``count`` ids from position ``start`` (across shard boundaries) as int64."""
        if start < 0 or count < 0 or start + count > len(self):
            raise IndexError(f"tokens {start}..{start + count} of {len(self)}")
        parts, left = [], count
        shard = int(np.searchsorted(self.starts, start, side="right")) - 1
        offset = start - int(self.starts[shard])
        while left > 0:
            take = min(left, int(self.starts[shard + 1] - self.starts[shard]) - offset)
            raw = os.pread(self._fd(shard), take * self.dtype.itemsize,
                           HEADER_BYTES + offset * self.dtype.itemsize)
            parts.append(np.frombuffer(raw, dtype=self.dtype).astype(np.int64))
            left -= take
            shard, offset = shard + 1, 0
        return parts[0] if len(parts) == 1 else np.concatenate(parts) if parts \
            else np.zeros(0, np.int64)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


def _check_shard(path: Path, tokens: int, dtype: np.dtype, fingerprint: str, spec: str) -> int:
    """A shard's token count, after checking its header and size against ``meta.json``."""
    special = not_regular_reason(path)
    if special:  # a FIFO would block the read below
        raise UserError(f"--data {spec}: shard {special}; prepare the corpus again")
    if not path.is_file():
        raise UserError(f"--data {spec}: shard {path} is missing ({META} lists it); prepare "
                        f"the corpus again")
    if os.path.dirname(os.path.realpath(path)) != os.path.realpath(path.parent):
        raise UserError(f"--data {spec}: shard {path} links outside its directory; prepare "
                        f"the corpus again")
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
    except OSError as exc:
        raise UserError(f"--data {spec}: cannot read shard {path} ({exc.strerror})") from None
    if len(head) < HEADER_BYTES or head[:8] != MAGIC:
        raise UserError(f"--data {spec}: {path.name} is not an amptrain token shard (bad "
                        f"header)")
    _, version, itemsize, count, prints = _HEADER.unpack(head[:_HEADER.size])
    if version != VERSION or itemsize != dtype.itemsize:
        raise UserError(f"--data {spec}: {path.name} is v{version} with {itemsize}-byte ids, "
                        f"{META} says v{VERSION} {dtype.name}; prepare the corpus again")
    if prints != bytes.fromhex(fingerprint)[:16]:
        raise UserError(f"--data {spec}: {path.name} was written by another tokenizer than "
                        f"the one {META} names; do not mix shards of different prepare runs")
    if count != tokens:
        raise UserError(f"--data {spec}: {path.name} holds {count} tokens, {META} says "
                        f"{tokens}; prepare the corpus again")
    expected = HEADER_BYTES + count * itemsize
    if size != expected:
        problem = "is truncated" if size < expected else "has trailing bytes"
        raise UserError(f"--data {spec}: {path.name} {problem} ({size} bytes, its header "
                        f"promises {expected}); prepare the corpus again")
    return int(count)


def open_stream(directory: Path, spec: str) -> TokenStream:
    """The checked stream of a prepared directory."""
    return TokenStream(directory, read_meta(directory, spec), spec)


__all__ = ["HEADER_BYTES", "META", "ShardWriter", "ShardsMeta", "TokenStream", "dtype_for",
           "open_stream", "read_meta", "write_shard"]
