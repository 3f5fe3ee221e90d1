"""``amptrain plan``: a planted sensitive layer is the one kept out, the budget cuts the
search short (an injected clock), and compare takes the plan as a row."""
from __future__ import annotations

import json
import warnings

import pytest
import yaml

from amptrain import cli
from amptrain.commands.compare import emulated_plans
from amptrain.common.errors import AmptrainWarning, UserError, forget_warnings
from amptrain.compare.options import PlanOptions
from amptrain.compare.precision_plan import run_plan
from amptrain.config import RunConfig, build_config

#: A model with four eligible Linear layers (64x32, then 32x32). ``sensitive``'s input
#: carries a 1e5 spike in its one 32-value block (channel 0, whose weights are held at
#: zero): bf16 keeps every other value, but the block scale the spike sets flushes them
#: all in mxfp4.
PLANTED = '''
import torch
from torch import nn


class Planted(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.inp, self.a = nn.Linear(64, 32), nn.Linear(32, 32)
        self.sensitive, self.b = nn.Linear(32, 32), nn.Linear(32, 32)
        self.head = nn.Linear(32, num_classes)
        keep = torch.ones(32)
        keep[0] = 0
        self.register_buffer("keep", keep)
        self.register_buffer("spike", (1 - keep) * 1e5)
        with torch.no_grad():
            self.sensitive.weight.mul_(keep)

    def forward(self, x):
        h = torch.tanh(self.a(torch.tanh(self.inp(x.flatten(1)))))
        with torch.no_grad():   # the spike's weights stay zero: it adds nothing in bf16
            self.sensitive.weight.mul_(self.keep)
        h = torch.tanh(self.sensitive(h * self.keep + self.spike))
        return self.head(torch.tanh(self.b(h)))


def build(num_classes):
    return Planted(num_classes)
'''

_TRAIN = ["--model", "module:planted.build", "--data", "digits", "--max-steps", "20",
          "--batch-size", "32", "--lr", "0.02", "--device", "cpu", "--no-progress"]


