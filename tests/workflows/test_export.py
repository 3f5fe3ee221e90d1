"""amptrain/export.py: model.safetensors (+ model.json) for every built-in model after
training, equal to the checkpoint's fp32 weights (tied weights once, restored on load);
``hf/`` by save_pretrained for hf: models, reloaded offline by from_pretrained with
amptrain's logits; exports of an existing checkpoint in fp32 or bf16; files that exist
already are never overwritten. The command is tested in tests/commands/test_export.py."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from amptrain.config import RunConfig, build_config
from amptrain.common.errors import UserError
from amptrain.workflows.export import (INFO_NAME, SAFETENSORS_NAME, _aliases, export_checkpoint,
                                       load_safetensors, write_safetensors)
from amptrain.workflows.runner import run_training
from amptrain.workflows.saved_run import build_saved_model, load_run

ROOT = Path(__file__).parents[2]
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None

#: Every built-in model on data of its kind, as small as they go (one step each).
BUILT_IN = {
    "mlp:hidden=16": "digits", "cnn:width=8": "synthetic-image:samples=32,size=8,classes=3",
    "resnet18:width=8": "synthetic-image:samples=16,size=8,classes=3",
    "resnet50:width=8": "synthetic-image:samples=16,size=8,classes=3",
    "lstm": "synthetic-seq:samples=32,length=8,vocab=20,classes=3",
    "transformer": "synthetic-seq:samples=32,length=8,vocab=20,classes=3",
    "demo-overflow": "digits", "demo-underflow": "digits",
}


def _train(tmp_path: Path, model: str, data: str, **options) -> Path:
    out = tmp_path / "run"
    run_training(build_config(RunConfig, {
        "model": model, "data": data, "out": str(out), "max_steps": 1, "batch_size": 8,
        "no_progress": True, "precision": "32-true", **options}))
    return out


def _checkpoint_weights(out: Path) -> dict[str, torch.Tensor]:
    state, _ = load_run(str(out / "checkpoints" / "last.pt"))
    return state["model"]


def _assert_same(exported: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert set(exported) == set(expected)
    for name, tensor in expected.items():
        assert exported[name].dtype == (torch.float32 if tensor.is_floating_point()
                                        else tensor.dtype), name
        assert torch.equal(exported[name], tensor), name


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(BUILT_IN))
def test_every_built_in_model_writes_its_fp32_weights_as_safetensors(tmp_path, model):
    out = _train(tmp_path, model, BUILT_IN[model])
    _assert_same(load_safetensors(out / SAFETENSORS_NAME), _checkpoint_weights(out))
    info = json.loads((out / INFO_NAME).read_text())
    assert info["model"] == model and info["task"] == "classification"
    assert info["amptrain_version"] and info["dtype"] == "fp32" and info["step"] == 1
    assert len(info["class_names"]) in (3, 10)


@pytest.mark.slow
def test_tied_weights_are_written_once_and_restored(tmp_path):
    text = tmp_path / "a.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    out = _train(tmp_path, "gpt:layers=1,width=32,heads=2", f"text:{text}", seq_len=16)
    from safetensors.torch import load_file

    raw = load_file(str(out / SAFETENSORS_NAME))
    assert "token.weight" in raw and "head.weight" not in raw  # safetensors refuses sharing
    restored = load_safetensors(out / SAFETENSORS_NAME)
    _assert_same(restored, _checkpoint_weights(out))
    assert json.loads((out / INFO_NAME).read_text())["aliases"] == {"head.weight": "token.weight"}
    model = build_saved_model(load_run(str(out / "checkpoints" / "last.pt"))[1])
    model.load_state_dict(restored)
    assert model.head.weight is model.token.weight


@pytest.mark.slow
def test_half_weight_modes_export_fp32_unless_bf16_is_asked(tmp_path):
    out = _train(tmp_path, "mlp", "digits", precision="bf16-true")
    fp32 = load_safetensors(out / SAFETENSORS_NAME)
    _assert_same(fp32, _checkpoint_weights(out))
    out_dir, _ = export_checkpoint(out / "checkpoints" / "step-1.pt", "safetensors",
                                   tmp_path / "bf16", dtype="bf16")
    half = load_safetensors(out_dir / SAFETENSORS_NAME)
    assert all(t.dtype == torch.bfloat16 for t in half.values() if t.is_floating_point())
    assert json.loads((out_dir / INFO_NAME).read_text())["dtype"] == "bf16"
    for name, tensor in fp32.items():
        assert torch.equal(half[name], tensor.to(torch.bfloat16))


def test_aliases_only_for_shared_storage():
    a = torch.ones(3)
    unique, aliases = _aliases({"a": a, "b": a, "c": a.clone(), "d": a[:2]})
    assert aliases == {"b": "a"} and set(unique) == {"a", "c", "d"}


def test_an_existing_file_is_kept_after_training(tmp_path, caplog):
    out = tmp_path / "run"
    out.mkdir()
    (out / SAFETENSORS_NAME).write_text("not ours")
    _train(tmp_path, "mlp", "digits")
    assert (out / SAFETENSORS_NAME).read_text() == "not ours"
    assert "left as it is" in caplog.text


def test_write_safetensors_from_a_plain_state(tmp_path):
    state = {"w": torch.randn(2, 3).t(), "n": torch.tensor(3)}  # a non-contiguous view too
    write_safetensors(tmp_path, state, {"model": "mine"})
    back = load_safetensors(tmp_path / SAFETENSORS_NAME)
    assert torch.equal(back["w"], state["w"]) and torch.equal(back["n"], state["n"])

def test_safetensors_is_a_base_dependency_and_its_absence_is_one_clear_error(tmp_path):
    """Every run promises model.safetensors, so the package is in the base install; an
    install that lacks it anyway gets amptrain's own error saying what to install, not an
    ImportError (a real interpreter with the package blocked)."""
    import re
    import subprocess
    import sys

    # (tomllib is Python 3.11+; the project supports 3.10)
    base = re.search(r"^dependencies = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(),
                     re.S | re.M)
    assert base is not None and '"safetensors>=' in base.group(1)
    code = ("import sys; sys.modules['safetensors'] = None\n"
            "import torch\n"
            "from amptrain.common.errors import UserError\n"
            "from amptrain.workflows.export import write_safetensors\n"
            "try:\n"
            f"    write_safetensors({str(tmp_path)!r}, {{'w': torch.ones(1)}}, {{}})\n"
            "except UserError as exc:\n"
            "    print('UserError:', exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert "UserError: writing or reading model.safetensors needs the safetensors package: " \
           "pip install 'safetensors>=0.4'" in done.stdout, done.stdout + done.stderr
    assert not (tmp_path / SAFETENSORS_NAME).exists()



# ---------------------------------------------------------------- hf/ exports
def _example():
    spec = importlib.util.spec_from_file_location("tiny_hf_model",
                                                  ROOT / "examples" / "tiny_hf_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _amptrain_logits(out: Path, batch) -> torch.Tensor:
    """The logits amptrain's eval computes: the checkpoint rebuilt, loaded, in 32-true."""
    from amptrain.trainer import Trainer

    state, run = load_run(str(out / "checkpoints" / "last.pt"))
    trainer = Trainer(precision="32-true", device="cpu", no_progress=True)
    trainer.prepare(build_saved_model(run))
    trainer.load_weights(state["model"])
    with torch.no_grad():
        result = trainer.model(**batch) if isinstance(batch, dict) else trainer.model(batch)
    return getattr(result, "logits", result)


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed")
def test_hf_classifier_comes_back_by_from_pretrained_with_the_same_logits(tmp_path):
    import transformers

    example = _example()
    bert = example.write_tiny_bert(tmp_path / "tiny-bert")
    csv = example.write_reviews_csv(tmp_path / "reviews.csv", rows=40)
    out = _train(tmp_path, f"hf:{bert}", f"csv-text:{csv}", max_steps=2)
    exported = out / "hf"
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        exported, local_files_only=True).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported, local_files_only=True)
    assert model.config.id2label == {0: "negative", 1: "positive"}
    assert model.config.label2id == {"negative": 0, "positive": 1}
    batch = dict(tokenizer(["A great movie!", "the plot was dull and boring"],
                           padding=True, return_tensors="pt"))
    with torch.no_grad():
        theirs = model(**batch).logits
    assert torch.allclose(theirs, _amptrain_logits(out, batch), atol=1e-5)
    # Same weights as the safetensors export, so the same predictions as amptrain's.
    ours = load_safetensors(out / SAFETENSORS_NAME)
    assert torch.equal(model.classifier.weight, ours["classifier.weight"])


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers is not installed")
def test_hf_causal_lm_comes_back_and_exports_again_in_bf16(tmp_path):
    import transformers

    example = _example()
    gpt2 = example.write_tiny_gpt2(tmp_path / "tiny-gpt2")
    text = tmp_path / "t.txt"
    text.write_text("the movie was really good and the plot was great. " * 60)
    out = _train(tmp_path, f"hf:{gpt2}", f"text:{text}", seq_len=16)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        out / "hf", local_files_only=True).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out / "hf", local_files_only=True)
    ids = torch.tensor([tokenizer("the movie was good")["input_ids"]])
    with torch.no_grad():
        theirs = model(input_ids=ids).logits
    assert torch.allclose(theirs, _amptrain_logits(out, ids), atol=1e-5)
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    export_checkpoint(out, "hf", tmp_path / "half", dtype="bf16")
    half = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path / "half" / "hf", local_files_only=True, dtype="auto")
    assert half.transformer.wte.weight.dtype == torch.bfloat16
    assert torch.equal(half.transformer.wte.weight, model.transformer.wte.weight.bfloat16())


