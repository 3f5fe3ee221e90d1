"""Token shards: the format round trip, and every damaged directory is one clear error."""
from __future__ import annotations

import json

import numpy as np
import pytest

from amptrain.data.shards import (HEADER_BYTES, META, ShardsMeta, ShardWriter, dtype_for,
                                  open_stream, write_shard)
from amptrain.common.errors import UserError

PRINT = "ab" * 32


def _prepared(directory, ids, *, shard_tokens=100, vocab=300, fingerprint=PRINT):
    dtype = dtype_for(vocab)
    writer = ShardWriter(directory, dtype, fingerprint, shard_tokens=shard_tokens)
    writer.write(ids[:37])
    writer.write(ids[37:])  # appends continue across calls and across shard files
    shards = writer.close()
    meta = ShardsMeta(tokenizer="test", fingerprint=fingerprint, vocab_size=vocab,
                      dtype=dtype.name, eot_id=None, shards=shards, tokens=len(ids),
                      text_bytes=2 * len(ids), documents=1, val_tokens=10)
    meta.write(directory)
    return meta


@pytest.mark.parametrize("vocab, dtype", [(300, "uint16"), (65536, "uint16"),
                                          (65537, "uint32")])
def test_round_trip_across_shard_boundaries(tmp_path, vocab, dtype):
    ids = np.random.default_rng(0).integers(0, vocab, 250)
    meta = _prepared(tmp_path, ids, vocab=vocab)
    assert meta.dtype == dtype and [s["tokens"] for s in meta.shards] == [100, 100, 50]
    stream = open_stream(tmp_path, "tokens:x")
    assert len(stream) == 250 and stream.meta.bytes_per_token == 2.0
    for start, count in [(0, 250), (95, 10), (199, 2), (240, 10), (0, 1)]:
        np.testing.assert_array_equal(stream.read(start, count), ids[start:start + count])
    assert stream.read(95, 10).dtype == np.int64
    on_disk = (tmp_path / "shard_00000.bin").stat().st_size
    assert on_disk == HEADER_BYTES + 100 * np.dtype(dtype).itemsize


def _damage(directory, how):
    shard = directory / "shard_00001.bin"
    if how == "truncated":
        shard.write_bytes(shard.read_bytes()[:-3])
    elif how == "other tokenizer":
        write_shard(shard, np.arange(100, dtype=np.uint16), "cd" * 32)
    elif how == "missing shard":
        shard.unlink()
    elif how == "not a shard":
        shard.write_bytes(b"hello" * 100)
    elif how == "empty":
        meta = json.loads((directory / META).read_text())
        meta.update(shards=[], tokens=0)
        (directory / META).write_text(json.dumps(meta))
    elif how == "no meta":
        (directory / META).unlink()
    elif how == "bad meta":
        (directory / META).write_text("{not json")


@pytest.mark.parametrize("how, fragment", [
    ("truncated", "shard_00001.bin is truncated"),
    ("other tokenizer", "written by another tokenizer"),
    ("missing shard", "shard_00001.bin is missing (meta.json lists it)"),
    ("not a shard", "not an amptrain token shard"),
    ("empty", "holds 0 tokens: the corpus was empty"),
    ("no meta", "has no meta.json"),
    ("bad meta", "not a readable token-shard description"),
])
def test_a_damaged_directory_is_one_clear_error(tmp_path, how, fragment):
    _prepared(tmp_path, np.arange(250) % 300)
    _damage(tmp_path, how)
    with pytest.raises(UserError, match="--data tokens:x") as error:
        open_stream(tmp_path, "tokens:x")
    assert fragment in str(error.value)


