"""amptrain prepare: a corpus into shards, then trained with --data tokens:DIR; bad input
is one line and exit 2."""
from __future__ import annotations

import json

import numpy as np
import pytest

from amptrain.data.shards import write_shard
from tests.commands.helpers import amptrain

TEXT = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(200))


@pytest.fixture
def corpus(tmp_path):
    (tmp_path / "src").mkdir()
    for n in range(3):
        (tmp_path / "src" / f"m{n}.py").write_text(TEXT)
    (tmp_path / "src" / "notes.md").write_text("# notes\n" * 30)
    return tmp_path / "src"


@pytest.mark.slow
def test_prepare_then_train_on_the_shards(corpus, tmp_path):
    shards = tmp_path / "shards"
    done = amptrain("prepare", "--data", f"text:{corpus}", "--text-glob", "*.py",
                    "--val-fraction", "0.25", "--out", shards, "--no-progress")
    assert done.returncode == 0, done.stderr
    meta = json.loads((shards / "meta.json").read_text())
    assert meta["documents"] == 3 and meta["dtype"] == "uint16" and meta["tokenizer"] == "byte"
    assert meta["tokens"] == 3 * len(TEXT) + 2 * 2 and meta["val_tokens"] == round(
        meta["tokens"] * 0.25)
    assert f"--data tokens:{shards}" in done.stdout
    run = amptrain("train", "--model", "gpt", "--data", f"tokens:{shards}", "--seq-len", "32",
                   "--max-steps", "3", "--batch-size", "4", "--eval-batches", "2",
                   "--precision", "32-true", "--out", tmp_path / "run", "--no-progress")
    assert run.returncode == 0, run.stderr
    assert "done: val_perplexity" in run.stdout
    again = amptrain("prepare", "--data", f"text:{corpus}", "--out", shards)
    assert again.returncode == 2 and "already exists and is not an empty directory" in again.stderr
    assert json.loads((shards / "meta.json").read_text()) == meta  # untouched


def _one_line_error(result) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("amptrain: error: "), result.stderr
    return lines[0]


def test_bad_corpora_and_damaged_shards_are_one_line(corpus, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.bin").write_bytes(b"\0" * 64)
    line = _one_line_error(amptrain("prepare", "--data", f"text:{empty}", "--out",
                                    tmp_path / "o1", "--no-progress"))
    assert "no UTF-8 text found" in line and not (tmp_path / "o1").exists()
    line = _one_line_error(amptrain("prepare", "--data", f"npz:{empty}", "--out", tmp_path / "o2"))
    assert "prepare reads text:PATH" in line
    line = _one_line_error(amptrain("prepare", "--data", f"text:{corpus}", "--tokenizer",
                                    "words", "--out", tmp_path / "o3"))
    assert line.endswith("--tokenizer must be byte or hf:DIR (got 'words')")
    shards = tmp_path / "shards"
    assert amptrain("prepare", "--data", f"text:{corpus}", "--out", shards,
                    "--no-progress").returncode == 0
    shard = shards / "shard_00000.bin"
    intact = shard.read_bytes()
    shard.write_bytes(intact[:-10])
    train = ("train", "--model", "gpt", "--data", f"tokens:{shards}", "--max-steps", "1",
             "--out", tmp_path / "run")
    assert "shard_00000.bin is truncated" in _one_line_error(amptrain(*train))
    write_shard(shard, np.frombuffer(intact[64:], "<u2"), "ff" * 32)  # same ids, other print
    assert "written by another tokenizer" in _one_line_error(amptrain(*train))
    line = _one_line_error(amptrain("train", "--data", f"tokens:{shards}", "--tokenizer", "byte",
                                    "--out", tmp_path / "run"))
    assert "--tokenizer was fixed when the shards were prepared" in line


def test_prepare_draws_no_bar_where_stderr_is_not_a_terminal(corpus, tmp_path):
    # stderr is a pipe here, as a log file is: no tqdm bar (no "tokenizing", no "\r")
    done = amptrain("prepare", "--data", f"text:{corpus}", "--out", tmp_path / "shards")
    assert done.returncode == 0, done.stderr
    assert "tokenizing" not in done.stderr and "\r" not in done.stderr
    assert done.stdout.startswith("prepared: ")
