"""amptrain.report.load: reading a study back from disk, and number formatting."""
from __future__ import annotations

import json

import pytest

from amptrain.report.load import (
    _COLOURS,
    _SPARE,
    Curves,
    Study,
    _num,
    human_bytes,
    load_study,
    read_curves,
)


@pytest.mark.parametrize("n, text", [
    (None, "n/a"), (0, "0 B"), (512, "512 B"), (1536, "1.5 KiB"), (3 * 2 ** 30, "3.0 GiB"),
    (2 ** 50, "1024.0 TiB"),  # TiB is the largest unit
])
def test_human_bytes(n, text):
    assert human_bytes(n) == text


def test_num_formats_or_says_not_available():
    assert _num(None, ".2f", " ms") == "n/a"
    assert _num(1234.5, ",.0f") == "1,234"
    assert _num(1.5, ".2f", "×") == "1.50×"


def test_read_curves_splits_train_and_eval_records(tiny_study, tmp_path):
    scaled = read_curves(tiny_study / "runs" / "16-mixed" / "seed-0" / "metrics.jsonl")
    assert scaled.steps == list(range(1, 9))
    assert scaled.loss == pytest.approx([2.0 / s for s in range(1, 9)])
    assert scaled.loss_scale == [65536.0] * 4 + [32768.0] * 4
    assert (scaled.val_steps, scaled.val_primary) == ([8], [0.9])
    unscaled = read_curves(tiny_study / "runs" / "32-true" / "seed-1" / "metrics.jsonl")
    assert unscaled.loss_scale == [None] * 8  # logged without a loss scale
    assert read_curves(tmp_path / "missing.jsonl") == Curves()


def test_load_study_reads_every_run_and_tolerates_missing_details(tiny_study, tmp_path):
    study = load_study(tiny_study)
    assert study.out == tiny_study and study.baseline == "32-true"
    assert study.precisions == ["32-true", "16-mixed"]
    assert study.summary == json.loads((tiny_study / "compare.json").read_text())["summary"]
    assert study.details["memory_method"] == "hand-written numbers"
    assert {p: sorted(seeds) for p, seeds in study.curves.items()} == \
        {"32-true": [0, 1], "16-mixed": [0, 1]}
    # No study.json, no "dir" in a run: details are empty, the run is found at its default path.
    bare = tmp_path / "bare"
    (bare / "runs" / "32-true" / "seed-3").mkdir(parents=True)
    (bare / "runs" / "32-true" / "seed-3" / "metrics.jsonl").write_text(
        '{"step": 1, "loss": 1.0}\n\n{"step": 1, "val_acc": 0.5}\n')
    (bare / "compare.json").write_text(json.dumps({
        "baseline": "32-true", "summary": [{"precision": "32-true"}],
        "runs": [{"precision": "32-true", "seed": 3}]}))
    study = load_study(str(bare))
    assert study.details == {}
    assert study.curves == {"32-true": {3: Curves([1], [1.0], [None], [1], [0.5])}}


def test_colours_are_stable_and_unknown_precisions_take_spares():
    study = Study(out=None, details={}, curves={}, compare={
        "baseline": "32-true",
        "summary": [{"precision": p} for p in ("32-true", "mine", "16-mixed", "yours")]})
    assert study.colour("32-true") == _COLOURS["32-true"]
    assert study.colour("16-mixed") == _COLOURS["16-mixed"]
    assert [study.colour("mine"), study.colour("yours")] == _SPARE[:2]
    assert study.colour("not-in-study") == "#333"
