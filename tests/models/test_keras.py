"""amptrain/models/keras.py: saved Keras 3 models trained on the torch backend.

The models are built and saved here (functional and Sequential, as a Keras user writes
them); the slow tests train them end to end: both mixed policies to >= 90% on digits,
compare's table under the Keras names, the exported model.keras, exact resume, and two
gloo processes against one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest
import torch

os.environ.setdefault("KERAS_BACKEND", "torch")  # before keras is imported, as amptrain does
keras = pytest.importorskip("keras", reason="keras 3 is an optional extra: amptrain[keras]")

# Below the importorskip on purpose (E402): without the keras extra the module is skipped
# before any of amptrain is imported, and KERAS_BACKEND is set before anything could import keras.
from amptrain import checkpoint  # noqa: E402
from amptrain.common.errors import UserError  # noqa: E402
from amptrain.config import RunConfig, build_config  # noqa: E402
from amptrain.models import ModelInputs, build_model, exporter_of  # noqa: E402
from amptrain.models import keras as keras_models  # noqa: E402
from amptrain.precision.islands import default_keep_fp32  # noqa: E402
from amptrain.workflows.runner import run_training  # noqa: E402
from tests.distributed.helpers import ROOT, child_env, free_port, run  # noqa: E402

DIGITS = ModelInputs(num_classes=10, input_shape=(1, 8, 8), kind="image")


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, str]:
    """A functional model on 64 features and a Sequential one on 8x8x1 images with a softmax
    output, saved as a Keras user saves them."""
    root = tmp_path_factory.mktemp("keras")
    keras.utils.set_random_seed(0)
    pixels = keras.Input((64,), name="pixels")
    hidden = keras.layers.Dense(64, activation="relu", name="hidden")(pixels)
    logits = keras.layers.Dense(10, name="logits")(hidden)
    keras.Model(pixels, logits, name="digits_mlp").save(root / "functional.keras")
    keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(name="flat"),
                      keras.layers.Dense(64, activation="relu", name="d1"),
                      keras.layers.Dense(10, activation="softmax", name="out")]
                     ).save(root / "sequential.keras")
    keras.Sequential([keras.Input((64,)), keras.layers.Dense(3, name="out")]
                     ).save(root / "three.keras")
    keras.Sequential([keras.Input((49,)), keras.layers.Dense(10)]).save(root / "small.keras")
    (root / "corrupt.keras").write_bytes(b"not a zip archive")
    (root / "weights.txt").write_text("0.1 0.2\n")
    return {p.stem: str(p) for p in root.iterdir()}


def test_layers_are_modules_under_their_keras_names(saved):
    model = build_model(f"keras:{saved['functional']}", DIGITS)
    names = dict(model.named_modules())
    assert {"hidden", "logits"} <= set(names) and "pixels" not in names
    assert default_keep_fp32(model) == ["logits"]           # Keras's float32 output layer
    assert model(torch.randn(3, 1, 8, 8)).shape == (3, 10)  # 1x8x8 -> the declared 64
    off = build_model(f"keras:{saved['functional']},fp32_output=0", DIGITS)
    assert default_keep_fp32(off) == []


def test_images_go_in_channels_last_and_softmax_is_set_aside(saved):
    model = build_model(f"keras:{saved['sequential']}", DIGITS)
    x = torch.randn(4, 1, 8, 8)
    logits = model(x)
    reference = keras.saving.load_model(saved["sequential"])(x.permute(0, 2, 3, 1))
    torch.testing.assert_close(logits.softmax(-1), reference)  # logits of the same model


@pytest.mark.parametrize("key,options,inputs,match", [
    ("missing", "", DIGITS, "no such file"),
    ("weights", "", DIGITS, "is not a Keras model file"),
    ("corrupt", "", DIGITS, "is not a zip archive: the file is corrupt"),
    ("three", "", DIGITS, "the model outputs 3 values per sample but the data has 10 classes"),
    ("small", "", DIGITS, r"input shape \(49,\) does not fit the data's samples of shape "
                          r"\(1, 8, 8\)"),
    ("functional", ",fp32=1", DIGITS, "unknown option 'fp32=1'"),
])
def test_bad_input_is_a_user_error(saved, key, options, inputs, match):
    path = saved.get(key, "/nonexistent/model.keras")
    with pytest.raises(UserError, match=match):
        build_model(f"keras:{path}{options}", inputs)


def test_a_lambda_layer_is_refused_and_its_code_never_runs(tmp_path):
    # A .keras archive may carry a Lambda layer's marshalled bytecode; loading runs nothing.
    marker = tmp_path / "PWNED"
    payload = eval(f"lambda x: (open({str(marker)!r}, 'w'), x)[1]")  # no closure to save
    planted = keras.Sequential([keras.Input((64,)), keras.layers.Lambda(payload),
                                keras.layers.Dense(10)])
    marker.unlink(missing_ok=True)  # tracing the Lambda while building ran it once
    planted.save(tmp_path / "planted.keras")
    with pytest.raises(UserError, match="holds a Lambda layer, whose Python code amptrain "
                                        "does not run"):
        build_model(f"keras:{tmp_path / 'planted.keras'}", DIGITS)
    assert not marker.exists()


def test_a_subclass_that_cannot_be_saved_back_is_refused_before_training():
    class Net(keras.Model):
        def __init__(self, table):
            super().__init__()
            self.table = table
            self.dense = keras.layers.Dense(10)

        def call(self, x):
            return self.dense(x)

    net = Net(object())
    net(keras.ops.zeros((1, 64)))
    with pytest.raises(UserError, match="cannot be saved back after training"):
        keras_models.check_saveable(keras, net, "keras:net.keras")


def test_keras_on_another_backend_is_refused(monkeypatch):
    fake = types.SimpleNamespace(__version__="3.5.0",
                                 backend=types.SimpleNamespace(backend=lambda: "jax"))
    monkeypatch.setitem(sys.modules, "keras", fake)
    with pytest.raises(UserError, match="already imported with the jax backend"):
        keras_models.import_keras("keras:m.keras")


def test_without_keras_the_error_names_the_extra(saved):
    code = ("import sys; sys.modules['keras'] = None; from amptrain.cli import main; "
            f"sys.exit(main(['train', '--model', 'keras:{saved['functional']}', '--out', "
            f"'{os.path.dirname(saved['functional'])}/never']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=child_env(), cwd=ROOT, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"amptrain: error: --model keras:{saved['functional']} needs keras 3: "
        f"pip install 'amptrain[keras]'"]


# ------------------------------------------------------------------ end to end
def _train(saved, key: str, out, **options):
    values = {"model": f"keras:{saved[key]}", "data": "digits", "lr": 0.01, "epochs": 4,
              "no_progress": True, "device": "cpu", "out": str(out), **options}
    return run_training(build_config(RunConfig, values))


@pytest.mark.slow
@pytest.mark.parametrize("key,policy", [("functional", "mixed_bfloat16"),
                                        ("sequential", "mixed_float16")])
def test_both_mixed_policies_train_to_90_percent_and_export(saved, tmp_path, key, policy):
    result = _train(saved, key, tmp_path, precision=policy)
    assert result.val_metrics["acc"] >= 0.90 and result.skipped_steps == 0
    scales = [r["loss_scale"] for r in map(json.loads, (tmp_path / "metrics.jsonl").open())
              if "loss" in r]
    assert all(s is not None for s in scales) == (policy == "mixed_float16")  # LossScaleOptimizer
    # model.keras is the user's model with the trained fp32 weights: it predicts what the
    # trained module (fp32 weights from the checkpoint) computes.
    exported = keras.saving.load_model(tmp_path / "model.keras")
    module = build_model(f"keras:{saved[key]}", DIGITS).eval()
    module.load_state_dict(checkpoint.load(tmp_path / "checkpoints" / "last.pt")["model"])
    x = torch.randn(16, 1, 8, 8)
    with torch.no_grad():
        ours = module(x)
        theirs = exported(x.reshape(16, 64) if key == "functional" else x.permute(0, 2, 3, 1))
    torch.testing.assert_close(theirs, ours if key == "functional" else ours.softmax(-1))
    assert [layer.name for layer in exported.layers] == \
        [layer.name for layer in keras.saving.load_model(saved[key]).layers]


@pytest.mark.slow
def test_resume_is_bitwise(saved, tmp_path):
    options = {"precision": "mixed_float16", "max_steps": 6, "save_every": 3, "epochs": 1}
    _train(saved, "functional", tmp_path / "whole", **options)
    _train(saved, "functional", tmp_path / "resumed", **options,
           resume=str(tmp_path / "whole" / "checkpoints" / "step-3.pt"))
    whole, resumed = (checkpoint.load(tmp_path / d / "checkpoints" / "last.pt")
                      for d in ("whole", "resumed"))
    assert resumed["step"] == whole["step"] == 6
    for name, value in whole["model"].items():
        assert torch.equal(resumed["model"][name], value), name


@pytest.mark.slow
def test_compare_gives_its_table_under_the_keras_names(saved, tmp_path):
    out = tmp_path / "study"
    result = run([sys.executable, "-m", "amptrain", "compare", "--model",
                  f"keras:{saved['functional']}", "--data", "digits", "--precisions",
                  "float32,mixed_bfloat16,mixed_float16", "--seeds", "1", "--max-steps", "8",
                  "--timing-steps", "3", "--timing-warmup", "1", "--no-progress",
                  "--out", str(out)], child_env())
    assert result.returncode == 0, result.stderr[-4000:]
    for row in ("32-true (float32)", "bf16-mixed (mixed_bfloat16)", "16-mixed (mixed_float16)"):
        assert row in result.stdout
    summary = json.loads((out / "compare.json").read_text())["summary"]
    assert [r["precision"] for r in summary] == ["32-true", "bf16-mixed", "16-mixed"]
    assert all(r["val_acc_mean"] is not None for r in summary)
    assert "`16-mixed (mixed_float16)`" in (out / "report.md").read_text()


@pytest.mark.slow
def test_diagnose_reports_keras_layer_names(saved, tmp_path):
    from amptrain.diagnose import diagnose

    config = build_config(RunConfig, {"model": f"keras:{saved['functional']}", "data": "digits",
                                      "device": "cpu", "no_progress": True})
    report = diagnose(config, steps=2)
    assert {"hidden", "logits"} <= set(report["modules"])


@pytest.mark.slow
def test_two_gloo_processes_equal_one(saved, tmp_path):
    flags = ["--model", f"keras:{saved['functional']}", "--data", "digits", "--precision",
             "float32", "--optimizer", "sgd", "--lr", "0.05", "--batch-size", "64",
             "--max-steps", "6", "--no-progress"]
    two = run([sys.executable, "-m", "amptrain", "train", *flags, "--out", str(tmp_path / "two"),
               "--nproc-per-node", "2", "--master-port", str(free_port())], child_env())
    assert two.returncode == 0, two.stderr[-4000:]
    _train(saved, "functional", tmp_path / "one", precision="float32", optimizer="sgd",
           lr=0.05, batch_size=64, max_steps=6, epochs=1)
    one, both = (checkpoint.load(tmp_path / d / "checkpoints" / "last.pt")["model"]
                 for d in ("one", "two"))
    for name, value in one.items():
        torch.testing.assert_close(both[name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert (tmp_path / "two" / "model.keras").is_file()  # written once, by rank 0
    assert exporter_of(build_model(f"keras:{saved['functional']}", DIGITS)) is not None
