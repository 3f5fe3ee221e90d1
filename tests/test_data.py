"""Every data loader on small files written here in the real format, and every malformed
file turned into a one-line UserError naming --data (exit 2 from the command line)."""
from __future__ import annotations

import gzip
import os
import pickle
import struct

import numpy as np
import pytest
import torch

from amptrain.cli import main
from amptrain.data import DATASETS, DataBundle, DataOptions, TensorData, build_data
from amptrain.data.text import tokenize
from amptrain.errors import UserError


def assert_data_error(spec: str, match: str) -> None:
    with pytest.raises(UserError, match=match) as caught:
        build_data(spec)
    message = str(caught.value)
    assert "--data" in message and "\n" not in message


def test_cli_exits_2_on_malformed_data(tmp_path, capsys):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip file")
    code = main(["train", "--data", f"npz:{bad}", "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--data npz:" in err[0]
    assert not (tmp_path / "run").exists()


def test_registry_names():
    assert {"digits", "synthetic-image", "synthetic-seq", "idx", "cifar10", "imagefolder",
            "npz", "csv-text"} <= set(DATASETS)
    assert_data_error("mnist", "unknown --data")


# ----------------------------------------------------------------- built-in data
def test_generated_data_depends_on_the_spec_not_the_run_seed():
    a = build_data("synthetic-image:samples=64,size=8,classes=3", DataOptions(seed=0))
    b = build_data("synthetic-image:samples=64,size=8,classes=3", DataOptions(seed=7))
    c = build_data("synthetic-image:samples=64,size=8,classes=3,seed=1")
    assert torch.equal(a.train.tensors[0], b.train.tensors[0])
    assert not torch.equal(a.train.tensors[0], c.train.tensors[0])
    assert a.input_shape == (3, 8, 8) and a.num_classes == 3 and len(a.val) == 13


def test_synthetic_seq_reserves_padding_and_checks_options():
    data = build_data("synthetic-seq:samples=50,length=12,vocab=20,classes=3")
    tokens = data.train.tensors[0]
    assert data.kind == "sequence" and data.vocab_size == 20 and data.input_shape == (12,)
    assert tokens.dtype == torch.long and tokens.min() >= 1 and tokens.max() < 20
    assert_data_error("synthetic-seq:vocab=3,classes=4", "vocab must be >= 5")
    assert_data_error("synthetic-image:samples=many", "samples must be an integer")
    assert_data_error("synthetic-image:colour=1", "unknown option 'colour=1'")
    assert_data_error("digits:big", "unknown option 'big'")


def test_digits_split_is_fixed():
    a, b = build_data("digits"), build_data("digits", DataOptions(seed=3))
    assert len(a.train) == 1438 and len(a.val) == 359
    assert torch.equal(a.val.tensors[1], b.val.tensors[1])


# ------------------------------------------------------------------------- IDX
def write_idx(path, array: np.ndarray, compress: bool = False, magic: int | None = None) -> None:
    magic = magic if magic is not None else 0x0800 | array.ndim
    raw = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) \
        + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)


def mnist_like(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 6, 5), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)


def write_mnist(root, compress: bool, test: bool = True) -> None:
    root.mkdir(exist_ok=True)
    suffix = ".gz" if compress else ""
    splits = [("train", 40, 0)] + ([("t10k", 12, 1)] if test else [])
    for name, n, seed in splits:
        images, labels = mnist_like(n, seed)
        write_idx(root / f"{name}-images-idx3-ubyte{suffix}", images, compress)
        write_idx(root / f"{name}-labels-idx1-ubyte{suffix}", labels, compress)


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_idx_reads_mnist_files(tmp_path, compress):
    write_mnist(tmp_path / "mnist", compress)
    data = build_data(f"idx:{tmp_path / 'mnist'}")
    images, labels = mnist_like(40, 0)
    test_images, test_labels = mnist_like(12, 1)
    assert data.kind == "image" and data.input_shape == (1, 6, 5)
    assert data.num_classes == 10 and len(data.train) == 40 and len(data.val) == 12
    assert torch.equal(data.train.tensors[1], torch.as_tensor(labels, dtype=torch.long))
    assert torch.equal(data.val.tensors[1], torch.as_tensor(test_labels, dtype=torch.long))
    x = data.train.tensors[0]
    assert abs(x.mean().item()) < 1e-4 and abs(x.std().item() - 1) < 1e-2  # standardised
    # Same pixel order as the file: the standardisation is monotonic per image.
    first = x[0, 0].flatten()
    assert torch.equal(first.argsort(stable=True),
                       torch.as_tensor(images[0].flatten().astype(np.float32)).argsort(stable=True))
    assert data.fitted["mean"] and data.fitted["std"]


