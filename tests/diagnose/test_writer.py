"""The report writers: diagnose.json and diagnose.md, riskiest modules first."""
from __future__ import annotations

import json

import numpy as np

from amptrain.diagnose.run import diagnose
from amptrain.diagnose.writer import markdown_report, summary_lines, write_reports
from tests.diagnose.conftest import bundle, config, scaled_model


def test_reports_are_written(tmp_path):
    report = diagnose(config(), steps=2, data=bundle(64), model=scaled_model(1e5))
    json_path, md_path = write_reports(report, tmp_path)
    loaded = json.loads(json_path.read_text())
    assert loaded["first_nonfinite"]["module"] == "amplify"
    md = md_path.read_text()
    assert "| `amplify` |" in md
    assert md.index("| `amplify` |") < md.index("| `body.0` |")  # riskiest first


def _stream(abs_max, below=0.0):
    held = {"above_max": 0.0, "below_min_normal": 0.0, "flushed_to_zero": 0.0}
    return {"abs_max": abs_max, "min_nonzero": 1e-3, "bf16": held,
            "fp16": {**held, "below_min_normal": below}}


def _module(kind, risk, reasons, act=None, grad=None):
    return {"type": kind, "leaf": True, "risk": risk, "reasons": reasons, "activation": act,
            "gradient": grad, "param_gradient": None, "fp32_with_recommendations": False}


def hand_built_report() -> dict:
    """The fields the writers read, modules already riskiest first (as diagnose orders them)."""
    fractions = {"above_max": 0.0, "below_min_normal": 0.5, "flushed_to_zero": 0.25}
    return {
        "model": "toy", "data": None, "root": "Net", "steps": 2, "batch_size": 4,
        "device": "cpu",
        "first_nonfinite": {"module": "body.0", "phase": "forward", "step": 1,
                            "loss_scale": 65536.0},
        "runs": {"32-true": {"steps": 2, "skipped_steps": 0, "halted": None},
                 "16-mixed": {"steps": 2, "skipped_steps": 2, "halted": None}},
        "recommendations": {
            "init_scale": 8.0, "keep_fp32": [{"pattern": "body.0", "reason": "it overflows"}],
            "loss_scale": {"reason": "scale reason", "modules_counted": 2,
                           "unscaled": fractions, "scaled": {**fractions, "below_min_normal": 0.0}},
            "flags": "--precision 16-mixed --init-scale 8 --keep-fp32 body.0",
            "verified": {"steps": 2, "skipped_steps": 0},
            "bf16": {"avoids_problem": True, "fp16_problem": True, "reason": "bf16 reason"}},
        "modules": {
            "body.0": _module("Linear", 1100, ["first inf/NaN in 16-mixed (forward, step 1)"],
                              act=_stream(1e6)),
            "body": _module("Sequential", 1000, ["outputs reach 1e+06 > fp16 max"],
                            act=_stream(1e6)),
            "Net": _module("Sequential", 100, ["outputs reach 1e+06 > fp16 max"]),
            "head": _module("Linear", 0, [], act=_stream(np.float32(0.5)),
                            grad=_stream(np.float64(2e-3), below=np.float64(0.5))),
        },
    }


def test_markdown_keeps_the_riskiest_module_first_and_names_a_container_by_its_child():
    report = hand_built_report()
    md = markdown_report(report)
    assert md.startswith("# amptrain diagnose\n")
    rows = [line.split(" | ")[0] for line in md.splitlines() if line.startswith("| `")]
    assert rows == ["| `body.0`", "| `body`", "| `Net`", "| `head`"]
    assert "| 8 (recommended) | 0% | 0% | 25.0% |" in md
    lines = summary_lines(report)
    # Neither the container nor the model repeats its child's problem in the summary.
    assert "riskiest: body.0 (first inf/NaN in 16-mixed (forward, step 1))" in lines
    assert "keep in fp32: body.0 -- it overflows" in lines
    assert all(f"- {line}" in md for line in lines)


def test_json_report_takes_numpy_scalars(tmp_path):
    report = hand_built_report()
    report["modules"]["head"]["gradient"]["values_sampled"] = np.int64(7)
    json_path, md_path = write_reports(report, tmp_path / "new" / "dir")
    head = json.loads(json_path.read_text())["modules"]["head"]
    assert head["gradient"]["values_sampled"] == 7 and head["activation"]["abs_max"] == 0.5
    assert md_path.read_text() == markdown_report(report)
