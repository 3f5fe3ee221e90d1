"""The tracker registry: names checked by the config (one line naming --logger)."""
from __future__ import annotations

import pytest

from amptrain.config import TrainConfig, build_config
from amptrain.common.errors import UserError
from amptrain.loggers import SINKS, parse_names


def test_names():
    assert parse_names("tensorboard, MLflow,csv,csv") == ["tensorboard", "mlflow", "csv"]
    assert parse_names("none") == [] and parse_names(["csv"]) == ["csv"]
    assert set(SINKS) == {"tensorboard", "mlflow", "csv"}


@pytest.mark.parametrize("value", ["wandb", "", "none,csv"])
def test_unknown_names_are_refused_by_the_config(value):
    with pytest.raises(UserError, match="logger"):
        build_config(TrainConfig, {"logger": value})


# ----------------------------------------------------------------- issue 36, class 3
def test_a_tracker_whose_package_is_missing_is_named(monkeypatch):
    import sys

    import pytest

    from amptrain.common.errors import UserError, cli_spelling
    from amptrain.loggers import check_installed

    monkeypatch.setitem(sys.modules, "mlflow", None)  # what Python does for "not installed"
    with cli_spelling(), pytest.raises(UserError, match="--logger mlflow needs mlflow, which "
                                                        "is not installed: pip install"):
        check_installed(["tensorboard", "mlflow"])
    check_installed(["csv"])  # nothing to install


def test_without_mlflow_the_run_writes_nothing_before_saying_so(tmp_path):
    # A real process in which mlflow cannot be imported (a sitecustomize marks it missing,
    # as Python does for an uninstalled package): one line, exit 2, and no config.yaml or
    # metrics.jsonl left behind (they were written before the import failed).
    import os
    import subprocess
    import sys

    from tests.commands.helpers import REPO

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['mlflow'] = None\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "amptrain", "train", "--model", "mlp",
                           "--max-steps", "1", "--logger", "tensorboard,mlflow", "--out",
                           str(out), "--no-progress"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("amptrain: error: --logger mlflow needs "
                                                   "mlflow"), done.stderr
    assert not out.exists()
