"""``hf:PATH``: a Hugging Face sequence classifier from a local directory, fine-tuned on a
CSV with its own tokenizer, in 32-true, bf16-mixed and 16-mixed; evaluated from its
checkpoint; fp8 emulated on a CPU. Everything is written by the tests: a tiny,
randomly initialised BERT and a WordPiece tokenizer built from a word list (no network).
"""
from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from amptrain.trainer.windows import DatasetWindows, SampleOrder
from amptrain.config import RunConfig
from amptrain.data import DataOptions, TokenData, build_data
from amptrain.common.errors import UserError
from amptrain.models import ModelInputs, build_model, text_encoder_for
from amptrain.workflows.runner import model_inputs, data_and_model, run_training
from amptrain.trainer import Trainer

ROOT = Path(__file__).parents[2]
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
needs_transformers = pytest.mark.skipif(
    not HAS_TRANSFORMERS, reason="transformers is not installed (pip install 'amptrain[hf]')")


def _example():
    """examples/tiny_hf_model.py: the tiny BERT and review CSV that docs/hf-fp8.md and
    docs/export.md use too."""
    spec = importlib.util.spec_from_file_location("tiny_hf_model",
                                                  ROOT / "examples" / "tiny_hf_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """(model directory, CSV path) written once for the module."""
    if not HAS_TRANSFORMERS:
        pytest.skip("transformers is not installed")
    root = tmp_path_factory.mktemp("hf")
    example = _example()
    return (example.write_tiny_bert(root / "tiny-bert"),
            example.write_reviews_csv(root / "reviews.csv"))


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "amptrain", *args], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=300)


def _no_dropout(model: nn.Module) -> nn.Module:
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    return model


# ------------------------------------------------------------------ loading
@needs_transformers
def test_loads_the_local_model_with_a_new_head_for_the_data(local, caplog):
    model_dir, _ = local
    inputs = ModelInputs(num_classes=3, input_shape=(32,), kind="sequence", vocab_size=20)
    with caplog.at_level(logging.INFO, logger="amptrain"):
        model = build_model(f"hf:{model_dir}", inputs)
    assert type(model).__name__ == "BertForSequenceClassification"
    assert model.classifier.out_features == 3 and model.config.num_labels == 3
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert "classifier.bias, classifier.weight" in caplog.text and "3 classes" in caplog.text
    # The saved encoder weights are loaded, not re-initialised.
    from safetensors.torch import load_file
    saved = load_file(str(model_dir / "model.safetensors"))
    key = next(k for k in saved if k.endswith("word_embeddings.weight"))
    assert torch.equal(model.bert.embeddings.word_embeddings.weight, saved[key])


@needs_transformers
def test_missing_or_wrong_directories_are_user_errors(local, tmp_path):
    inputs = ModelInputs(2, (16,), "sequence", 20)
    with pytest.raises(UserError, match="no such directory.*local directories only"):
        build_model(f"hf:{tmp_path / 'nope'}", inputs)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="not a Hugging Face model directory"):
        build_model(f"hf:{tmp_path / 'empty'}", inputs)
    with pytest.raises(UserError, match="needs a directory"):
        build_model("hf:", inputs)
    model_dir, _ = local
    with pytest.raises(UserError, match="classifies token sequences"):
        build_model(f"hf:{model_dir}", ModelInputs(2, (1, 8, 8), "image"))
    with pytest.raises(UserError, match="vocabulary has"):
        build_model(f"hf:{model_dir}", ModelInputs(2, (16,), "sequence", vocab_size=5000))


@needs_transformers
def test_csv_text_is_tokenised_by_the_models_tokenizer(local):
    model_dir, csv_path = local
    encoder = text_encoder_for(f"hf:{model_dir}")
    bundle = build_data(f"csv-text:{csv_path}", DataOptions(text_encoder=encoder))
    assert isinstance(bundle.train, TokenData) and isinstance(bundle.val, TokenData)
    assert bundle.fitted == {"class_names": ["negative", "positive"],
                             "tokenizer": f"hf:{model_dir}", "max_len": 64}
    assert bundle.vocab_size == len(encoder.tokenizer) and bundle.input_shape == (64,)
    sample = bundle.train[0]
    length = int(sample["attention_mask"].sum())
    ids = sample["input_ids"][:length].tolist()
    cls, sep = encoder.tokenizer.cls_token_id, encoder.tokenizer.sep_token_id
    assert ids[0] == cls and ids[-1] == sep and encoder.tokenizer.unk_token_id not in ids
    assert (sample["input_ids"][length:] == encoder.pad_id).all()
    # Without the model's tokenizer the built-in one (its own vocabulary) is used.
    plain = build_data(f"csv-text:{csv_path}", DataOptions())
    assert "vocabulary" in plain.fitted and not isinstance(plain.train, TokenData)


@needs_transformers
def test_micro_batches_are_dicts_padded_to_their_longest_sequence(local):
    model_dir, csv_path = local
    bundle = build_data(f"csv-text:{csv_path}",
                        DataOptions(text_encoder=text_encoder_for(f"hf:{model_dir}")))
    data = bundle.train
    plan = SampleOrder(len(data), 32, 8, seed=0)
    widths = set()
    for window in DatasetWindows(data, plan, torch.device("cpu")).epoch(0):
        for batch, n in zip(window.micro_batches, window.micro_samples):
            assert set(batch) == {"input_ids", "attention_mask", "labels"}
            assert len(batch["labels"]) == n
            width = batch["input_ids"].shape[1]
            widths.add(width)
            longest = int(batch["attention_mask"].sum(1).max())
            assert width % 16 == 0 and longest <= width < longest + 16   # no real token cut
            assert batch["attention_mask"].shape == batch["input_ids"].shape
    assert max(widths) < 64   # never the file's max_len: short reviews stay short
    data.pad_multiple = 1
    index = [0, 1, 2]
    assert data.select(index)["input_ids"].shape[1] == int(data.lengths[index].max())


@needs_transformers
def test_accumulation_equals_one_batch_k_times_larger(local):
    """4 micro-batches padded to their own lengths give the step of one batch of 16."""
    model_dir, csv_path = local
    config = RunConfig.from_options(model=f"hf:{model_dir}", data=f"csv-text:{csv_path}")
    steps = {}
    for accumulate in (1, 4):
        data, model = data_and_model(config)
        data.train.pad_multiple = 1           # micro-batches get different widths
        first = next(SampleOrder(len(data.train), 16, 16 // accumulate).epoch(0))
        widths = {data.train.width_of(idx) for idx in first.micro_indices}
        assert accumulate == 1 or len(widths) > 1
        trainer = Trainer(precision="32-true", device="cpu", batch_size=16,
                          accumulate=accumulate, max_steps=2, optimizer="sgd", lr=0.5,
                          momentum=0.0, weight_decay=0.0, scheduler="none", no_progress=True)
        trainer.fit(_no_dropout(model), data.train)
        steps[accumulate] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for name, value in steps[1].items():
        torch.testing.assert_close(steps[4][name], value, rtol=1e-5, atol=1e-6, msg=name)


# ------------------------------------------------------------- fine-tuning
@needs_transformers
@pytest.mark.slow
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-mixed"])
def test_fine_tunes_in_each_precision(local, tmp_path, precision):
    model_dir, csv_path = local
    config = RunConfig.from_options(model=f"hf:{model_dir}", data=f"csv-text:{csv_path}",
                                    precision=precision, device="cpu", epochs=4, batch_size=16,
                                    lr=3e-3, no_progress=True, out=str(tmp_path / precision))
    result = run_training(config)
    assert result.precision == precision and result.skipped_steps == 0
    losses = [r["loss"] for r in result.history if "loss" in r]
    assert losses[-1] < 0.5 * losses[0], losses
    assert result.val_metrics["acc"] >= 0.9, result      # two classes: chance is 0.5


@needs_transformers
@pytest.mark.slow
def test_train_then_eval_the_checkpoint_from_the_command_line(local, tmp_path):
    model_dir, csv_path = local
    out = tmp_path / "run"
    trained = _cli("train", "--model", f"hf:{model_dir}", "--data", f"csv-text:{csv_path}",
                   "--precision", "16-mixed", "--epochs", "4", "--batch-size", "16",
                   "--lr", "3e-3", "--device", "cpu", "--no-progress", "--out", str(out))
    assert trained.returncode == 0, trained.stderr
    assert "newly initialised for 2 classes" in trained.stderr
    # Only amptrain speaks: no load report from transformers, no import warnings from
    # torchao (which from_pretrained imports when the fp8 extra is installed).
    foreign = [line for line in trained.stderr.splitlines()
               if line and not line.startswith(("amptrain: ", "epoch ", "done: ", "outputs: "))]
    assert not foreign, foreign
    state = torch.load(out / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)
    assert state["run"]["model"] == f"hf:{model_dir}"
    assert state["run"]["data_fitted"]["tokenizer"] == f"hf:{model_dir}"
    assert "bert.encoder.layer.0.attention.self.query.weight" in state["model"]
    assert all(v.dtype == torch.float32 for v in state["model"].values() if v.is_floating_point())
    evaluated = _cli("eval", "--checkpoint", str(out / "checkpoints" / "last.pt"),
                     "--precision", "bf16-mixed", "--device", "cpu", "--no-progress",
                     "--out", str(tmp_path / "eval"))
    assert evaluated.returncode == 0, evaluated.stderr
    accuracy = float(evaluated.stdout.split("accuracy ")[1].split()[0])
    assert accuracy >= 0.9 and "trained with 16-mixed" in evaluated.stdout
    # The head is the trained one from the checkpoint: no "newly initialised" notice.
    assert "newly initialised" not in evaluated.stderr
    assert (tmp_path / "eval" / "eval" / "classification_report.txt").is_file()


@needs_transformers
def test_hf_model_on_synthetic_token_data(local):
    model_dir, _ = local
    data = build_data("synthetic-seq:samples=64,length=12,vocab=17,classes=2", DataOptions())
    model = build_model(f"hf:{model_dir}", model_inputs(data))
    trainer = Trainer(precision="bf16-mixed", device="cpu", batch_size=16, max_steps=2,
                      no_progress=True)
    result = trainer.fit(model, data.train, data.val)
    assert result.steps == 2 and result.val_loss is not None


@needs_transformers
def test_a_pickled_weights_file_or_remote_code_never_runs(local, tmp_path):
    # A model directory whose pytorch_model.bin is a pickle with a payload, or whose
    # config names Python files to import (auto_map): refused, nothing runs.
    import json
    import shutil

    marker = tmp_path / "PWNED"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    pickled = shutil.copytree(local[0], tmp_path / "pickled")
    (pickled / "model.safetensors").unlink()
    torch.save({"bert.embeddings.word_embeddings.weight": Payload()},
               pickled / "pytorch_model.bin")
    remote = shutil.copytree(local[0], tmp_path / "remote")
    config = json.loads((remote / "config.json").read_text())
    config["auto_map"] = {"AutoModelForSequenceClassification": "planted.Model",
                          "AutoConfig": "planted.Config"}
    (remote / "config.json").write_text(json.dumps(config))
    (remote / "planted.py").write_text(f"open({str(marker)!r}, 'w')\n")
    inputs = ModelInputs(num_classes=2, input_shape=(16,), kind="sequence", vocab_size=50)
    with pytest.raises(UserError, match="holds pickled Python objects, not only tensors"):
        build_model(f"hf:{pickled}", inputs)
    try:
        build_model(f"hf:{remote}", inputs)  # loads the model's own classes, or refuses
    except UserError:
        pass
    assert not marker.exists()


# ------------------------------------------------------- causal language models
@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    """(causal LM directory, text file) written once: a tiny GPT-2 and text in its words."""
    if not HAS_TRANSFORMERS:
        pytest.skip("transformers is not installed")
    root = tmp_path_factory.mktemp("gpt2")
    text = "the movie was really good and the plot was great\n" \
           "the film is boring and the acting was awful\n"
    corpus = root / "reviews.txt"
    corpus.write_text(text * 150)
    return _example().write_tiny_gpt2(root / "tiny-gpt2", [text] * 20), corpus


@needs_transformers
@pytest.mark.slow
def test_causal_lm_fine_tunes_on_text_with_its_own_tokenizer(tiny_gpt2, tmp_path):
    from amptrain.config import build_config
    from amptrain.workflows.generate import Sampling, generate_text
    from amptrain.models.hf import CausalLMLogits

    model_dir, corpus = tiny_gpt2
    config = build_config(RunConfig, {
        "model": f"hf:{model_dir}", "data": f"text:{corpus}", "seq_len": 32, "batch_size": 16,
        "lr": 3e-3, "max_steps": 80, "epochs": 50, "warmup_steps": 5, "eval_every": 40,
        "device": "cpu",
        "precision": "bf16-mixed", "no_progress": True, "out": str(tmp_path / "run")})
    data, model = data_and_model(config)
    assert isinstance(model, CausalLMLogits) and model.context == 64
    assert data.fitted["tokenizer"] == f"hf:{model_dir}" and data.fitted["bytes_per_token"] > 1
    result = run_training(config)
    first, last = [r["val_perplexity"] for r in result.history if "val_perplexity" in r][:2]
    # A randomly initialised model is near-uniform over its ~300 tokens (perplexity ~300);
    # two repeated sentences are easy.
    assert data.vocab_size >= 250 and last <= first and last < 10, (first, last)
    text = generate_text(str(tmp_path / "run"), "the movie", Sampling(tokens=8, temperature=0))
    assert text.strip(), text


@needs_transformers
def test_seq_len_beyond_the_causal_lms_positions_names_the_flag(tiny_gpt2):
    from amptrain.config import build_config

    model_dir, corpus = tiny_gpt2
    config = build_config(RunConfig, {"model": f"hf:{model_dir}", "data": f"text:{corpus}",
                                      "seq_len": 128})
    with pytest.raises(UserError, match="--seq-len 128 is longer than the model's context of "
                                        "64 tokens"):
        data_and_model(config)


# --------------------------------------------------------------------- fp8
@needs_transformers
def test_fp8_is_emulated_on_cpu_with_one_warning_line(local, tmp_path):
    model_dir, csv_path = local
    result = _cli("train", "--model", f"hf:{model_dir}", "--data", f"csv-text:{csv_path}",
                  "--precision", "fp8", "--epochs", "1", "--batch-size", "32", "--device",
                  "cpu", "--no-progress", "--out", str(tmp_path / "fp8"))
    assert result.returncode == 0, result.stderr
    warning = [line for line in result.stderr.splitlines() if "fp8 is emulated" in line]
    assert len(warning) == 1 and warning[0].startswith("amptrain: warning: fp8 is emulated "
                                                       "on this cpu")


# ------------------------------------------------------- without transformers
def test_core_works_without_transformers_and_hf_says_what_to_install(tmp_path):
    script = (
        "import sys; sys.modules['transformers'] = None\n"   # import transformers -> ImportError
        "import amptrain, amptrain.trainer, amptrain.workflows.runner, amptrain.cli\n"
        "from amptrain.models import MODELS, ModelInputs, build_model, text_encoder_for\n"
        "from amptrain.common.errors import UserError\n"
        "assert 'hf' in MODELS and 'amptrain.models.hf' not in sys.modules\n"
        "for call in (lambda: build_model('hf:x', ModelInputs(2, (8,), 'sequence', 10)),\n"
        "             lambda: text_encoder_for('hf:x')):\n"
        "    try:\n"
        "        call()\n"
        "    except UserError as exc:\n"
        "        assert 'pip install transformers' in str(exc), exc\n"
        "    else:\n"
        "        raise AssertionError('no UserError')\n"
        "print('ok')\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@needs_transformers
def test_a_relative_tokenizer_path_is_stored_absolute(local, monkeypatch):
    # A token directory or a run stores the tokenizer's name; generate (or a later train)
    # may start from another directory, where a relative hf:DIR names nothing.
    model_dir, _ = local
    monkeypatch.chdir(model_dir.parent)
    encoder = text_encoder_for(f"hf:{model_dir.name}", option="tokenizer")
    assert encoder.name == f"hf:{model_dir}"
    monkeypatch.chdir("/")
    again = text_encoder_for(encoder.name, option="tokenizer")
    assert len(again.tokenizer) == len(encoder.tokenizer)
