"""``amptrain generate`` as a user runs it: train a tiny LM, then continue a prompt."""
from __future__ import annotations

import pytest

from tests.commands.helpers import amptrain
from tests.tasks.test_lm import write_corpus


@pytest.mark.slow
def test_train_eval_and_generate_from_the_command_line(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.txt", repeats=20)
    trained = amptrain("train", "--model", "gpt:layers=1,heads=2,width=32", "--data",
                       f"text:{corpus}", "--seq-len", "32", "--batch-size", "16", "--max-steps",
                       "20", "--no-progress", "--device", "cpu", "--out", tmp_path / "lm")
    assert trained.returncode == 0, trained.stderr
    assert "done: val_perplexity" in trained.stdout and "tokens/s" in trained.stdout
    assert "task lm" in trained.stderr  # the banner names a task other than classification
    evaluated = amptrain("eval", "--checkpoint", tmp_path / "lm", "--out", tmp_path / "ev",
                         "--no-progress", "--device", "cpu")
    assert evaluated.returncode == 0, evaluated.stderr
    assert evaluated.stdout.startswith("perplexity ") and "lm_report.txt" in evaluated.stdout
    generated = amptrain("generate", "--checkpoint", tmp_path / "lm", "--prompt", "alpha",
                         "--tokens", "30", "--top-k", "5", "--seed", "1", "--device", "cpu")
    assert generated.returncode == 0, generated.stderr
    assert generated.stdout.startswith("alpha") and len(generated.stdout) > len("alpha") + 10
    again = amptrain("generate", "--checkpoint", tmp_path / "lm", "--prompt", "alpha",
                     "--tokens", "30", "--top-k", "5", "--seed", "1", "--device", "cpu")
    assert again.stdout == generated.stdout  # seeded


@pytest.mark.slow
def test_regression_train_and_eval_from_the_command_line(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 4)).astype(np.float32)
    y = (x @ np.array([2.0, -1.0, 0.5, 0.0]) * 5 + 20 + rng.normal(size=600) * 0.1)
    np.savez(tmp_path / "lin.npz", x=x, y=y.astype(np.float32))
    trained = amptrain("train", "--model", "mlp", "--data", f"npz:{tmp_path / 'lin.npz'}",
                       "--epochs", "8", "--lr", "3e-3", "--loss", "huber", "--no-progress",
                       "--device", "cpu", "--out", tmp_path / "reg")
    assert trained.returncode == 0, trained.stderr
    assert "done: val_rmse" in trained.stdout and "val_r2" in trained.stdout
    evaluated = amptrain("eval", "--checkpoint", tmp_path / "reg", "--out", tmp_path / "ev",
                         "--no-progress", "--device", "cpu", "--precision", "32-true")
    assert evaluated.returncode == 0, evaluated.stderr
    assert evaluated.stdout.startswith("RMSE ") and "regression_report.txt" in evaluated.stdout
    rmse = float(evaluated.stdout.split()[1])
    assert rmse < 0.1 * float(y.std())  # learnt, in the data's own units
    assert (tmp_path / "ev" / "eval" / "regression_report.txt").is_file()
