"""amptrain/data/core.py: the registry, in-memory tensors, the bundle, spec parsing,
the seeded split, label mapping and normalisation."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from amptrain.data import DATASETS, DataBundle, DataOptions, TensorData, build_data
from amptrain.data.core import (
    labels_to_classes,
    normalise,
    parse_options,
    path_and_options,
    register,
    split,
    split_indices,
)
from amptrain.common.errors import UserError
from tests.data.conftest import assert_data_error


def test_registry_names():
    assert {"digits", "synthetic-image", "synthetic-seq", "idx", "cifar10", "imagefolder",
            "npz", "csv-text"} <= set(DATASETS)
    assert_data_error("mnist", "unknown --data")


def test_the_face_imports_no_torch_and_the_registry_its_sources_on_first_read():
    code = ("import sys, amptrain.data, amptrain.tasks, amptrain.config.run\n"
            "print('torch' in sys.modules)\n"
            "from amptrain.data.core import BUILT_IN_SOURCES, DATASETS\n"
            "print('amptrain.data.gym' in sys.modules, 'gym' in DATASETS,\n"
            "      all('amptrain.data.' + name in sys.modules for name in BUILT_IN_SOURCES))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False", "True", "True"]


def test_tensor_data_and_bundle_api():
    data = TensorData(torch.zeros(3, 2), torch.tensor([0, 1, 0]))
    assert len(data) == 3 and data.nbytes() == 3 * 2 * 4 + 3 * 8
    bundle = DataBundle(data, None, 2, (2,), "features")
    assert bundle.class_names == ["0", "1"] and bundle.fitted == {}


# ------------------------------------------------------------------ new: core helpers
def test_tensor_data_rows_and_length_check():
    x, y = torch.arange(6.0).view(3, 2), torch.tensor([2, 0, 1])
    data = TensorData(x, y)
    row_x, row_y = data[1]
    assert torch.equal(row_x, torch.tensor([2.0, 3.0])) and int(row_y) == 0
    moved = data.to(torch.device("cpu"))
    assert isinstance(moved, TensorData) and torch.equal(moved.tensors[0], x)
    with pytest.raises(ValueError, match="equal length"):
        TensorData(x, y[:2])
    with pytest.raises(ValueError, match="equal length"):
        TensorData()


def test_a_registered_factory_is_built_by_name_and_gets_the_spec(monkeypatch):
    seen = {}

    def factory(argument: str, options: DataOptions) -> DataBundle:
        seen["argument"], seen["seed"] = argument, options.seed
        return DataBundle(TensorData(torch.zeros(2, 1), torch.tensor([0, 1])), None, 2, (1,),
                          "features")

    monkeypatch.setitem(DATASETS, "my-data", None)  # undone after the test
    assert register("my-data")(factory) is factory and DATASETS["my-data"] is factory
    bundle = build_data("my-data:a=1:b", DataOptions(seed=9))
    assert seen == {"argument": "a=1:b", "seed": 9}  # split at the first colon only
    assert bundle.name == "my-data:a=1:b"


def test_parse_options_types_values_like_their_defaults():
    defaults = {"samples": 10, "noise": 1.0, "kind": "auto"}
    assert parse_options("", defaults, "s") == defaults
    assert parse_options("noise=0.5,samples=3,,kind=x", defaults, "s") == \
        {"samples": 3, "noise": 0.5, "kind": "x"}
    with pytest.raises(UserError, match="noise must be a number"):
        parse_options("noise=lots", defaults, "s")
    with pytest.raises(UserError, match=r"unknown option 'size=3'; options are samples=10"):
        parse_options("size=3", defaults, "s")
    with pytest.raises(UserError, match="unknown option 'samples'"):
        parse_options("samples", defaults, "s")  # no positional options for data
    with pytest.raises(UserError, match="options are none"):
        parse_options("x=1", {}, "s")


def test_path_and_options_takes_an_existing_path_whole(tmp_path):
    odd = tmp_path / "a,b.npz"
    odd.write_bytes(b"")
    path, options = path_and_options(str(odd), {"kind": "auto"}, "npz:x", what="file")
    assert path == odd and options == {"kind": "auto"}
    plain = tmp_path / "p.npz"
    plain.write_bytes(b"")
    path, options = path_and_options(f"{plain},kind=image", {"kind": "auto"}, "npz:x",
                                     what="file")
    assert path == plain and options == {"kind": "image"}
    with pytest.raises(UserError, match="not a directory"):
        path_and_options(str(plain), {}, "idx:x", what="directory")
    with pytest.raises(UserError, match="not a file"):
        path_and_options(str(tmp_path), {}, "npz:x", what="file")


def test_split_is_seeded_disjoint_and_never_empty():
    train, val = split_indices(10, 0.2)
    again_train, again_val = split_indices(10, 0.2)
    assert torch.equal(train, again_train) and torch.equal(val, again_val)
    assert len(val) == 2 and sorted(train.tolist() + val.tolist()) == list(range(10))
    other_train, _ = split_indices(10, 0.2, seed=1)
    assert not torch.equal(train, other_train)
    # Both sides keep a sample even at the extremes.
    for fraction in (0.0, 0.99):
        t, v = split_indices(2, fraction)
        assert len(t) == 1 and len(v) == 1
    x = torch.arange(10.0).unsqueeze(1)
    y = torch.arange(10)
    train_data, val_data = split(x, y, 0.3)
    assert torch.equal(train_data.tensors[0].squeeze(1).long(), train_data.tensors[1])
    assert len(val_data) == 3


def test_labels_to_classes_sorts_numbers_numerically_and_checks_labels():
    import numpy as np

    labels, names = labels_to_classes(["10", "2", "b", "a", "2"], "s")
    assert names == ["2", "10", "a", "b"] and labels.tolist() == [1, 0, 3, 2, 0]
    labels, names = labels_to_classes(list(np.array([1.0, 0.0, 1.0])), "s")
    assert names == ["0", "1"] and labels.dtype == torch.long and labels.tolist() == [1, 0, 1]
    labels, names = labels_to_classes(["dog"], "s", known=["cat", "dog"])  # one is enough
    assert labels.tolist() == [1] and names == ["cat", "dog"]
    with pytest.raises(UserError, match="label 'cow' is not one of the 2 classes"):
        labels_to_classes(["cow", "dog"], "s", known=["cat", "dog"])
    with pytest.raises(UserError, match="at least two classes, found 1"):
        labels_to_classes(["a", "a"], "s")
    with pytest.raises(UserError, match=r"not whole numbers \(row 1: 0.5\)"):
        labels_to_classes([1.0, 0.5], "s")
    with pytest.raises(UserError, match="label of row 0 is nan"):
        labels_to_classes([float("nan"), 1.0], "s")


def test_normalise_with_fitted_statistics():
    x = torch.tensor([[[[1.0, 3.0]], [[10.0, 30.0]]]])  # 1 x 2 channels x 1 x 2
    out = normalise(x.clone(), [1.0, 10.0], [2.0, 10.0])
    assert torch.equal(out, torch.tensor([[[[0.0, 1.0]], [[0.0, 2.0]]]]))
    with pytest.raises(UserError, match="the data has 2 channels but the run was trained on 3"):
        normalise(x, [0.0] * 3, [1.0] * 3)
