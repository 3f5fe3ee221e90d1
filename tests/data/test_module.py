"""module:pkg.mod.factory: the user's own Dataset classes, and what is refused."""
from __future__ import annotations

import sys
import textwrap

import pytest

from amptrain.data import DataOptions, build_data
from amptrain.errors import UserError
from tests.commands.helpers import amptrain

USER_MODULE = textwrap.dedent('''
    import torch
    from torch.utils.data import Dataset, IterableDataset

    class Blobs(Dataset):
        """Two Gaussian blobs: a user's own Dataset class."""
        classes = ["left", "right"]

        def __init__(self, n, seed):
            g = torch.Generator().manual_seed(seed)
            self.y = torch.randint(0, 2, (n,), generator=g)
            self.x = torch.randn(n, 8, generator=g) + 2.0 * self.y[:, None]

        def __len__(self):
            return len(self.y)

        def __getitem__(self, i):
            return self.x[i], int(self.y[i])

    class Unnamed(Blobs):
        classes = None

    class Measures(Blobs):
        def __getitem__(self, i):
            return self.x[i], float(self.x[i].sum())

    def build(seed=0, val_fraction=0.2):
        return Blobs(256, 1 + seed), Blobs(64, 2)

    def no_val():
        return Unnamed(64, 1), None

    def regression():
        return Measures(64, 1), Measures(16, 2)

    def one():
        return Blobs(10, 1)

    def three():
        return Blobs(10, 1), None, None

    def not_datasets():
        return [1, 2, 3], None

    def empty():
        return Blobs(0, 1), None

    def broken():
        raise FileNotFoundError("no such file: /data/train.csv")
''')


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "userdata.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("userdata", None)


def test_a_custom_dataset_class_with_its_class_names(user_module):
    bundle = build_data("module:userdata.build", DataOptions(seed=3))
    assert bundle.class_names == ["left", "right"] and bundle.num_classes == 2
    assert bundle.input_shape == (8,) and bundle.kind == "features" and bundle.task is None
    assert len(bundle.train) == 256 and len(bundle.val) == 64
    assert bundle.train.__class__.__name__ == "Blobs"  # the user's object, not a copy


def test_classes_are_counted_and_float_targets_are_regression(user_module):
    bundle = build_data("module:userdata.no_val", DataOptions())
    assert bundle.val is None and bundle.num_classes == 2 and bundle.class_names == ["0", "1"]
    bundle = build_data("module:userdata.regression", DataOptions())
    assert bundle.task == "regression" and bundle.num_classes == 1


@pytest.mark.parametrize("factory, fragment", [
    ("one", "the factory returned a Blobs; it must return (train, val)"),
    ("three", "the factory returned 3 values"),
    ("not_datasets", "train split is a list, not a torch Dataset"),
    ("empty", "train Dataset is empty"),
    ("broken", "the factory raised FileNotFoundError: no such file: /data/train.csv"),
    ("missing", "has no callable 'missing'"),
])
def test_a_factory_returning_something_else_is_one_clear_error(user_module, factory, fragment):
    with pytest.raises(UserError, match=f"--data module:userdata.{factory}") as error:
        build_data(f"module:userdata.{factory}", DataOptions())
    assert fragment in str(error.value)


@pytest.mark.slow
def test_train_and_eval_from_the_command_line(user_module):
    out = user_module / "run"
    done = amptrain("train", "--model", "mlp", "--data", "module:userdata.build",
                    "--epochs", "1", "--batch-size", "32", "--precision", "32-true",
                    "--out", out, "--no-progress", cwd=user_module)
    assert done.returncode == 0, done.stderr
    assert "done: val_acc" in done.stdout
    refused = amptrain("train", "--data", "module:userdata.one", "--out", user_module / "r2",
                       cwd=user_module)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "amptrain: error: --data module:userdata.one: the factory returned a Blobs; it must "
        "return (train, val): two torch Datasets, val may be None"]