@pytest.fixture
def planted(tmp_path, monkeypatch):
    (tmp_path / "planted.py").write_text(PLANTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.slow
def test_the_plan_keeps_the_planted_sensitive_layer_and_only_it_out(planted, capsys):
    code = cli.main(["plan", "--precision", "mxfp4", *_TRAIN, "--probe-steps", "3",
                     "--tolerance-pp", "15", "--out", "out"])
    assert code == 0
    plan = yaml.safe_load((planted / "out" / "precision-plan.yaml").read_text())
    assert plan["layers"] == {"inp": "mxfp4", "a": "mxfp4", "sensitive": "bf16",
                              "b": "mxfp4"}
    assert plan["lowbit_flops_share"] == pytest.approx(4096 / 5120, abs=1e-4)
    report = json.loads((planted / "out" / "plan.json").read_text())
    assert report["ranking"][-1]["name"] == "sensitive"   # ranked the most sensitive
    assert report["ranking"][-1]["flushed"] > 0.9
    # its loss probe stands out of the others' (about 20x their median) and plan.md says so
    assert [r["loss_outlier"] for r in report["ranking"]] == [False, False, False, True]
    assert "(stands out: ranked last)" in (planted / "out" / "plan.md").read_text()
    # every layer in mxfp4 was tried and refused; the plan's own set was run and accepted
    first = report["search"][0]
    assert len(first["layers"]) == 4 and first["verdict"] == "worse"
    assert report["plan"]["verdict"] == "ok" and report["cut_short"] is None
    assert all(e["same_start"] for e in report["search"])
    # no MXFP4 hardware on an H100; on a B200 the Linear GEMMs could run faster (an estimate)
    assert report["speed_estimate"]["H100"] is None
    assert report["speed_estimate"]["B200"] > 1
    assert [e["verdict"] for e in plan["evidence"]] == [e["verdict"] for e in report["search"]]
    printed = capsys.readouterr().out
    assert "3 of 4 eligible Linear layers in mxfp4 (80 % of their matmul FLOPs)" in printed
    # the plan trains as --precision plan:FILE
    assert cli.main(["train", "--precision", "plan:out/precision-plan.yaml", *_TRAIN,
                     "--max-steps", "2", "--out", "trained"]) == 0


class StepClock:
    """A clock that moves 100 s each time it is read."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 100.0
        return self.now


def test_the_time_budget_stops_the_search_and_the_reports_say_so(planted):
    config = build_config(RunConfig, {"model": "module:planted.build", "data": "digits",
                                      "max_steps": 2, "device": "cpu", "no_progress": True,
                                      "precision": "mxfp4", "out": str(planted / "out")},
                          source="option")
    options = PlanOptions(probe_steps=1, budget_time=150.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AmptrainWarning)
        report = run_plan(config, options, clock=StepClock())
    # read at the start (100), before the baseline's run (200: 100 s spent) and before the
    # first candidate's (300: 200 s spent, over the 150): the search stops with no layer
    assert report["search"] == [] and report["plan"]["layers_in_format"] == 0
    assert report["cut_short"] == "budget_time 150 s spent (200.0 s)"
    assert "The search was cut short: budget_time 150 s" in \
        (planted / "out" / "plan.md").read_text()
    assert report["budget"]["steps_spent"] == 2   # the baseline's run only


def test_the_low_bit_options_reach_the_candidates_not_the_probe_or_the_baseline(planted):
    """--mx-scale chooses the candidates' MX scales: the probe's 32-true run and the
    baseline's bf16-mixed runs take no low-bit option, so neither warns that it does
    nothing there."""
    forget_warnings()   # warn() speaks once per process: an earlier test may have spoken
    config = build_config(RunConfig, {"model": "module:planted.build", "data": "digits",
                                      "max_steps": 2, "device": "cpu", "no_progress": True,
                                      "precision": "mxfp4", "mx_scale": "rceil",
                                      "out": str(planted / "out")}, source="option")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AmptrainWarning)
        # the clock allows the baseline's run and the first candidate's (see StepClock)
        report = run_plan(config, PlanOptions(probe_steps=1, budget_time=250.0),
                          clock=StepClock())
    assert report["budget"]["steps_spent"] == 4 and len(report["search"]) == 1
    assert [str(w.message) for w in caught if "does nothing" in str(w.message)] == []
    runs = planted / "out" / "search" / "runs"
    saved = sorted((p.parent.parent.name.startswith("plan-"),
                    yaml.safe_load(p.read_text())["mx_scale"])
                   for p in runs.glob("*/seed-0/config.yaml"))
    assert saved == [(False, "floor"), (True, "rceil")]   # the baseline's, the candidate's


def test_plan_refuses_a_format_that_is_not_low_bit_and_an_out_that_holds_a_plan(planted):
    config = build_config(RunConfig, {"model": "module:planted.build", "data": "digits",
                                      "precision": "bf16-mixed", "device": "cpu",
                                      "out": str(planted / "o")}, source="option")
    with pytest.raises(UserError, match="plan searches for a low-bit format"):
        run_plan(config, PlanOptions())
    (planted / "held").mkdir()
    (planted / "held" / "precision-plan.yaml").write_text("a: mxfp4\n")
    with pytest.raises(UserError):
        run_plan(config.with_options(precision="mxfp4", out=str(planted / "held")),
                 PlanOptions())
    assert (planted / "held" / "precision-plan.yaml").read_text() == "a: mxfp4\n"


def test_compare_takes_a_plan_as_a_row_with_its_lowbit_flops_share(planted, capsys):
    (planted / "p.yaml").write_text("a: mxfp4\nb: mxfp4\n")
    code = cli.main(["compare", "--precisions", "bf16-mixed,plan:p.yaml", "--baseline",
                     "bf16-mixed", "--bench-steps", "1", "--timing-warmup", "0",
                     "--batch-size", "16", "--model", "module:planted.build", "--data",
                     "digits", "--device", "cpu", "--out", "study"])
    assert code == 0
    assert "plan:p.yaml (emulated)" in capsys.readouterr().out   # mxfp4 has no CPU hardware
    rows = {r["precision"]: r for r in
            json.loads((planted / "study" / "compare.json").read_text())["summary"]}
    assert rows["bf16-mixed"]["lowbit_flops_share"] == 0.0
    # a and b: 2 x 32x32 of the 64x32 + 3 x 32x32 + 32x10 multiply-adds per token
    assert rows["plan:p.yaml"]["lowbit_flops_share"] == pytest.approx(
        2 * 1024 / (2048 + 3 * 1024 + 320))


def test_env_says_which_formats_of_a_plan_are_native_here(planted, capsys):
    (planted / "p.yaml").write_text("a: mxfp4\nb: fp8-rowwise\nsensitive: bf16\n")
    assert cli.main(["env", "--json", "--precision", "plan:p.yaml"]) == 0
    info = json.loads(capsys.readouterr().out)
    # on this CPU nothing low-bit is native (fp8 needs an sm89+ GPU, mxfp4 Blackwell)
    assert info["precision_plan"] == {"plan": "p.yaml",
                                      "formats": {"mxfp4": False, "fp8-rowwise": False}}
    assert cli.main(["env", "--precision", "bf16-mixed"]) == 2
    assert "env --precision takes a precision plan" in capsys.readouterr().err


def test_diagnose_takes_a_plan_and_runs_it_from_the_same_weights(planted, capsys):
    (planted / "p.yaml").write_text("a: mxfp4\nb: mxfp4\n")
    code = cli.main(["diagnose", "--precision", "plan:p.yaml", "--steps", "2",
                     "--batch-size", "16", "--model", "module:planted.build", "--data",
                     "digits", "--device", "cpu", "--no-progress", "--out", "diag"])
    assert code == 0
    assert "plan:p.yaml: no non-finite values in 2 steps" in capsys.readouterr().out
    runs = json.loads((planted / "diag" / "diagnose.json").read_text())["runs"]
    given = runs["plan:p.yaml"]
    assert given["precision"] == "plan:p.yaml" and given["steps"] == 2
    # a bad plan stops before any run, naming the flag
    (planted / "bad.yaml").write_text("nope: mxfp4\n")
    assert cli.main(["diagnose", "--precision", "plan:bad.yaml", "--steps", "1",
                     "--model", "module:planted.build", "--data", "digits",
                     "--device", "cpu", "--out", "diag2"]) == 2
    assert "no module 'nope'" in capsys.readouterr().err


def test_compare_marks_a_plan_row_emulated_under_device_auto(tmp_path):
    # --device's default is "auto": the rows' device is resolved from it, not passed to
    # torch as it is (compare crashed after its runs with torch's "device string: auto")
    plan = tmp_path / "p.yaml"
    plan.write_text("a: mxfp4\n")
    rows = ["bf16-mixed", f"plan:{plan}"]
    assert emulated_plans(rows, "auto") == emulated_plans(rows, "cpu") == {f"plan:{plan}"}