def test_idx_without_test_files_splits_the_training_files(tmp_path):
    write_mnist(tmp_path / "m", compress=False, test=False)
    data = build_data(f"idx:{tmp_path / 'm'}", DataOptions(val_fraction=0.25))
    assert len(data.train) == 30 and len(data.val) == 10


def test_idx_malformed_files(tmp_path):
    root = tmp_path / "m"
    write_mnist(root, compress=False)
    images = root / "train-images-idx3-ubyte"
    labels = root / "train-labels-idx1-ubyte"
    good_images, good_labels = images.read_bytes(), labels.read_bytes()

    images.write_bytes(good_labels)  # a label file where images belong
    assert_data_error(f"idx:{root}", r"magic number 0x00000801, expected 0x00000803")
    images.write_bytes(b"\x12\x34\x56\x78" + good_images[4:])
    assert_data_error(f"idx:{root}", "magic number 0x12345678")
    images.write_bytes(good_images[:-7])
    assert_data_error(f"idx:{root}", "train-images-idx3-ubyte is truncated")
    images.write_bytes(good_images[:10])
    assert_data_error(f"idx:{root}", "truncated")
    images.write_bytes(good_images + b"\0")
    assert_data_error(f"idx:{root}", "trailing bytes")
    images.write_bytes(gzip.compress(good_images)[:-20])  # truncated gzip
    assert_data_error(f"idx:{root}", "corrupt or truncated gzip")
    images.write_bytes(good_images)

    write_idx(labels, np.zeros(39, dtype=np.uint8))
    assert_data_error(f"idx:{root}", "40 images but train-labels-idx1-ubyte has 39 labels")
    write_idx(labels, np.full(40, 3, dtype=np.uint8))
    assert_data_error(f"idx:{root}", "at least two classes")
    labels.unlink()
    assert_data_error(f"idx:{root}", "train-labels-idx1-ubyte.* is missing")
    assert_data_error(f"idx:{tmp_path / 'nowhere'}", "no such directory")
    assert_data_error(f"idx:{images}", "not a directory")
    assert_data_error("idx:", "give a directory path")
    (tmp_path / "empty").mkdir()
    assert_data_error(f"idx:{tmp_path / 'empty'}", "no train-images-idx3-ubyte")


# --------------------------------------------------------------------- CIFAR-10
CIFAR_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
               "truck"]


def cifar_batch(n: int, seed: int, bytes_keys: bool = True) -> dict:
    rng = np.random.default_rng(seed)
    batch = {"batch_label": "training batch", "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
             "labels": [int(v) for v in rng.integers(0, 10, n)], "filenames": ["x.png"] * n}
    return {k.encode(): v for k, v in batch.items()} if bytes_keys else batch


def write_cifar(root, batches: int = 2, test: bool = True, bytes_keys: bool = True) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for i in range(1, batches + 1):
        (root / f"data_batch_{i}").write_bytes(pickle.dumps(cifar_batch(10, i, bytes_keys), protocol=2))
    if test:
        (root / "test_batch").write_bytes(pickle.dumps(cifar_batch(6, 99, bytes_keys), protocol=2))
    meta = {b"label_names": [n.encode() for n in CIFAR_NAMES], b"num_cases_per_batch": 10}
    (root / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))


