"""--logger mlflow: a local file store under DIR/mlruns, read back with MLflow's own client
(metrics per step, the config as params, the run finished); a resumed run continues it."""
from __future__ import annotations

import io

import pytest

pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient  # noqa: E402

from amptrain.config import RunConfig, build_config  # noqa: E402
from amptrain.trainer.logs import RunLogger
from amptrain.loggers.mlflow_sink import EXPERIMENT, flat_params  # noqa: E402
from amptrain.workflows.runner import run_training


def _run(client: MlflowClient):
    experiment = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    return runs[0]


def _history(client, run, key):
    return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]


@pytest.mark.slow
def test_a_training_run_is_read_back_with_mlflows_client(tmp_path):
    out = tmp_path / "run"
    run_training(build_config(RunConfig, {
        "model": "mlp", "data": "digits", "out": str(out), "max_steps": 4, "log_every": 2,
        "batch_size": 16, "no_progress": True, "precision": "32-true",
        "logger": "mlflow,csv"}))
    assert not (out / "tb").exists()  # only the trackers asked for
    client = MlflowClient(tracking_uri=(out / "mlruns").as_uri())
    run = _run(client)
    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert [step for step, _ in _history(client, run, "loss")] == [2, 4]
    assert _history(client, run, "val_acc")[0][0] == 4
    assert 0 <= _history(client, run, "val_acc")[0][1] <= 1
    assert run.data.params["model"] == "mlp" and run.data.params["precision"] == "32-true"


def test_a_resumed_run_continues_the_same_mlflow_run(tmp_path):
    first = RunLogger(tmp_path, progress=False, stream=io.StringIO(), loggers="mlflow",
                      params={"lr": 0.1, "section": {"inner": [1, 2]}})
    first.log({"step": 1, "epoch": 0, "loss": 1.0, "note": "text", "loss_scale": None})
    first.close()
    again = RunLogger(tmp_path, progress=False, stream=io.StringIO(), loggers="mlflow",
                      resumed_at=1)
    again.log({"step": 2, "epoch": 0, "loss": 0.5})
    again.close()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    run = _run(client)
    assert _history(client, run, "loss") == [(1, 1.0), (2, 0.5)]
    assert run.data.params == {"lr": "0.1", "section.inner": "[1, 2]"}
    assert "note" not in run.data.metrics and "loss_scale" not in run.data.metrics


def test_flat_params():
    assert flat_params({"a": {"b": 1, "c": None}, "d": "x" * 600}) == {"a.b": "1", "d": "x" * 500}
