"""module:pkg.mod.factory: the user's own Dataset classes, and what is refused."""
from __future__ import annotations

import sys
import textwrap

import pytest

from amptrain.data import DataOptions, build_data
from amptrain.common.errors import UserError
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
    # The user's object itself (not a copy), each sample checked as it is read.
    assert bundle.train.dataset.__class__.__name__ == "Blobs"
    assert bundle.train.classes == ["left", "right"]  # its attributes read through


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


# ------------------------------------------------ issue 36, class 2: after sample 0
# Each factory in tests/data/hostile_datasets.py misbehaves at one sample (40 of 64).
LATER = [
    ("raises_at_40", "training sample 40 is unusable: reading it raised KeyError"),
    ("label_minus_one", "training sample 40 is unusable: its label is -1, outside the 2 "
                        "classes (0 to 1)"),
    ("label_too_large", "its label is 7, outside the 2 classes"),
    ("shape_changes", "training sample 40 is unusable: its input has shape (5,), but "
                      "sample 0's has (8,)"),
    ("nan_input", "training sample 40 is unusable: its input holds NaN or infinite values"),
    ("inf_input", "its input holds NaN or infinite values"),
    ("not_a_pair", "training sample 40 is unusable: it is a Tensor, not an (input, target) "
                   "pair"),
    ("float_label_later", "its target is torch.float"),
    ("text_input_later", "its input or target is not a tensor, array or number"),
]


@pytest.mark.parametrize("factory,fragment", LATER, ids=[c[0] for c in LATER])
def test_a_sample_after_the_first_is_checked_as_it_is_read(factory, fragment):
    bundle = build_data(f"module:tests.data.hostile_datasets.{factory}", DataOptions())
    bundle.train[39]  # the samples before it are fine
    with pytest.raises(UserError) as caught:
        bundle.train[40]
    message = str(caught.value)
    assert message.startswith(f"--data module:tests.data.hostile_datasets.{factory}: ")
    assert fragment in message and "\n" not in message


def test_a_claimed_length_of_10_12_is_refused_before_a_sampler_allocates():
    with pytest.raises(UserError, match="claims 1000000000000 samples, over the limit of "
                                        "268435456 for a map-style Dataset"):
        build_data("module:tests.data.hostile_datasets.huge_length", DataOptions())


def test_a_len_that_raises_is_named():
    with pytest.raises(UserError, match=r"len\(\) of the factory's train Dataset raised "
                                        r"RuntimeError: the index file is gone"):
        build_data("module:tests.data.hostile_datasets.len_raises", DataOptions())


def test_the_checked_dataset_pickles_for_workers():
    import pickle

    bundle = build_data("module:tests.data.hostile_datasets.label_minus_one", DataOptions())
    copy = pickle.loads(pickle.dumps(bundle.train))
    assert len(copy) == 64 and copy.classes == ["left", "right"]
    with pytest.raises(UserError, match="sample 40 is unusable"):
        copy[40]


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.parametrize("factory,fragment", [
    ("raises_at_40", "training sample 40 is unusable: reading it raised KeyError"),
    ("nan_input", "training sample 40 is unusable: its input holds NaN"),
    ("val_label_minus_one", "validation sample 3 is unusable: its label is -1"),
])
def test_mid_run_the_error_is_one_line_in_the_main_process_and_in_workers(
        tmp_path, workers, factory, fragment):
    # Sample 40 is read in a later step (batches of 16, accumulated in pairs), in the main
    # process or in a DataLoader worker: the same one line, exit 2, no traceback.
    done = amptrain("train", "--model", "mlp", "--data",
                    f"module:tests.data.hostile_datasets.{factory}", "--batch-size", "16",
                    "--micro-batch-size", "8", "--epochs", "1", "--num-workers", workers,
                    "--out", tmp_path / "run", "--no-progress", "--logger", "none")
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "lower --lr" not in done.stderr
    assert last.startswith(f"amptrain: error: --data module:tests.data.hostile_datasets."
                           f"{factory}: ") and fragment in last, done.stderr


def test_the_checked_wrapper_declares_the_users_device_step_and_batch_reader():
    import torch
    from torch.utils.data import Dataset

    from amptrain.data.module import CheckedSamples, Sample
    from amptrain.data.protocol import BatchReading, batch_reader_of, finish_of

    def finish(batch, *, training, key):
        return batch

    class Reads(Dataset):
        on_device = staticmethod(finish)

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.zeros(2), 0

        def read_batch(self, indices):
            return torch.zeros(len(indices), 2), torch.zeros(len(indices), dtype=torch.long)

    class Plain(Reads):
        on_device = None
        read_batch = None  # type: ignore[assignment]

    first = Sample(torch.zeros(2), torch.tensor(0), task="classification", classes=2)
    wrapped = CheckedSamples(Reads(), "module:x", first, "training")
    # On the wrapper itself, not forwarded through __getattr__ (which isinstance checks
    # of a Protocol do not see on Python 3.12+).
    assert {"on_device", "read_batch"} <= set(vars(wrapped))
    assert isinstance(wrapped, BatchReading) and finish_of(wrapped) is finish
    assert batch_reader_of(wrapped)([0, 1])[0].shape == (2, 2)
    plain = CheckedSamples(Plain(), "module:x", first, "training")
    assert finish_of(plain) is None and batch_reader_of(plain) is None