def _edit_meta(directory, **changes):
    meta = json.loads((directory / META).read_text())
    meta.update(changes)
    (directory / META).write_text(json.dumps(meta))


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: _edit_meta(d, tokens="250"), "'tokens' is '250', not a whole number"),
    (lambda d: _edit_meta(d, vocab_size=2 ** 40), "'vocab_size' is 1099511627776"),
    (lambda d: _edit_meta(d, val_tokens=-5), "'val_tokens' is -5"),
    (lambda d: _edit_meta(d, fingerprint="zz" * 32), "not a hex digest"),
    (lambda d: _edit_meta(d, eot_id=300), "'eot_id' is 300"),
    (lambda d: _edit_meta(d, shards=[{"tokens": 100}]), "not a file and a count"),
    (lambda d: _edit_meta(d, shards=[{"file": "../../outside/shard_00000.bin",
                                      "tokens": 250}]), "not a file inside the directory"),
    (lambda d: _edit_meta(d, shards=[{"file": "shard_00000.bin", "tokens": -1}]),
     "'tokens of shard_00000.bin' is -1"),
], ids=["count-is-text", "vocab-2^40", "negative-val", "non-hex-digest", "eot-beyond-vocab",
        "entry-without-file", "outside-directory", "negative-shard-count"])
def test_every_meta_field_is_checked_before_it_is_used(tmp_path, edit, fragment):
    _prepared(tmp_path, np.arange(250) % 300)
    edit(tmp_path)
    with pytest.raises(UserError, match="is damaged") as error:
        open_stream(tmp_path, "tokens:x")
    assert fragment in str(error.value) and str(tmp_path / META) in str(error.value)


def test_a_fifo_or_a_link_outside_as_a_shard_is_refused_without_blocking(tmp_path):
    import os

    _prepared(tmp_path, np.arange(250) % 300)
    (tmp_path / "shard_00001.bin").unlink()
    os.mkfifo(tmp_path / "shard_00001.bin")
    with pytest.raises(UserError, match="shard .*shard_00001.bin is a FIFO"):
        open_stream(tmp_path, "tokens:x")
    (tmp_path / "shard_00001.bin").unlink()
    outside = tmp_path.parent / f"{tmp_path.name}-outside.bin"
    write_shard(outside, np.arange(100, dtype=np.uint16), PRINT)
    (tmp_path / "shard_00001.bin").symlink_to(outside)
    with pytest.raises(UserError, match="links outside its directory"):
        open_stream(tmp_path, "tokens:x")


def test_ids_beyond_the_vocabulary_are_found_when_the_shards_open(tmp_path):
    _prepared(tmp_path, np.arange(250) % 300)
    _edit_meta(tmp_path, vocab_size=200)
    with pytest.raises(UserError, match="holds token id 2.., but meta.json says the "
                                        "vocabulary has 200 ids"):
        open_stream(tmp_path, "tokens:x")


# ----------------------------------------------------------------- issue 48, class 8
def _shards_of(directory):
    return json.loads((directory / META).read_text())["shards"]


def _twice(directory):
    shards = _shards_of(directory)
    _edit_meta(directory, shards=[shards[0], shards[0], *shards[1:]],
               tokens=250 + shards[0]["tokens"])


def _linked(directory):
    shards = _shards_of(directory)
    (directory / shards[1]["file"]).unlink()
    (directory / shards[1]["file"]).hardlink_to(directory / shards[0]["file"])
    _edit_meta(directory, shards=[shards[0], {**shards[1], "tokens": shards[0]["tokens"]},
                                  *shards[2:]])


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: _edit_meta(d, shards=[{"file": "shard_00000.bin\x00.txt", "tokens": 100}]),
     "not a file inside the directory"),
    (lambda d: (d / META).write_text("[" * 100_000 + "]" * 100_000),
     "is nested too deeply to be a token-shard description"),
    (lambda d: (d / META).write_text('{"shards": ' + "{\"a\": " * 5000 + "1" + "}" * 5001),
     "is nested too deeply"),
    (lambda d: (d / META).write_text("[1, 2]"), "is not a readable token-shard description"),
    (_twice, "is listed twice"),
    (_linked, "are the same file (a link)"),
], ids=["nul-in-shard-name", "nested-list", "nested-object", "top-level-list",
        "shard-listed-twice", "two-names-one-file"])
def test_a_hostile_meta_json_is_one_line(tmp_path, edit, fragment):
    _prepared(tmp_path, np.arange(250) % 300)
    edit(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(UserError) as error:
        open_stream(tmp_path, "tokens:x")
    message = str(error.value)
    assert fragment in message and "\n" not in message and message.startswith("--data tokens:x")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
