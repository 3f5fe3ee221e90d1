"""amptrain/data/text.py: ``csv-text:FILE``, tokenised with a vocabulary fitted on the
training split."""
from __future__ import annotations

import pytest
import torch

from amptrain.data import DataOptions, build_data
from amptrain.data.text import tokenize
from tests.data.conftest import assert_data_error

CSV_ROWS = [("A great movie, GREAT acting!", "pos"), ("Terrible plot; terrible film.", "neg"),
            ("great fun", "pos"), ("boring and terrible", "neg")] * 5


def write_csv(path, rows, header="text,label") -> None:
    import csv

    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        if header:
            writer.writerow(header.split(","))
        writer.writerows(rows)


def test_tokenizer_is_lowercase_words():
    assert tokenize("Don't STOP, me-now!") == ["don", "t", "stop", "me", "now"]


def test_csv_text_tokenises_with_a_training_vocabulary(tmp_path):
    path = tmp_path / "reviews.csv"
    rows = CSV_ROWS + [("zebra zebra unseen", "pos", "val"), ("great", "neg", "val")]
    write_csv(path, [r + ("train",) if len(r) == 2 else r for r in rows], header="text,label,split")
    data = build_data(f"csv-text:{path},max_len=6")
    assert data.kind == "sequence" and data.input_shape == (6,)
    assert data.class_names == ["neg", "pos"]
    vocabulary = data.fitted["vocabulary"]
    assert vocabulary[:4] == ["<pad>", "<unk>", "great", "terrible"]  # by count, ties a-z
    assert "zebra" not in vocabulary  # only in validation rows: no leak
    assert data.vocab_size == len(vocabulary) and len(data.train) == 20 and len(data.val) == 2
    assert data.val.tensors[0][0].tolist() == [1, 1, 1, 0, 0, 0]  # unknown words, then padding
    index = {t: i for i, t in enumerate(vocabulary)}
    first = data.train.tensors[0][0].tolist()
    assert first == [index[w] for w in ["a", "great", "movie", "great", "acting"]] + [0]

    # The fitted vocabulary is reused (what `amptrain eval` does with other data).
    other = tmp_path / "other.csv"
    write_csv(other, [("zebra great", "pos"), ("terrible", "neg")] * 2)
    reused = build_data(f"csv-text:{other},max_len=6", DataOptions(fitted=data.fitted))
    assert reused.fitted["vocabulary"] == vocabulary and reused.class_names == ["neg", "pos"]


def test_csv_text_without_split_column_uses_the_seeded_split(tmp_path):
    path = tmp_path / "t.csv"
    # Any column order, header names in any case, extra columns ignored.
    write_csv(path, [(label, text, "web") for text, label in CSV_ROWS], header="Label,Text,source")
    a = build_data(f"csv-text:{path}")
    b = build_data(f"csv-text:{path}", DataOptions(seed=5))
    assert len(a.train) == 16 and len(a.val) == 4 and a.input_shape == (128,)
    assert torch.equal(a.val.tensors[0], b.val.tensors[0])


def test_csv_text_malformed(tmp_path):
    path = tmp_path / "t.csv"
    write_csv(path, CSV_ROWS, header="text,sentiment")
    assert_data_error(f"csv-text:{path}", "needs a header row with columns text and label")
    write_csv(path, CSV_ROWS, header=None)
    assert_data_error(f"csv-text:{path}", "needs a header row")
    write_csv(path, [(t, "pos") for t, _ in CSV_ROWS])
    assert_data_error(f"csv-text:{path}", "at least two classes")
    write_csv(path, CSV_ROWS + [("no label here", "")])
    assert_data_error(f"csv-text:{path}", "line 22 has an empty label")
    write_csv(path, CSV_ROWS + [("short row",)])
    assert_data_error(f"csv-text:{path}", "line 22 has 1 fields")
    path.write_bytes(b"text,label\n\xff\xfe bad bytes,pos\n")
    assert_data_error(f"csv-text:{path}", "not UTF-8")
    path.write_text("")
    assert_data_error(f"csv-text:{path}", "the file is empty")
    write_csv(path, CSV_ROWS)
    assert_data_error(f"csv-text:{path},max_len=0", "max_len must be >= 1")
    assert_data_error(f"csv-text:{tmp_path}", "not a file")


# ------------------------------------------------- preprocessing reused by eval
def sentiment_rows(n: int, seed: int, filler: int, sentiment: int) -> list[tuple[str, str]]:
    import random

    rng = random.Random(seed)
    words = {"pos": ["great", "superb", "lovely", "fun"], "neg": ["awful", "dull", "bad", "weak"]}
    rows = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        text = rng.choices(["the", "film", "was", "a", "plot"], k=filler) \
            + rng.choices(words[label], k=sentiment)
        rng.shuffle(text)
        rows.append((" ".join(text), label))
    return rows


@pytest.mark.slow
def test_eval_feeds_other_data_through_the_training_preprocessing(tmp_path):
    from amptrain.config import RunConfig
    from amptrain.workflows.runner import run_evaluation, run_training

    write_csv(tmp_path / "train.csv", sentiment_rows(400, 0, filler=5, sentiment=2))
    # The same words at other frequencies: a vocabulary built from this file would give
    # the words other ids than the model learnt (sentiment words would come first).
    write_csv(tmp_path / "other.csv", sentiment_rows(200, 1, filler=1, sentiment=3))
    config = RunConfig.from_options(model="lstm:embed=16,hidden=16",
                       data=f"csv-text:{tmp_path / 'train.csv'},max_len=8",
                       precision="32-true", device="cpu", epochs=5, batch_size=32, lr=0.01,
                       out=str(tmp_path / "run"), no_progress=True)
    fit = run_training(config)
    assert fit.val_metrics["acc"] >= 0.95
    result, _ = run_evaluation(checkpoint_path=str(tmp_path / "run" / "checkpoints" / "last.pt"),
                               data=f"csv-text:{tmp_path / 'other.csv'},max_len=8",
                               precision="32-true", out=str(tmp_path / "ev"), device="cpu",
                               progress=False)
    assert result.accuracy >= 0.9
