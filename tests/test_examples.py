"""The examples under examples/ run and do what their docstrings say."""
from __future__ import annotations

import runpy
import warnings
from pathlib import Path

import pytest

from amptrain.common.errors import UserError

EXAMPLES = Path(__file__).parents[1] / "examples"


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["--precision", "16-mixed", "--separate-loss-scales"],
                                  ["--precision", "bf16-mixed"]])
def test_the_gan_loop_trains_both_models_and_reports_per_optimizer(argv, capsys):
    main = runpy.run_path(str(EXAMPLES / "gan_loop.py"))["main"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # an emulated mode says so
            result = main([*argv, "--steps", "80", "--print-every", "40"])
    except UserError as error:
        pytest.skip(f"{argv[1]} on this machine: {error}")
    out = capsys.readouterr().out
    assert result["distance"] < 0.75 * result["first_distance"]   # G moved towards the ring
    lines = [line for line in out.splitlines() if line.startswith("step")]
    assert len(lines) == 2
    assert "skipped D 0 G 0" in lines[-1] and "d_loss" in lines[-1] and "g_loss" in lines[-1]
    scales = "loss scale 4096, 4096" if "--separate-loss-scales" in argv else "loss scale none"
    assert scales in lines[-1]


# ------------------------------------------------ examples from the field (issue 49)
def _cli(argv: list[str]) -> int:
    from amptrain import cli

    try:
        return cli.main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


MNIST_CLI = ["train", "--model", "module:mnist_trainer:Net", "--data",
             "module:mnist_trainer:digits28", "--batch-size", "64", "--optimizer", "Adadelta",
             "--scheduler", "StepLR", "--scheduler-args", '{"step_size": 1, "gamma": 0.7}',
             "--precision", "32-true", "--seed", "1", "--no-progress"]


def test_the_mnist_recipe_runs_through_the_trainer_and_the_cli(tmp_path, monkeypatch, capsys):
    main = runpy.run_path(str(EXAMPLES / "mnist_trainer.py"))["main"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        main(1, "32-true", max_steps=2, no_progress=True)
    assert "your scheduler steps once per epoch" in capsys.readouterr().err
    monkeypatch.chdir(EXAMPLES)  # module:mnist_trainer is found in the working directory
    assert _cli([*MNIST_CLI, "--max-steps", "2", "--out", str(tmp_path / "cli")]) == 0
    assert "scheduler StepLR steps once per epoch" in capsys.readouterr().err


@pytest.mark.slow
def test_the_mnist_recipe_reaches_its_accuracy_through_the_trainer_and_the_cli(
        tmp_path, monkeypatch):
    """Adadelta + StepLR per epoch: 3 epochs of the 14 on the upsampled digits (measured
    on the shared 2-core AMD EPYC, AVX2: 0.972 through the Trainer, 0.914 through the CLI,
    whose data factory splits with the run's seed; docs/examples.md has the 14 epochs).
    Stepped per optimizer step, the LR fell to 1e-50 and the model stopped at 56 % (issue
    49). Deterministic on one machine class; the margins are for other CPUs' kernels."""
    import json

    main = runpy.run_path(str(EXAMPLES / "mnist_trainer.py"))["main"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(3, "32-true", no_progress=True) > 0.94
    monkeypatch.chdir(EXAMPLES)
    out = tmp_path / "cli"
    assert _cli([*MNIST_CLI, "--epochs", "3", "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [r for r in records if "val_acc" in r][-1]["val_acc"] > 0.88


def test_the_nanogpt_port_matches_its_original_lines_in_32_true_and_trains_in_bf16():
    main = runpy.run_path(str(EXAMPLES / "nanogpt" / "train.py"))["main"]
    original = main("none", 4, eval_interval=2, eval_iters=2)
    ported = main("32-true", 4, eval_interval=2, eval_iters=2)
    assert ported["train_loss"] == original["train_loss"]  # bit for bit
    assert ported["val"] == original["val"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # emulated bf16 says so
        bf16 = main("bf16-mixed", 4, eval_interval=2, eval_iters=2)
    assert bf16["skipped"] == 0
    assert all(abs(a - b) < 0.01 for a, b in zip(bf16["val"], original["val"]))


def test_the_cleanrl_ppo_port_has_the_originals_returns_in_32_true():
    main = runpy.run_path(str(EXAMPLES / "cleanrl_ppo.py"))["main"]
    original = main("none", 512, num_steps=32)
    ported = main("32-true", 512, num_steps=32)
    assert ported["episode_returns"] == original["episode_returns"]  # episode by episode
    assert len(original["episode_returns"]) > 10
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bf16 = main("bf16-mixed", 512, num_steps=32)
    assert bf16["skipped"] == 0 and bf16["episode_returns"]
