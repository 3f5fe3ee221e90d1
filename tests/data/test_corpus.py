"""text:PATH corpora: files and directories, tokenizers, blocks, the split, bad input."""
from __future__ import annotations

import pytest
import torch

from amptrain.data import ByteTokenizer, DataOptions, TextOptions, TokenBlocks, build_data
from amptrain.common.errors import UserError

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


def _options(text_glob: str | None = None, **kwargs) -> DataOptions:
    return DataOptions(text=TextOptions(seq_len=16, text_glob=text_glob), **kwargs)


def _blocks(data) -> tuple[torch.Tensor, torch.Tensor]:
    """Every block of a split, in order (text: data is read from memory-mapped shards)."""
    return data.read_batch(range(len(data)))


def test_a_file_becomes_next_token_blocks_with_a_held_out_tail(tmp_path):
    path = tmp_path / "fox.txt"
    path.write_text(TEXT)
    bundle = build_data(f"text:{path}", _options(val_fraction=0.25))
    assert bundle.task == "lm" and bundle.kind == "tokens" and bundle.vocab_size == 256
    assert bundle.input_shape == (16,) and bundle.class_names == []
    x, y = _blocks(bundle.train)
    assert x.dtype == y.dtype == torch.long and x.shape == y.shape and x.shape[1] == 16
    stream = torch.tensor(list(TEXT.encode()))
    n_val = round(len(stream) * 0.25)
    # Training blocks are consecutive slices of the first part; targets are shifted by one.
    assert torch.equal(x.flatten(), stream[:x.numel()])
    assert torch.equal(y.flatten(), stream[1:x.numel() + 1])
    assert x.numel() + 1 <= len(stream) - n_val  # no training token from the held-out tail
    val_x, _ = _blocks(bundle.val)
    assert torch.equal(val_x.flatten(), stream[len(stream) - n_val:][:val_x.numel()])
    assert bundle.fitted == {"tokenizer": "byte", "seq_len": 16, "bytes_per_token": 1.0}


def test_blocks_are_views_of_one_stream_not_copies():
    data = TokenBlocks(torch.arange(101), 10)
    x, y = data.tensors
    assert len(data) == 10 and x.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    assert data.task == "lm"
    moved = data.to(torch.device("cpu"))
    assert moved.task == "lm" and torch.equal(moved.tensors[1], y)


def test_directory_is_read_recursively_in_order_and_skips_what_is_not_text(tmp_path, caplog):
    (tmp_path / "b").mkdir()
    (tmp_path / "a.py").write_text("print('a')\n" * 30)
    (tmp_path / "b" / "c.py").write_text("print('c')\n" * 30)
    (tmp_path / "b" / "notes.txt").write_text("notes\n" * 30)
    (tmp_path / "image.bin").write_bytes(b"\x89PNG\0\0\0" * 50)
    (tmp_path / "latin1.txt").write_bytes("café\n".encode("latin-1") * 30)
    caplog.set_level("INFO", logger="amptrain")
    bundle = build_data(f"text:{tmp_path}", _options())
    assert "skipped 1 binary and 1 not UTF-8 file(s) of 5" in caplog.text
    stream = _blocks(bundle.train)[0].flatten()
    start = bytes(stream[:11].tolist()).decode()
    assert start == "print('a')\n"  # a.py comes first: sorted paths
    only_py = build_data(f"text:{tmp_path}", _options(text_glob="*.py"))
    assert len(only_py.train) + len(only_py.val) < len(bundle.train) + len(bundle.val)


@pytest.mark.parametrize("setup, fragment", [
    (lambda d: d / "missing", "no such file or directory"),
    (lambda d: (d / "empty").mkdir() or d / "empty", "the directory holds no files"),
    (lambda d: ((d / "bin").mkdir(), (d / "bin" / "x").write_bytes(b"\0\1\2" * 99))[0]
     or d / "bin", "no UTF-8 text found in 1 file(s) (1 binary)"),
    (lambda d: (d / "l1.txt").write_bytes(b"caf\xe9" * 99) and d / "l1.txt",
     "no UTF-8 text found in 1 file(s) (1 not UTF-8)"),
    (lambda d: (d / "short.txt").write_text("too short") and d / "short.txt",
     "too few for a training and a validation block of seq_len 16"),
])
def test_bad_corpora_are_one_clear_error(tmp_path, setup, fragment):
    path = setup(tmp_path)
    with pytest.raises(UserError, match="--data text:") as error:
        build_data(f"text:{path}", _options())
    assert fragment in str(error.value)


def test_glob_that_matches_nothing_names_the_option(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT)
    with pytest.raises(UserError, match="matching text_glob '\\*.md'"):
        build_data(f"text:{tmp_path}", _options(text_glob="*.md"))


def test_byte_tokenizer_round_trips_utf8_and_survives_split_characters():
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode_stream("naïve ☕")
    assert tokenizer.decode(ids) == "naïve ☕" and max(ids) < 256
    assert tokenizer.decode(ids[:-1]).endswith("\ufffd")  # a cut character, not an error


def test_a_runs_fitted_seq_len_is_reused_by_eval(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT)
    bundle = build_data(f"text:{tmp_path / 'a.txt'}",
                        DataOptions(fitted={"seq_len": 8, "tokenizer": "byte"}))
    assert bundle.input_shape == (8,)
