"""The ``amptrain`` command as a user runs it: real subprocesses of ``python -m amptrain``.

(a) bad invocations exit 2 with one line on stderr and no traceback; (b) ``--config``
with flag overrides, and the resolved config.yaml read back gives the same config;
(c) the main job trains ``cnn`` on ``digits`` in bf16-mixed to >= 90% and writes every
output; (d) ``eval`` on its checkpoint; (e) ``--help``.
"""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def amptrain(*args: str, cwd: Path | None = None, timeout: float = 300
             ) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "amptrain", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------- (a) errors
def bad_inputs(root: Path) -> dict[str, Path]:
    """One malformed file (or folder) of each kind, written in its real format."""
    idx = root / "idx"
    idx.mkdir()
    (idx / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x01" + b"\x00" * 20)  # label magic
    (idx / "train-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x01\x07")
    cifar = root / "cifar"
    cifar.mkdir()
    (cifar / "data_batch_1").write_bytes(pickle.dumps(["not", "a", "dict"]))
    images = root / "images"
    for name in ("a", "b"):
        (images / name).mkdir(parents=True)
        (images / name / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    csv = root / "nolabel.csv"
    csv.write_text("text,sentiment\ngood,pos\nbad,neg\n")
    npz = root / "bad.npz"
    np.savez(npz, x=np.zeros((4, 3)))
    bad_yaml = root / "bad.yaml"
    bad_yaml.write_text("epochs: [3,\n")
    checkpoint = root / "corrupt.pt"
    checkpoint.write_bytes(b"PK\x03\x04 truncated")
    existing = root / "existing"
    existing.mkdir()
    (existing / "metrics.jsonl").write_text("{}\n")
    return {"idx": idx, "cifar": cifar, "images": images, "csv": csv, "npz": npz,
            "yaml": bad_yaml, "checkpoint": checkpoint, "existing": existing}


# (id, arguments with {placeholders} for bad_inputs(), a fragment the message must contain)
ERROR_TABLE = [
    ("unknown-model", "train --model resnet101", "unknown --model 'resnet101'"),
    ("unknown-data", "train --data mnist", "unknown --data 'mnist'"),
    ("unknown-precision", "train --precision fp12", "unknown --precision 'fp12'"),
    ("missing-path", "train --data npz:{root}/missing.npz", "no such file"),
    ("bad-idx-magic", "train --data idx:{idx}", "magic number 0x00000801, expected 0x00000803"),
    ("cifar-not-a-dict", "train --data cifar10:{cifar}", "not the dict of a CIFAR batch"),
    ("undecodable-image", "train --data imagefolder:{images}", "cannot decode image"),
    ("csv-without-label", "train --data csv-text:{csv}", "columns text and label"),
    ("npz-without-y", "train --data npz:{npz}", "needs arrays named x and y"),
    ("accumulate-0", "train --accumulate 0", "--accumulate must be an integer >= 1"),
    ("micro-batch-word", "train --micro-batch-size big", "--micro-batch-size must be a positive"),
    ("micro-batch-indivisible", "train --batch-size 64 --micro-batch-size 10",
     "--micro-batch-size 10 does not divide"),
    ("unknown-flag", "train --warp-speed 9", "unrecognized arguments: --warp-speed"),
    ("bad-choice", "train --optimizer adam", "argument --optimizer: invalid choice"),
    ("bad-number", "train --epochs three", "argument --epochs: invalid int value"),
    ("bad-yaml", "train --config {yaml}", "not valid YAML at line"),
    ("unknown-yaml-key", "train --config {root}/typo.yaml", "unknown option --epoch"),
    ("resume-auto-without-out", "train --resume auto", "--resume auto needs --out"),
    ("keep-fp32-matches-nothing", "train --keep-fp32 *.attention --out {root}/k",
     "--keep-fp32 '*.attention' matches no module"),
    ("model-data-mismatch", "train --model lstm --data digits", "needs token sequences"),
    ("transformer-bad-heads", "train --model transformer:heads=3 --data synthetic-seq:samples=8",
     "not divisible by heads 3"),
    ("lr-scaling-without-base", "train --lr-scaling linear", "needs --base-batch-size"),
    ("out-holds-a-run", "train --out {existing}", "already holds a run"),
    ("eval-missing-checkpoint", "eval --checkpoint {root}/none.pt --out {root}/e", "no such file"),
    ("eval-corrupt-checkpoint", "eval --checkpoint {checkpoint} --out {root}/e",
     "truncated (its end is missing"),
    ("eval-without-checkpoint", "eval --out {root}/e", "required: --checkpoint"),
    ("timm-not-installed", "train --model timm:resnet18", "pip install timm"),
]


@pytest.fixture(scope="module")
def error_runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Run the whole table concurrently (each is a Python start-up, mostly waiting)."""
    root = tmp_path_factory.mktemp("bad")
    paths = {k: str(v) for k, v in bad_inputs(root).items()}
    (root / "typo.yaml").write_text("epoch: 3\n")
    work = tmp_path_factory.mktemp("cwd")  # nothing may land in the repository's runs/

    def run(case):
        name, args, _ = case
        argv = [a.format(root=root, **paths) for a in args.split()]
        return name, amptrain(*argv, "--no-progress",
                              cwd=work)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(run, ERROR_TABLE))


@pytest.mark.slow
@pytest.mark.parametrize("name,args,fragment", ERROR_TABLE, ids=[c[0] for c in ERROR_TABLE])
def test_bad_invocation_is_one_line_exit_2(error_runs, name, args, fragment):
    if name == "timm-not-installed" and _importable("timm"):
        pytest.skip("timm is installed here")
    result = error_runs[name]
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and lines[0].startswith("amptrain: error: ")
    assert fragment in lines[0]
    assert result.stdout == ""


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


# ------------------------------------------------------- (b) config round trip
@pytest.mark.slow
def test_config_file_flag_override_and_round_trip(tmp_path):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({
        "model": "mlp", "data": "digits", "precision": "bf16-mixed", "epochs": 5,
        "max-steps": 4, "batch_size": 32, "accumulate": 2, "lr": 0.01, "keep_fp32": ["head"],
        "scheduler": "none", "seed": 3}))
    first = tmp_path / "first"
    result = amptrain("train", "--config", tmp_path / "run.yaml", "--epochs", "1", "--seed", "4",
                      "--out", first, "--no-progress", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load((first / "config.yaml").read_text())
    assert resolved["epochs"] == 1 and resolved["seed"] == 4        # the flags won
    assert resolved["lr"] == 0.01 and resolved["keep_fp32"] == ["head"]  # the file's values
    assert (resolved["model"], resolved["batch_size"], resolved["max_steps"]) == ("mlp", 32, 4)
    assert (resolved["micro_batch_size"], resolved["accumulate"]) == (16, 2)  # derived
    assert resolved["precision"] == "bf16-mixed" and resolved["out"] == str(first)

    second = tmp_path / "second"
    again = amptrain("train", "--config", first / "config.yaml", "--out", second, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    reread = yaml.safe_load((second / "config.yaml").read_text())
    assert reread == {**resolved, "out": str(second)}
    # Same config, same seed: the same training, step for step.
    losses = [[r["loss"] for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())
               if "loss" in r] for d in (first, second)]
    assert losses[0] == losses[1] and len(losses[0]) == 1


# ---------------------------------------------- (c, d) the main job, then eval
@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("main") / "run"
    result = amptrain("train", "--model", "cnn", "--data", "digits", "--precision", "bf16-mixed",
                      "--epochs", "3", "--out", out, cwd=out.parent)
    return out, result


@pytest.mark.slow
def test_main_job_reaches_90_percent_and_writes_every_output(digits_run):
    out, result = digits_run
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads((out / "eval" / "report.json").read_text())
    assert report["accuracy"] >= 0.90
    assert f"val_acc {report['accuracy']:.4f}" in result.stdout and str(out) in result.stdout
    for name in ("config.yaml", "metrics.jsonl", "checkpoints/last.pt",
                 "eval/classification_report.txt", "eval/report.json"):
        assert (out / name).is_file(), name
    assert list((out / "tb").glob("events.out.tfevents.*"))
    assert "macro avg" in (out / "eval" / "classification_report.txt").read_text()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert train and set(train[0]) >= {"step", "epoch", "loss", "lr", "loss_scale", "grad_norm",
                                       "skipped_steps", "samples_per_s", "peak_mem_bytes"}
    assert records[-1]["val_acc"] == pytest.approx(report["accuracy"])
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["precision"] == "bf16-mixed" and config["model"] == "cnn"


@pytest.mark.slow
def test_eval_of_the_checkpoint(digits_run, tmp_path):
    out, trained = digits_run
    assert trained.returncode == 0, trained.stderr
    result = amptrain("eval", "--checkpoint", out / "checkpoints" / "last.pt", "--data", "digits",
                      "--precision", "bf16-mixed", "--out", tmp_path / "ev", "--no-progress",
                      cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "checkpoint trained with bf16-mixed" in result.stdout
    report = json.loads((tmp_path / "ev" / "eval" / "report.json").read_text())
    trained_report = json.loads((out / "eval" / "report.json").read_text())
    # The same validation split and weights; only the batch size of evaluation differs.
    assert report["accuracy"] == pytest.approx(trained_report["accuracy"], abs=0.01)
    assert (tmp_path / "ev" / "eval" / "classification_report.txt").is_file()


# ------------------------------------------------------------------- (e) help
def test_help():
    result = amptrain("--help")
    assert result.returncode == 0 and "train" in result.stdout and "eval" in result.stdout
    train = amptrain("train", "--help")
    assert train.returncode == 0
    for flag in ("--precision", "--model", "--data", "--config", "--keep-fp32", "--accumulate"):
        assert flag in train.stdout


def test_user_errors_of_other_ranks_say_which_rank(monkeypatch, capsys):
    # Under torchrun every process reports its own error; one write per line keeps the
    # processes' lines whole, and the rank tells the copies apart.
    from amptrain import cli

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert cli.main(["train", "--accumulate", "0", "--no-progress"]) == 2
    assert capsys.readouterr().err == ("amptrain[rank 3]: error: --accumulate must be an "
                                       "integer >= 1 (got 0)\n")
    monkeypatch.setenv("RANK", "0")
    assert cli.main(["train", "--accumulate", "0", "--no-progress"]) == 2
    assert capsys.readouterr().err.startswith("amptrain: error: --accumulate")
