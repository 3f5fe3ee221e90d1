"""trainer/result.py: what a finished fit reports, and whether its run diverged."""
from __future__ import annotations

import math

import pytest

from amptrain.trainer import FitResult, Trainer
from tests.conftest import tiny_classification, tiny_mlp


def _mlp3():
    return tiny_mlp(features=8, classes=3)


def _result(**values) -> FitResult:
    fields = dict(precision="32-true", steps=10, epochs_completed=1, final_loss=0.5,
                  val_loss=0.6, val_metrics={"acc": 0.8}, skipped_steps=0, samples_per_s=100.0,
                  peak_mem_bytes=1, out=None)
    return FitResult(**{**fields, **values})


@pytest.mark.parametrize("values, bad", [
    ({}, []),
    (dict(val_loss=None, val_metrics={}), []),             # no validation data: nothing to judge
    (dict(final_loss=None), []),                          # no step was logged
    (dict(final_loss=math.nan), ["loss"]),
    (dict(val_loss=math.inf), ["val_loss"]),
    (dict(final_loss=-math.inf, val_loss=math.nan), ["loss", "val_loss"]),
])
def test_nonfinite_metrics_names_the_final_losses_that_diverged(values, bad):
    assert _result(**values).nonfinite_metrics() == bad


def test_accuracy_is_not_a_divergence_sign():
    # A NaN loss makes the accuracy meaningless, but the accuracy itself is never judged.
    assert _result(val_metrics={"acc": math.nan}).nonfinite_metrics() == []


def test_a_diverged_run_says_so(caplog):
    data = tiny_classification(n=200)
    with caplog.at_level("WARNING", logger="amptrain"):
        result = Trainer(no_progress=True, max_steps=12, batch_size=32, precision="32-true",
                         optimizer="sgd", lr=1e30, max_bad_steps=1000).fit(_mlp3(), data, data)
    assert result.nonfinite_metrics()
    assert any("non-finite" in r.getMessage() for r in caplog.records)