@pytest.mark.parametrize("bytes_keys", [True, False], ids=["py2-bytes-keys", "str-keys"])
def test_cifar10_reads_pickle_batches(tmp_path, bytes_keys):
    write_cifar(tmp_path / "cifar-10-batches-py", bytes_keys=bytes_keys)
    data = build_data(f"cifar10:{tmp_path}")  # the parent folder works too
    assert data.input_shape == (3, 32, 32) and data.class_names == CIFAR_NAMES
    assert len(data.train) == 20 and len(data.val) == 6
    raw = cifar_batch(10, 1)
    assert data.train.tensors[1][:10].tolist() == raw[b"labels"]
    # Pixel (channel 0, row 0, col 1) is byte 1 of the row-major R plane.
    x = data.train.tensors[0]
    mean, std = data.fitted["mean"][0], data.fitted["std"][0]
    assert x[0, 0, 0, 1].item() * std + mean == pytest.approx(raw[b"data"][0, 1] / 255, abs=1e-5)
    assert x.transpose(0, 1).reshape(3, -1).mean(dim=1).abs().max() < 1e-4  # per channel


def test_cifar10_without_test_batch_splits(tmp_path):
    write_cifar(tmp_path, batches=3, test=False)
    data = build_data(f"cifar10:{tmp_path}", DataOptions(val_fraction=0.1))
    assert len(data.train) == 27 and len(data.val) == 3


def test_cifar10_malformed_files(tmp_path):
    write_cifar(tmp_path)
    batch = tmp_path / "data_batch_1"
    good = batch.read_bytes()

    batch.write_bytes(pickle.dumps([1, 2, 3]))
    assert_data_error(f"cifar10:{tmp_path}", "holds a list, not the dict")
    batch.write_bytes(good[: len(good) // 2])
    assert_data_error(f"cifar10:{tmp_path}", "data_batch_1 is not a readable CIFAR python pickle")
    batch.write_bytes(b"\x00garbage")
    assert_data_error(f"cifar10:{tmp_path}", "not a readable CIFAR python pickle")
    batch.write_bytes(pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}))
    assert_data_error(f"cifar10:{tmp_path}", r"data must be N x 3072 uint8")
    batch.write_bytes(pickle.dumps({b"images": 1}))
    assert_data_error(f"cifar10:{tmp_path}", "no 'data' and 'labels'")
    bad_labels = cifar_batch(4, 0)
    bad_labels[b"labels"] = [0, 1, 2, 12]
    batch.write_bytes(pickle.dumps(bad_labels))
    assert_data_error(f"cifar10:{tmp_path}", "label 12, outside 0..9")
    for f in tmp_path.glob("data_batch_*"):
        f.unlink()
    assert_data_error(f"cifar10:{tmp_path}", "no data_batch_1")


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def test_cifar10_pickles_cannot_run_code(tmp_path):
    write_cifar(tmp_path)
    marker = tmp_path / "pwned"
    (tmp_path / "data_batch_1").write_bytes(pickle.dumps({b"data": _Exploit(marker)}, protocol=2))
    assert_data_error(f"cifar10:{tmp_path}", "refusing to load posix.mkdir|refusing to load nt.mkdir")
    assert not marker.exists()


# ------------------------------------------------------------------ image folder
def write_png(path, size, color, mode="RGB") -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path)


def write_folder(root, classes=("cat", "dog"), per_class=5, mode="RGB") -> None:
    colors = {"RGB": [(250, 10, 10), (10, 10, 250), (10, 250, 10)], "L": [30, 220, 120]}[mode]
    for c, name in enumerate(classes):
        for i in range(per_class):
            write_png(root / name / f"{i}.png", (12 + i, 9 + 2 * i), colors[c], mode)