# ------------------------------------------------------------ model.keras again
@pytest.mark.slow
def test_keras_model_exports_again_from_its_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "torch")  # before keras is imported, as amptrain does
    keras = pytest.importorskip("keras")
    from amptrain.common.errors import UserError

    keras.utils.set_random_seed(0)
    keras.Sequential([keras.Input((64,)), keras.layers.Dense(10, name="out")]).save(
        tmp_path / "m.keras")
    out = _train(tmp_path, f"keras:{tmp_path / 'm.keras'}", "digits")
    out_dir, written = export_checkpoint(out, "keras", tmp_path / "again")
    assert written == [out_dir / "model.keras"]
    trained = keras.saving.load_model(out / "model.keras")
    again = keras.saving.load_model(out_dir / "model.keras")
    for a, b in zip(trained.weights, again.weights):
        assert torch.equal(torch.as_tensor(a.numpy()), torch.as_tensor(b.numpy()))
    with pytest.raises(UserError, match="dtype bf16: a Keras model is exported with fp32"):
        export_checkpoint(out, "keras", tmp_path / "half", dtype="bf16")


def _header(tensors: dict, metadata: dict) -> bytes:
    header = json.dumps({"__metadata__": metadata, **tensors}).encode()
    return len(header).to_bytes(8, "little") + header


