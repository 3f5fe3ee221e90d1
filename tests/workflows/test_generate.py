"""amptrain generate: sampling rules, text from a real trained checkpoint, a GAN's images."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from amptrain.config import RunConfig, build_config
from amptrain.common.errors import UserError
from amptrain.workflows.generate import Sampling, generate_text, sample
from amptrain.workflows.runner import run_training
from tests.tasks.test_lm import write_corpus


class Fixed(nn.Module):
    """Logits that always prefer token (last + 1) % vocab: sampling rules are visible."""

    def __init__(self, vocab: int = 8) -> None:
        super().__init__()
        self.vocab = vocab
        self.calls: list[int] = []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.calls.append(ids.shape[1])
        logits = torch.zeros(*ids.shape, self.vocab)
        logits.scatter_(2, ((ids + 1) % self.vocab).unsqueeze(-1), 10.0)
        return logits


def test_temperature_zero_is_greedy_and_the_context_is_cropped():
    model = Fixed()
    new = sample(model, [3], Sampling(tokens=6, temperature=0), context=4,
                 device=torch.device("cpu"))
    assert new == [4, 5, 6, 7, 0, 1]
    assert max(model.calls) == 4  # never longer than the model's context


def test_sampling_is_seeded_and_top_k_limits_the_choice():
    model = Fixed()
    draw = dict(context=16, device=torch.device("cpu"))
    hot = Sampling(tokens=20, temperature=50.0, seed=3)
    assert sample(model, [0], hot, **draw) == sample(model, [0], hot, **draw)
    assert sample(model, [0], hot, **draw) != sample(model, [0], Sampling(
        tokens=20, temperature=50.0, seed=4), **draw)
    top1 = sample(model, [0], Sampling(tokens=5, temperature=50.0, top_k=1), **draw)
    assert top1 == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("values, flag", [(dict(tokens=0), "--tokens"),
                                          (dict(temperature=-1.0), "--temperature"),
                                          (dict(top_k=0), "--top-k")])
def test_bad_sampling_options_name_the_flag(values, flag):
    with pytest.raises(UserError, match=flag):
        Sampling(**values)


@pytest.mark.slow
def test_generates_from_a_trained_language_model_and_refuses_a_classifier(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt")
    config = build_config(RunConfig, {
        "model": "gpt:layers=2,heads=2,width=64", "data": f"text:{corpus}", "seq_len": 32,
        "batch_size": 16, "lr": 3e-3, "max_steps": 150, "warmup_steps": 10,
        "no_progress": True, "device": "cpu", "out": str(tmp_path / "lm")})
    run_training(config)
    text = generate_text(str(tmp_path / "lm"), "alpha ", Sampling(tokens=60, temperature=0))
    words = text.replace(".", " ").split()
    known = {"alpha", "beta", "gamma", "delta", "omega", "kappa"}
    # Greedy continuation of a learnt text: mostly the corpus's words.
    assert sum(w in known for w in words) >= 0.7 * len(words), text
    classifier = build_config(RunConfig, {"model": "mlp", "data": "digits", "max_steps": 2,
                                          "no_progress": True, "out": str(tmp_path / "cls")})
    run_training(classifier)
    with pytest.raises(UserError, match="holds a classification model; generate needs a "
                                        "language model"):
        generate_text(str(tmp_path / "cls"), "x")


# ------------------------------------------------------------------ GAN images
def _checkpoint(path, spec: str, inputs, task: dict, model: nn.Module) -> str:
    """A checkpoint with the sections `amptrain train` writes (model, run, task)."""
    from dataclasses import asdict

    from amptrain.checkpoint import FORMAT, FORMAT_VERSION, atomic_save

    state = {"format": FORMAT, "format_version": FORMAT_VERSION, "step": 0, "epoch": 0,
             "window_in_epoch": 0, "config": {},
             "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
             "task": task, "run": {"model": spec, "data": "digits", "class_names": None,
                                   "inputs": asdict(inputs), "data_fitted": {},
                                   "task": task["name"]}}
    atomic_save(state, path)
    return str(path)


def _gan_checkpoint(tmp_path) -> tuple[str, nn.Module]:
    from amptrain.models import ModelInputs, build_model
    from amptrain.tasks import GanTask

    spec, inputs = "dcgan:width=8,latent=8", ModelInputs(10, (1, 8, 8))
    torch.manual_seed(0)
    model = build_model(spec, inputs)
    model.set_output_range([-0.75], [1.75])
    for m in model.modules():  # running statistics a trained model would have
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
    task = {"name": "gan", **GanTask(value_range=[[-0.75], [1.75]]).state()}
    return _checkpoint(tmp_path / "gan.pt", spec, inputs, task, model), model


def test_generate_writes_a_gans_samples_and_grid(tmp_path):
    from PIL import Image

    from amptrain.workflows.generate import generate_images
    from amptrain.tasks.imagegrid import to_uint8

    path, model = _gan_checkpoint(tmp_path)
    files = generate_images(path, 5, str(tmp_path / "out"), seed=3, device="cpu",
                            precision="32-true")
    assert [f.name for f in files] == [f"sample_0000{i}.png" for i in range(5)] + ["grid.png"]
    model.eval()
    with torch.no_grad():
        expected = to_uint8(model.sample(5, torch.Generator().manual_seed(3)), -0.75, 1.75)
    for i, f in enumerate(files[:5]):
        with Image.open(f) as img:
            assert img.mode == "L" and img.size == (8, 8)
            assert (np.asarray(img) == expected[i, :, :, 0]).all()
    with Image.open(files[-1]) as img:
        assert img.size == ((3 * (8 + 2) + 2) * 8, (2 * (8 + 2) + 2) * 8)
    again = generate_images(path, 5, str(tmp_path / "again"), seed=3, device="cpu",
                            precision="32-true")
    other = generate_images(path, 5, str(tmp_path / "other"), seed=4, device="cpu",
                            precision="32-true")
    assert again[0].read_bytes() == files[0].read_bytes() != other[0].read_bytes()


def test_generate_loads_the_run_without_a_trainer_and_asks_the_task(tmp_path, monkeypatch):
    """generate reads the run through saved_run's loader (no Trainer) and asks the task
    what it generates (Task.offers.generates): a GAN draws images, and refuses a prompt."""
    from amptrain.workflows.generate import generate_images
    from amptrain.tasks import GanTask, Offers
    from amptrain.trainer import core

    def refuse(*args, **kwargs):
        raise AssertionError("a Trainer was built")

    monkeypatch.setattr(core.Trainer, "__init__", refuse)
    path, _ = _gan_checkpoint(tmp_path)
    files = generate_images(path, 2, str(tmp_path / "out"), device="cpu", precision="bf16-mixed")
    assert [f.name for f in files] == ["sample_00000.png", "sample_00001.png", "grid.png"]
    with pytest.raises(UserError, match="holds a GAN: generate images with --samples N"):
        generate_text(path, "x", device="cpu")
    # What the refusal says follows the task's declaration, not its name.
    monkeypatch.setattr(GanTask, "offers", Offers(generates=None, eval_learn_split="train"))
    with pytest.raises(UserError, match="holds a gan model; generate needs a language model"):
        generate_text(path, "x", device="cpu")
    with pytest.raises(UserError, match="--samples draws images from a GAN; --checkpoint .* "
                                        "holds a gan model"):
        generate_images(path, 2, str(tmp_path / "none"), device="cpu")


def test_generate_samples_from_the_command_line_and_its_refusals(tmp_path, capsys):
    from amptrain.cli import main
    from amptrain.models import ModelInputs, build_model

    gan, _ = _gan_checkpoint(tmp_path)
    assert main(["generate", "--checkpoint", gan, "--samples", "3", "--out",
                 str(tmp_path / "imgs"), "--device", "cpu"]) == 0
    assert "wrote 3 images and grid.png" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "imgs").iterdir()) == [
        "grid.png", "sample_00000.png", "sample_00001.png", "sample_00002.png"]

    inputs = ModelInputs(10, (1, 8, 8))
    classifier = _checkpoint(tmp_path / "cls.pt", "mlp", inputs, {"name": "classification"},
                             build_model("mlp", inputs))
    refusals = [
        (["--checkpoint", classifier, "--samples", "3", "--out", str(tmp_path / "x")],
         "--samples draws images from a GAN; --checkpoint .* holds a classification model"),
        (["--checkpoint", gan, "--samples", "3"], "--samples writes image files: give --out DIR"),
        (["--checkpoint", gan, "--samples", "0", "--out", str(tmp_path / "x")],
         "--samples must be an integer from 1"),
        (["--checkpoint", gan, "--out", str(tmp_path / "x")], "give --samples N"),
        (["--checkpoint", gan, "--prompt", "hi"], "holds a GAN: generate images with --samples"),
    ]
    for args, message in refusals:
        assert main(["generate", *args, "--device", "cpu"]) == 2, args
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and re.search(message, err), err
    assert not (tmp_path / "x").exists()


# ----------------------------------------------------------------- issue 36, class 3
@pytest.mark.parametrize("user_file", ["grid.png", "sample_00001.png"])
def test_generate_never_replaces_a_users_image_and_says_so_before_drawing(tmp_path, capsys,
                                                                          user_file):
    from amptrain.cli import main

    gan, _ = _gan_checkpoint(tmp_path)
    out = tmp_path / "mine"
    out.mkdir()
    (out / user_file).write_bytes(b"the user's own picture")
    assert main(["generate", "--checkpoint", gan, "--samples", "3", "--out", str(out),
                 "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"already holds {user_file}" in err, err
    assert sorted(p.name for p in out.iterdir()) == [user_file]  # nothing drawn into it
    assert (out / user_file).read_bytes() == b"the user's own picture"


def test_generate_onto_a_file_or_a_fifo_is_one_line(tmp_path, capsys):
    import os

    from amptrain.cli import main

    gan, _ = _gan_checkpoint(tmp_path)
    (tmp_path / "a_file").write_text("x")
    os.mkfifo(tmp_path / "pipe")
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "grid.png")
    for target, message in ((tmp_path / "a_file", "is a file, not a directory"),
                            (tmp_path / "pipe", "is a FIFO (named pipe), not a directory"),
                            (out, "grid.png is a FIFO")):
        assert main(["generate", "--checkpoint", gan, "--samples", "2", "--out", str(target),
                     "--device", "cpu"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
    assert (tmp_path / "a_file").read_text() == "x"