def test_imagefolder_decodes_resizes_and_normalises(tmp_path):
    write_folder(tmp_path / "pets")
    (tmp_path / "pets" / "cat" / "notes.txt").write_text("not an image: ignored")
    data = build_data(f"imagefolder:{tmp_path / 'pets'},size=8", DataOptions(val_fraction=0.2))
    assert data.class_names == ["cat", "dog"] and data.input_shape == (3, 8, 8)
    assert len(data.train) == 8 and len(data.val) == 2
    x, y = data.train.tensors
    # Red cats, blue dogs: after per-channel standardisation channel 0 separates them.
    assert (x[y == 0][:, 0].mean() > 0) and (x[y == 1][:, 0].mean() < 0)
    assert x.transpose(0, 1).reshape(3, -1).mean(dim=1).abs().max() < 1e-4


def test_imagefolder_train_val_subdirs_and_grayscale(tmp_path):
    write_folder(tmp_path / "train", ("a", "b", "c"), mode="L")
    write_folder(tmp_path / "val", ("a", "c"), per_class=2, mode="L")
    data = build_data(f"imagefolder:{tmp_path}")
    assert data.input_shape == (1, 32, 32) and data.num_classes == 3
    assert len(data.train) == 15 and len(data.val) == 4
    assert sorted(set(data.val.tensors[1].tolist())) == [0, 2]  # folder names, not positions
    rgb = build_data(f"imagefolder:{tmp_path},channels=3,size=4")
    assert rgb.input_shape == (3, 4, 4)