@pytest.mark.parametrize("content, fragment", [
    (_header({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
             {"amptrain_aliases": json.dumps({"head": "missing"})}) + b"\0" * 8,
     "its amptrain_aliases name tensors the file does not hold"),
    ((10 ** 12).to_bytes(8, "little") + b"{}", "not a readable safetensors file"),
    (_header({"w": {"dtype": "F32", "shape": [1 << 20, 1 << 20],
                    "data_offsets": [0, 8]}}, {}) + b"\0" * 8,
     "not a readable safetensors file"),
], ids=["alias-to-missing", "oversized-header", "shape-beyond-data"])
def test_a_damaged_safetensors_file_is_one_line(tmp_path, content, fragment):
    path = tmp_path / SAFETENSORS_NAME
    path.write_bytes(content)
    with pytest.raises(UserError, match="damaged") as error:
        load_safetensors(path)
    assert fragment in str(error.value)


def test_an_existing_checkpoint_exports_without_a_trainer(tmp_path, monkeypatch):
    """`amptrain export` reads the run through saved_run's loader: no Trainer is built, and
    the file holds the checkpoint's weights (bf16 on request)."""
    from amptrain.trainer import core
    from tests.workflows.test_saved_run import _mlp_checkpoint

    def refuse(*args, **kwargs):
        raise AssertionError("a Trainer was built")

    monkeypatch.setattr(core.Trainer, "__init__", refuse)
    path, model = _mlp_checkpoint(tmp_path)
    out, written = export_checkpoint(path, "safetensors", tmp_path / "fp32")
    assert written == [out / SAFETENSORS_NAME, out / INFO_NAME]
    _assert_same(load_safetensors(out / SAFETENSORS_NAME), model.state_dict())
    info = json.loads((out / INFO_NAME).read_text())
    assert (info["model"], info["task"], info["source"]) == ("mlp", "classification", path)
    out, _ = export_checkpoint(path, "safetensors", tmp_path / "bf16", dtype="bf16")
    exported = load_safetensors(out / SAFETENSORS_NAME)
    assert all(exported[k].dtype == torch.bfloat16 and torch.equal(exported[k], v.bfloat16())
               for k, v in model.state_dict().items())
