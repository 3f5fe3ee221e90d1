"""amptrain/data/arrays.py: ``npz:FILE``, the user's own arrays."""
from __future__ import annotations

import numpy as np
import torch

from amptrain.cli import main
from amptrain.data import DataOptions, build_data
from tests.data.conftest import assert_data_error


def test_cli_exits_2_on_malformed_data(tmp_path, capsys):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip file")
    code = main(["train", "--data", f"npz:{bad}", "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--data npz:" in err[0]
    assert not (tmp_path / "run").exists()


def test_npz_features_images_and_explicit_validation(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "f.npz", x=rng.normal(size=(30, 5)), y=np.array(["no", "yes"] * 15))
    data = build_data(f"npz:{tmp_path / 'f.npz'}")
    assert data.kind == "features" and data.input_shape == (5,)
    assert data.class_names == ["no", "yes"]
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
    np.savez(path, x=np.zeros((4, 2)), y=np.zeros(4, dtype=np.int64))
    assert_data_error(f"npz:{path}", "at least two classes")
    np.savez(path, x=np.zeros((4, 2)), y=np.array([0, 1, 0, 1]), x_val=np.zeros((2, 2)))
    assert_data_error(f"npz:{path}", "x_val and y_val come together")
    np.savez(path, x=np.array([[np.nan, 1.0]] * 4), y=np.array([0, 1, 0, 1]))
    assert_data_error(f"npz:{path}", "NaN")
    np.savez(path, x=np.zeros((4, 2)), y=np.array([0, 1, 0, 1]))
    assert_data_error(f"npz:{path},kind=sequence", "kind=sequence needs x of non-negative integer")
    assert_data_error(f"npz:{path},kind=video", "kind must be one of")
    assert_data_error(f"npz:{tmp_path / 'missing.npz'}", "no such file")


def test_npz_float_targets_are_regression_under_task_auto(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "r.npz"
    np.savez(path, x=rng.normal(size=(50, 3)), y=rng.normal(size=(50, 2)))
    bundle = build_data(f"npz:{path}", DataOptions())
    assert bundle.task == "regression" and bundle.num_classes == 2 and bundle.class_names == []
    assert bundle.train.tensors[1].dtype == torch.float32 and bundle.train.tensors[1].shape[1] == 2
    np.savez(path, x=rng.normal(size=(50, 3)), y=np.arange(50) % 3)
    assert build_data(f"npz:{path}", DataOptions()).task is None  # class labels
    assert_data_error(f"npz:{path}", "--task regression needs float targets",
                      options=DataOptions(task="regression"))
    np.savez(path, x=rng.normal(size=(50, 3)), y=np.where(np.arange(50) == 7, np.inf, 1.0))
    assert_data_error(f"npz:{path}", "y of row 7 is not a finite number")
    # --task classification reads whole-number floats as classes
    np.savez(path, x=rng.normal(size=(50, 3)), y=(np.arange(50) % 2).astype(float))
    assert build_data(f"npz:{path}", DataOptions(task="classification")).class_names == ["0", "1"]
