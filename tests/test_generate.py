"""amptrain generate: sampling rules, and text from a real trained checkpoint."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from amptrain.config import RunConfig, build_config
from amptrain.errors import UserError
from amptrain.generate import Sampling, generate_text, sample
from amptrain.runner import run_training
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
