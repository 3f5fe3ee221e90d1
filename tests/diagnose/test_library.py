"""diagnose/library.py: amptrain.diagnose_model on one's own model and batches, and an own
loop's halt that names the module and points there (issue 49)."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import amptrain
from amptrain import Precision
from amptrain.diagnose.run import diagnose
from amptrain.precision import NonFiniteHalt
from tests.conftest import tiny_classification
from tests.diagnose.conftest import bundle, config, scaled_model


def _batches(n: int = 4, size: int = 32):
    data = tiny_classification(n=n * size)
    x, y = data.tensors
    return [(x[i * size:(i + 1) * size], y[i * size:(i + 1) * size]) for i in range(n)]


def test_diagnose_model_gives_the_clis_report_for_ones_own_model_and_batches(tmp_path,
                                                                          capsys):
    def loss_fn(outputs, targets):
        return nn.functional.cross_entropy(outputs.float(), targets)

    model = scaled_model(1e5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = amptrain.diagnose_model(model, _batches(), steps=3, loss_fn=loss_fn,
                                     device="cpu", batch_size=32, scheduler="none",
                                     out=tmp_path / "diag")
    first = report["first_nonfinite"]
    assert (first["module"], first["phase"]) == ("amplify", "forward")
    assert "amplify" in [k["pattern"] for k in report["recommendations"]["keep_fp32"]]
    assert report["recommendations"]["verified"]["clean"]
    # the report amptrain diagnose writes: the same keys as the CLI's function makes
    cli_like = diagnose(config(), steps=3, data=bundle(), model=scaled_model(1e5))
    assert set(report) == set(cli_like)
    assert json.loads((tmp_path / "diag" / "diagnose.json").read_text())["steps"] == 3
    assert "amplify" in capsys.readouterr().out  # the summary, printed
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_an_own_loops_halt_names_the_module_and_the_library_entry_point():
    model = scaled_model(1e6)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    prec = Precision("16-mixed", init_scale=2.0 ** 4, min_scale=1.0)
    model, optimizer = prec.setup(model, optimizer)
    with pytest.raises(NonFiniteHalt) as halted:
        for x, y in _batches(n=20):
            with prec.autocast():
                loss = nn.functional.cross_entropy(model(x), y)
            prec.backward(loss)
            prec.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
    message = str(halted.value)
    assert "First non-finite value: module 'amplify' (forward, on the last batch)" in message
    assert "amptrain.diagnose_model(model, train_data, loss_fn=...)" in message
    assert "amptrain diagnose`" not in message
    prec.teardown()
    assert not model._forward_pre_hooks  # the kept-inputs hook goes with teardown


def test_a_precision_plan_is_diagnosed_beside_the_fixed_runs(tmp_path, capsys):
    from collections import OrderedDict

    from amptrain.common.errors import UserError

    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(inp=nn.Linear(8, 32), act=nn.Tanh(),
                                      mid=nn.Linear(32, 32), out=nn.Linear(32, 3)))
    plan = tmp_path / "plan.yaml"
    plan.write_text("layers:\n  mid: mxfp4\n  out: bf16\n")
    name = f"plan:{plan}"
    report = amptrain.diagnose_model(model, _batches(), steps=3, device="cpu", batch_size=32,
                                     scheduler="none", precision=name)
    assert report["asked_precision"] == name
    assert set(report["runs"]) == {"32-true", "16-mixed", "16-mixed-recommended",
                                   "bf16-mixed", name}
    run = report["runs"][name]
    assert run["steps"] == 3 and run["skipped_steps"] == 0 and run["halted"] is None
    assert f"{name}: no non-finite values in 3 steps" in capsys.readouterr().out
    # a fixed run asked for adds nothing; a malformed plan is one line naming the format
    assert amptrain.diagnose_model(model, _batches(), steps=1, device="cpu", batch_size=32,
                                   precision="16-mixed", quiet=True)["asked_precision"] is None
    plan.write_text("layers:\n  mid: mxfp5\n")
    with pytest.raises(UserError, match="mxfp5"):
        amptrain.diagnose_model(model, _batches(), steps=1, device="cpu", batch_size=32,
                                precision=name, quiet=True)
