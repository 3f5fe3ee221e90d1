"""Tokenizing a corpus into shards: the same shards whatever the process count, documents
separated, the text: cache keyed by files and tokenizer."""
from __future__ import annotations

import numpy as np
import pytest

from amptrain.data import ByteTokenizer, DataOptions, TextOptions, build_data
from amptrain.data import tokenizing
from amptrain.data.shards import open_stream
from amptrain.data.tokenizing import cache_root, cached_corpus, prepare_corpus
from amptrain.common.errors import UserError


def _corpus(directory):
    directory.mkdir()
    (directory / "a.txt").write_text("first document\n" * 50)
    (directory / "b.txt").write_text("zweites Dokument, grüße\n" * 40)
    (directory / "c.bin").write_bytes(b"\0binary" * 20)
    return directory


class EotTokenizer(ByteTokenizer):
    """Bytes plus an end-of-text id 256, as a subword tokenizer would have."""

    name = "byte+eot"
    vocab_size = 257
    fingerprint = "ee" * 32
    eot_id = 256


def test_stream_is_the_documents_in_order_with_a_blank_line_between(tmp_path):
    corpus = _corpus(tmp_path / "corpus")
    meta = prepare_corpus(corpus, _empty(tmp_path / "out"), ByteTokenizer(), val_fraction=0.1,
                          progress=False)
    expected = ("first document\n" * 50 + "\n\n" + "zweites Dokument, grüße\n" * 40).encode()
    stream = open_stream(tmp_path / "out", "tokens:out")
    assert bytes(stream.read(0, len(stream)).tolist()) == expected
    assert meta.documents == 2 and meta.text_bytes == len(expected)
    assert meta.val_tokens == round(len(expected) * 0.1) and meta.dtype == "uint16"


def test_end_of_text_id_separates_documents_when_the_tokenizer_has_one(tmp_path):
    corpus = _corpus(tmp_path / "corpus")
    prepare_corpus(corpus, _empty(tmp_path / "out"), EotTokenizer(), progress=False)
    ids = open_stream(tmp_path / "out", "tokens:out").read(0, 50 * 15 + 1)
    assert ids[-1] == 256 and (ids[:-1] < 256).all()


def test_processes_and_chunks_do_not_change_the_shards(tmp_path, monkeypatch):
    corpus = _corpus(tmp_path / "corpus")
    prepare_corpus(corpus, _empty(tmp_path / "one"), ByteTokenizer(), progress=False)
    # Small chunks (cut after a newline) and a pool of two processes.
    monkeypatch.setattr(tokenizing, "CHUNK_BYTES", 100)
    monkeypatch.setattr(tokenizing, "PARALLEL_BYTES", 0)
    prepare_corpus(corpus, _empty(tmp_path / "two"), ByteTokenizer(), workers=2,
                   shard_tokens=300, progress=False)
    one, two = (open_stream(tmp_path / d, d) for d in ("one", "two"))
    assert len(two.meta.shards) > 1
    np.testing.assert_array_equal(one.read(0, len(one)), two.read(0, len(two)))


def test_text_data_is_cached_once_and_a_changed_file_is_a_new_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("AMPTRAIN_CACHE", str(tmp_path / "cache"))
    corpus = _corpus(tmp_path / "corpus")
    first = cached_corpus(corpus, ByteTokenizer(), glob=None, spec="text:c")
    assert first is not None and first.parent == cache_root() / "tokens"
    stamp = (first / "meta.json").stat().st_mtime_ns
    assert cached_corpus(corpus, ByteTokenizer(), glob=None, spec="text:c") == first
    assert (first / "meta.json").stat().st_mtime_ns == stamp  # not tokenized again
    assert cached_corpus(corpus, EotTokenizer(), glob=None, spec="text:c") != first
    assert cached_corpus(corpus, ByteTokenizer(), glob="a*", spec="text:c") != first
    (corpus / "a.txt").write_text("changed\n" * 60)
    assert cached_corpus(corpus, ByteTokenizer(), glob=None, spec="text:c") != first
    assert sorted(p.name for p in corpus.iterdir()) == ["a.txt", "b.txt", "c.bin"]  # untouched
    bundle = build_data(f"text:{corpus}", DataOptions(text=TextOptions(seq_len=8)))
    assert type(bundle.train).__name__ == "TokenBlockData"  # memory-mapped, not in RAM


