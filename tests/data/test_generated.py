"""amptrain/data/generated.py: digits, synthetic-image and synthetic-seq (no files)."""
from __future__ import annotations

import torch

from amptrain.data import DataOptions, build_data
from tests.data.conftest import assert_data_error


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


# ------------------------------------------------------------------ new
def test_synthetic_image_shapes_and_learnable_classes():
    data = build_data("synthetic-image:samples=200,size=5,channels=2,classes=4,noise=0")
    x, y = data.train.tensors
    assert data.kind == "image" and data.input_shape == (2, 5, 5) and data.num_classes == 4
    assert x.shape == (160, 2, 5, 5) and x.dtype == torch.float32 and y.dtype == torch.long
    assert len(data.val) == 40 and set(y.tolist()) <= set(range(4))
    # Without noise every sample is its class's prototype: one distinct image per class.
    for c in y.unique():
        rows = x[y == c]
        assert torch.equal(rows, rows[:1].expand_as(rows))
    assert not torch.equal(x[y == y[0]][0], x[y != y[0]][0])
    assert_data_error("synthetic-image:classes=1", "classes must be >= 2")
    assert_data_error("synthetic-image:noise=-1", "noise must be >= 0.0")


def test_synthetic_seq_is_reproducible_and_carries_the_class_signal():
    spec = "synthetic-seq:samples=400,length=32,vocab=41,classes=4,signal=0.5"
    a, b = build_data(spec), build_data(spec, DataOptions(seed=5))
    other = build_data(spec + ",seed=2")
    assert torch.equal(a.train.tensors[0], b.train.tensors[0])
    assert torch.equal(a.val.tensors[1], b.val.tensors[1])
    assert not torch.equal(a.train.tensors[0], other.train.tensors[0])
    tokens, labels = a.train.tensors
    # Class c owns the band 1 + 10c .. 10 + 10c; about half the positions draw from it.
    band = (tokens - 1) // 10
    share_own = (band == labels[:, None]).float().mean().item()
    assert 0.55 < share_own < 0.75  # 0.5 + 0.5 * 1/4 expected by chance
    assert_data_error("synthetic-seq:length=0", "length must be >= 1")


def test_digits_are_standardised_8x8_images_of_ten_classes():
    data = build_data("digits")
    x, y = data.train.tensors
    assert data.kind == "image" and data.input_shape == (1, 8, 8) and data.num_classes == 10
    assert x.shape[1:] == (1, 8, 8) and set(y.tolist()) == set(range(10))
    assert abs(x.mean().item()) < 0.3 and 0.6 < x.std().item() < 1.4
    assert data.class_names == [str(i) for i in range(10)]
