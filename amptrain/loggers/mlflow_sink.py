"""MLflow tracking in a local file store, ``DIR/mlruns`` (``--logger mlflow``): nothing to
start, read with ``MlflowClient(tracking_uri="file:DIR/mlruns")`` or ``mlflow ui
--backend-store-uri DIR/mlruns``.

Needs ``mlflow-skinny`` (``pip install 'amptrain[mlflow]'``): the client and the file store
without the server's dependencies. MLflow 3 keeps the file store in maintenance mode
behind ``MLFLOW_ALLOW_FILE_STORE=true``, which is set for this process unless the user
set it. One MLflow run per amptrain run (experiment ``amptrain``, run name = the run
directory's name, the resolved config as params); a resumed run continues it.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ..common.errors import UserError
from .base import Sink, numbers

STORE = "mlruns"
EXPERIMENT = "amptrain"
#: The tag that finds a run directory's MLflow run again on resume.
OUT_TAG = "amptrain.out"
#: MLflow refuses longer param values.
_PARAM_LIMIT = 500


def _client(out: Path) -> Any:
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise UserError("--logger mlflow needs mlflow: pip install 'amptrain[mlflow]' "
                        "(mlflow-skinny is enough)") from None
    return MlflowClient(tracking_uri=(out / STORE).resolve().as_uri())


def flat_params(params: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config sections as ``section.option`` -> value text (MLflow params)."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flat_params(value, name + "."))
        elif value is not None:
            flat[name] = str(value)[:_PARAM_LIMIT]
    return flat


class MLflowSink(Sink):
    name = "mlflow"

    def __init__(self, out: Path, resumed_at: int | None = None,
                 params: dict[str, Any] | None = None) -> None:
        from mlflow.entities import Param

        self._client = _client(out)
        experiment = self._client.get_experiment_by_name(EXPERIMENT)
        experiment_id = experiment.experiment_id if experiment is not None \
            else self._client.create_experiment(EXPERIMENT)
        tag = str(Path(out).resolve())
        earlier = self._client.search_runs(
            [experiment_id], filter_string=f"tags.`{OUT_TAG}` = '{tag}'", max_results=1) \
            if resumed_at is not None else []
        if earlier:
            self.run_id = earlier[0].info.run_id
            self._client.update_run(self.run_id, status="RUNNING")
        else:
            run = self._client.create_run(experiment_id, run_name=Path(out).resolve().name,
                                          tags={OUT_TAG: tag})
            self.run_id = run.info.run_id
            self._client.log_batch(self.run_id, params=[
                Param(k, v) for k, v in flat_params(params or {}).items()])

    def log(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        step = int(record["step"])
        metrics = [Metric(key, value, now, step) for key, value in numbers(record).items()
                   if key != "epoch"]
        if metrics:
            self._client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def create(out: Path, *, resumed_at: int | None, params: dict[str, Any]) -> Sink:
    return MLflowSink(out, resumed_at, params)
