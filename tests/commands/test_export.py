"""``amptrain export``: an existing run's checkpoint as safetensors (the CLI in process, one
real subprocess for the exit code); refusals are one line and exit 2: a format the model
lacks, an output that exists already (never overwritten), a ``module:`` factory that no
longer imports (named)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from amptrain.cli import main
from amptrain.config import RunConfig, build_config
from amptrain.workflows.export import INFO_NAME, SAFETENSORS_NAME, load_safetensors
from amptrain.workflows.runner import run_training
from amptrain.workflows.saved_run import load_run

from .helpers import amptrain


def _train(out: Path, model: str = "mlp") -> Path:
    run_training(build_config(RunConfig, {
        "model": model, "data": "digits", "out": str(out), "max_steps": 1, "batch_size": 8,
        "no_progress": True, "precision": "32-true"}))
    return out


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory) -> Path:
    return _train(tmp_path_factory.mktemp("mlp") / "run")


def _weights(run: Path, name: str = "last.pt") -> dict[str, torch.Tensor]:
    return load_run(str(run / "checkpoints" / name))[0]["model"]


def test_writes_a_checkpoint_and_never_overwrites(mlp_run, tmp_path, capsys):
    assert main(["export", "--checkpoint", str(mlp_run / "checkpoints" / "step-1.pt"),
                 "--format", "safetensors", "--out", str(tmp_path / "x")]) == 0
    assert "model.safetensors, model.json" in capsys.readouterr().out
    exported = load_safetensors(tmp_path / "x" / SAFETENSORS_NAME)
    expected = _weights(mlp_run, "step-1.pt")
    assert set(exported) == set(expected)
    assert all(torch.equal(exported[k], v) for k, v in expected.items())
    assert json.loads((tmp_path / "x" / INFO_NAME).read_text())["source"].endswith("step-1.pt")
    # Again into the same place: refused, the files stay as they were.
    before = (tmp_path / "x" / SAFETENSORS_NAME).read_bytes()
    assert main(["export", "--checkpoint", str(mlp_run), "--format", "safetensors",
                 "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "already holds model.safetensors" in err and "Traceback" not in err
    assert (tmp_path / "x" / SAFETENSORS_NAME).read_bytes() == before
    # A user's file of one of those names is left alone too.
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "model.json").write_text("my notes")
    assert main(["export", "--checkpoint", str(mlp_run), "--format", "safetensors",
                 "--out", str(tmp_path / "mine")]) == 2
    assert (tmp_path / "mine" / "model.json").read_text() == "my notes"
    assert not (tmp_path / "mine" / SAFETENSORS_NAME).exists()


def test_default_out_is_beside_the_checkpoints(mlp_run, capsys):
    assert main(["export", "--checkpoint", str(mlp_run), "--format", "safetensors",
                 "--dtype", "bf16"]) == 0
    written = load_safetensors(mlp_run / "export-last" / SAFETENSORS_NAME)
    assert all(t.dtype == torch.bfloat16 for t in written.values() if t.is_floating_point())


def test_a_format_the_model_lacks_is_one_line(mlp_run, tmp_path, capsys):
    assert main(["export", "--checkpoint", str(mlp_run), "--format", "keras",
                 "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err
    assert "--format keras" in err and "mlp cannot be exported as keras" in err
    assert "safetensors" in err and not (tmp_path / "y").exists()


@pytest.mark.slow
def test_a_factory_that_no_longer_imports_is_named(tmp_path, monkeypatch):
    (tmp_path / "gone_models.py").write_text(
        "import torch\n"
        "def build(num_classes, input_shape):\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, num_classes))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run = _train(tmp_path / "run", "module:gone_models.build")
    assert (run / SAFETENSORS_NAME).is_file()
    (tmp_path / "gone_models.py").unlink()
    monkeypatch.delitem(sys.modules, "gone_models")
    done = amptrain("export", "--checkpoint", run, "--format", "safetensors", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "module:gone_models.build" in done.stderr and "cannot import gone_models" in done.stderr
    assert not (run / "export-last").exists()
