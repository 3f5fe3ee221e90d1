"""The verdict's tolerance (amptrain/tolerance.py): given, else the task's own default,
else the shared default; the reports read it back for studies that did not record it."""
from __future__ import annotations

from amptrain.tasks import ClassificationTask, GanTask, LanguageModelTask
from amptrain.common.tolerance import SHARED_TOLERANCES, tolerance_for


def test_given_then_the_tasks_default_then_the_shared_one():
    gan = tolerance_for(GanTask(), None)
    assert (gan.value, gan.option, gan.source) == (0.25, "tolerance_rel", "task")
    assert "gan task's default" in gan.why
    assert tolerance_for(GanTask(), 0.1).source == "given"
    assert tolerance_for(LanguageModelTask(), None).value == SHARED_TOLERANCES["tolerance_rel"]
    # A value equal to the shared default is read as the default (old studies record it).
    shared = tolerance_for(ClassificationTask(), SHARED_TOLERANCES["tolerance_pp"])
    assert (shared.value, shared.source) == (0.5, "shared")