def test_imagefolder_malformed(tmp_path):
    root = tmp_path / "imgs"
    write_folder(root)
    (root / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n definitely not a png")
    assert_data_error(f"imagefolder:{root}", r"cannot decode image .*broken.png")
    (root / "dog" / "broken.png").unlink()
    good = (root / "dog" / "0.png").read_bytes()
    (root / "dog" / "0.png").write_bytes(good[: len(good) // 2])  # truncated PNG
    assert_data_error(f"imagefolder:{root}", r"cannot decode image .*0.png")
    (root / "dog" / "0.png").write_bytes(good)
    (root / "empty").mkdir()
    assert_data_error(f"imagefolder:{root}", "class folder .*empty has no images")
    (root / "empty").rmdir()
    assert_data_error(f"imagefolder:{root},size=0", "size must be >= 1")
    assert_data_error(f"imagefolder:{root},channels=2", "channels must be auto, 1 or 3")
    assert_data_error(f"imagefolder:{root},colour=1", "unknown option")
    write_folder(tmp_path / "one", ("only",))
    assert_data_error(f"imagefolder:{tmp_path / 'one'}", "at least two class folders")
    (tmp_path / "flat").mkdir()
    write_png(tmp_path / "flat" / "x.png", (4, 4), (0, 0, 0))
    assert_data_error(f"imagefolder:{tmp_path / 'flat'}", "no class subfolders")
    assert_data_error(f"imagefolder:{tmp_path / 'missing'}", "no such directory")


# ------------------------------------------------------------------------- NPZ
def test_npz_features_images_and_explicit_validation(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "f.npz", x=rng.normal(size=(30, 5)), y=np.array(["no", "yes"] * 15))
    data = build_data(f"npz:{tmp_path / 'f.npz'}")
    assert data.kind == "features" and data.input_shape == (5,) and data.class_names == ["no", "yes"]
    assert len(data.train) == 24 and data.train.tensors[0].dtype == torch.float32

    np.savez(tmp_path / "i.npz", x=rng.integers(0, 256, (20, 7, 7), dtype=np.uint8),
             y=np.arange(20) % 4, x_val=rng.integers(0, 256, (6, 7, 7), dtype=np.uint8),
             y_val=np.array([0, 1, 2, 3, 10, 10]))
    data = build_data(f"npz:{tmp_path / 'i.npz'}")
    assert data.kind == "image" and data.input_shape == (1, 7, 7)  # N x H x W: one channel
    assert data.class_names == ["0", "1", "2", "3", "10"]  # numeric order
    assert len(data.train) == 20 and len(data.val) == 6
    assert data.train.tensors[0].max() <= 1.0  # uint8 scaled to [0, 1]


def test_npz_sequences(tmp_path):
    tokens = np.array([[3, 4, 0, 0], [5, 6, 7, 0]] * 5, dtype=np.int64)
    np.savez(tmp_path / "s.npz", x=tokens, y=np.array([0, 1] * 5))
    data = build_data(f"npz:{tmp_path / 's.npz'},kind=sequence")
    assert data.kind == "sequence" and data.vocab_size == 8 and data.input_shape == (4,)
    assert data.train.tensors[0].dtype == torch.long


def test_npz_malformed(tmp_path):
    path = tmp_path / "d.npz"
    path.write_bytes(b"PK\x03\x04 truncated zip")
    assert_data_error(f"npz:{path}", "not a readable .npz file")
    np.savez(path, x=np.zeros((4, 2)))
    assert_data_error(f"npz:{path}", "needs arrays named x and y")
    np.savez(path, x=np.zeros((4, 2)), y=np.array([0, 1, 0]))
    assert_data_error(f"npz:{path}", "x has 4 rows but y has 3")
    np.savez(path, x=np.zeros((4, 2)), y=np.zeros(4))
    assert_data_error(f"npz:{path}", "at least two classes")
    np.savez(path, x=np.zeros((4, 2)), y=np.array([0, 1, 0, 1]), x_val=np.zeros((2, 2)))
    assert_data_error(f"npz:{path}", "x_val and y_val come together")
    np.savez(path, x=np.array([[np.nan, 1.0]] * 4), y=np.array([0, 1, 0, 1]))
    assert_data_error(f"npz:{path}", "NaN")
    np.savez(path, x=np.zeros((4, 2)), y=np.array([0, 1, 0, 1]))
    assert_data_error(f"npz:{path},kind=sequence", "kind=sequence needs x of non-negative integer")
    assert_data_error(f"npz:{path},kind=video", "kind must be one of")
    assert_data_error(f"npz:{tmp_path / 'missing.npz'}", "no such file")


# ------------------------------------------------------------------------- CSV
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
    assert data.kind == "sequence" and data.input_shape == (6,) and data.class_names == ["neg", "pos"]
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


def test_tensor_data_and_bundle_api():
    data = TensorData(torch.zeros(3, 2), torch.tensor([0, 1, 0]))
    assert len(data) == 3 and data.nbytes() == 3 * 2 * 4 + 3 * 8
    bundle = DataBundle(data, None, 2, (2,), "features")
    assert bundle.class_names == ["0", "1"] and bundle.fitted == {}


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
    from amptrain.runner import run_evaluation, run_training

    write_csv(tmp_path / "train.csv", sentiment_rows(400, 0, filler=5, sentiment=2))
    # The same words at other frequencies: a vocabulary built from this file would give
    # the words other ids than the model learnt (sentiment words would come first).
    write_csv(tmp_path / "other.csv", sentiment_rows(200, 1, filler=1, sentiment=3))
    config = RunConfig(model="lstm:embed=16,hidden=16",
                       data=f"csv-text:{tmp_path / 'train.csv'},max_len=8",
                       precision="32-true", device="cpu", epochs=5, batch_size=32, lr=0.01,
                       out=str(tmp_path / "run"), no_progress=True)
    config.validate()
    fit = run_training(config)
    assert fit.val_acc >= 0.95
    result, _ = run_evaluation(checkpoint_path=str(tmp_path / "run" / "checkpoints" / "last.pt"),
                               data=f"csv-text:{tmp_path / 'other.csv'},max_len=8",
                               precision="32-true", out=str(tmp_path / "ev"), device="cpu",
                               progress=False)
    assert result.accuracy >= 0.9