def test_an_edit_keeping_size_and_mtime_is_a_new_entry(tmp_path, monkeypatch):
    import os

    monkeypatch.setenv("AMPTRAIN_CACHE", str(tmp_path / "cache"))
    corpus = _corpus(tmp_path / "corpus")
    first = cached_corpus(corpus, ByteTokenizer(), glob=None, spec="text:c")
    text = corpus / "a.txt"
    before = text.stat()
    text.write_bytes(text.read_bytes().swapcase())  # same size
    os.utime(text, ns=(before.st_atime_ns, before.st_mtime_ns))  # same modification time
    assert cached_corpus(corpus, ByteTokenizer(), glob=None, spec="text:c") != first


@pytest.mark.parametrize("damage, fragment", [
    (lambda entry: (entry / "shard_00000.bin").write_bytes(
        (entry / "shard_00000.bin").read_bytes()[:-5]), "shard_00000.bin is truncated"),
    (lambda entry: (entry / "meta.json").unlink(), "no meta.json: an interrupted write"),
    (lambda entry: (entry / "meta.json").write_text("{half"), "not a readable token-shard"),
], ids=["truncated-shard", "no-meta", "half-written-meta"])
def test_a_damaged_cache_entry_is_rebuilt_with_one_line(tmp_path, monkeypatch, caplog,
                                                       damage, fragment):
    monkeypatch.setenv("AMPTRAIN_CACHE", str(tmp_path / "cache"))
    corpus = _corpus(tmp_path / "corpus")
    entry = cached_corpus(corpus, ByteTokenizer(), glob=None, spec="text:c")
    expected = open_stream(entry, "c").read(0, 50)
    damage(entry)
    caplog.clear()
    assert cached_corpus(corpus, ByteTokenizer(), glob=None, spec="text:c") == entry
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "is damaged" in warnings[0] and "rebuilding it" in warnings[0]
    assert fragment in warnings[0] and "prepare" not in warnings[0]
    np.testing.assert_array_equal(open_stream(entry, "c").read(0, 50), expected)
    bundle = build_data(f"text:{corpus}", DataOptions(text=TextOptions(seq_len=8)))  # and it trains
    assert len(bundle.train) > 0


def test_a_cache_entry_that_is_no_directory_is_rebuilt_without_naming_prepare(
        tmp_path, monkeypatch, caplog):
    # Issue 48: a file under an entry's name in amptrain's own cache.
    monkeypatch.setenv("AMPTRAIN_CACHE", str(tmp_path / "cache"))
    corpus = _corpus(tmp_path / "corpus")
    entry = cached_corpus(corpus, ByteTokenizer(), glob=None, spec="text:c")
    expected = open_stream(entry, "c").read(0, 50)
    import shutil
    shutil.rmtree(entry)
    entry.write_bytes(b"not a directory")
    caplog.clear()
    assert cached_corpus(corpus, ByteTokenizer(), glob=None, spec="text:c") == entry
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "is not a directory; rebuilding it" in warnings[0]
    assert "prepare" not in warnings[0]
    np.testing.assert_array_equal(open_stream(entry, "c").read(0, 50), expected)


def test_an_unwritable_cache_falls_back_to_memory(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("AMPTRAIN_CACHE", str(blocker))
    corpus = _corpus(tmp_path / "corpus")
    bundle = build_data(f"text:{corpus}", DataOptions(text=TextOptions(seq_len=8)))
    assert "cannot write the token cache" in caplog.text
    assert type(bundle.train).__name__ == "TokenBlocks"


def test_a_corpus_without_text_is_one_clear_error(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x.bin").write_bytes(b"\0" * 99)
    with pytest.raises(UserError, match="no UTF-8 text found in 1 file"):
        prepare_corpus(tmp_path / "c", _empty(tmp_path / "out"), ByteTokenizer(),
                       progress=False)


def _empty(path):
    path.mkdir()
    return path
