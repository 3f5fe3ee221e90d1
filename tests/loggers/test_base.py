"""loggers/base.py: the interface every tracker implements, and the numbers a record holds."""
from __future__ import annotations

import importlib
import inspect

import pytest

from amptrain.loggers import SINKS
from amptrain.loggers.base import Sink, numbers


def test_numbers_keeps_the_numeric_fields_but_step_as_floats():
    record = {"step": 10, "epoch": 1, "loss": 0.5, "lr": 1e-3, "val_acc": None,
              "halted": False, "precision": "bf16-mixed", "samples": 64}
    got = numbers(record)
    assert got == {"epoch": 1.0, "loss": 0.5, "lr": 1e-3, "samples": 64.0}
    assert all(type(v) is float for v in got.values())
    assert numbers({"step": 3}) == {}


def test_a_sink_must_implement_log_and_may_ignore_images_and_close():
    sink = Sink()
    with pytest.raises(NotImplementedError):
        sink.log({"step": 1, "loss": 0.1})
    assert sink.images(1, {"samples": object()}) is None
    assert sink.close() is None and sink.name == "sink"


@pytest.mark.parametrize("name", sorted(SINKS))
def test_every_registered_tracker_is_a_sink_with_its_own_log(name):
    module = importlib.import_module(f"amptrain.loggers.{SINKS[name]}")
    sinks = [c for _, c in inspect.getmembers(module, inspect.isclass)
             if issubclass(c, Sink) and c is not Sink]
    assert sinks, f"{name}: no Sink subclass"
    assert all(c.log is not Sink.log for c in sinks)
    assert callable(module.create)
