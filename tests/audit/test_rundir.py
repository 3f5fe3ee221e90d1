"""``amptrain audit RUN_DIR``: a run directory written here (config.yaml, numerics.jsonl in
the numerics telemetry's schema), read back through the command."""
from __future__ import annotations

import json

import pytest

from amptrain import cli
from amptrain.audit.rundir import audit_run_dir
from amptrain.common.errors import UserError


def _record(step, module, tensor, flushed, saturated, whatif):
    return {"step": step, "module": module, "tensor": tensor, "format": "fp16", "amax": 3.5,
            "flushed": flushed, "saturated": saturated, "whatif": whatif}


def _whatif(fp8_flushed, fp8_snr):
    return {"bf16": {"flushed": 0.0, "saturated": 0.0, "snr_db": 48.0},
            "fp8-e4m3": {"flushed": fp8_flushed, "saturated": 0.0, "snr_db": fp8_snr},
            "mxfp4": {"flushed": 0.3, "saturated": 0.0, "snr_db": 9.0}}


@pytest.fixture
def run_dir(tmp_path):
    (tmp_path / "config.yaml").write_text("precision: 16-mixed\nweight_update: plain\nlr: 0.001\n")
    records = [_record(10, "fc1", "gradient", 0.002, 0.0, _whatif(0.0, 30.0)),
               _record(10, "head", "gradient", 0.04, 0.0, _whatif(0.001, 25.0)),
               _record(20, "head", "gradient", 0.12, 0.0, _whatif(0.002, 24.0)),
               _record(20, "fc1", "activation", 0.0, 0.0005, _whatif(0.0, 31.0))]
    (tmp_path / "numerics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path


def test_the_numbers_of_a_run_are_audited(run_dir):
    report, has_numerics = audit_run_dir(run_dir)
    assert has_numerics and report.steps == 2
    found = {f.kind: f for f in report.findings}
    assert list(found) == ["flush-to-zero", "saturation", "whatif-fits"]
    flush = found["flush-to-zero"]
    assert flush.where == "head" and "1 sampled module tensors" in flush.detail
    assert "head gradient 12.00 % at step 20" in flush.detail   # the worst step, not the first
    assert "fc1 activation 0.05 % at step 20" in found["saturation"].detail
    fits = found["whatif-fits"]
    assert fits.severity == "info"
    assert "bf16 (worst SNR 48.0 dB), fp8-e4m3 (worst SNR 24.0 dB)" in fits.detail
    assert "mxfp4" not in fits.detail


def test_the_command_prints_and_writes_json(run_dir, tmp_path_factory, capsys):
    out = tmp_path_factory.mktemp("json") / "audit.json"
    assert cli.main(["audit", "--json", str(out), str(run_dir)]) == 0   # warnings only
    printed = capsys.readouterr().out
    assert "2 warnings, 1 info (2 sampled steps in numerics.jsonl)" in printed
    assert [f["kind"] for f in json.loads(out.read_text())["findings"]] == \
        ["flush-to-zero", "saturation", "whatif-fits"]


def test_without_numerics_the_config_alone_is_audited_and_said_so(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("precision: bf16-true\nweight_update: plain\n")
    assert cli.main(["audit", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "has no numerics.jsonl" in printed and "audited its config.yaml alone" in printed
    assert "warning: update-below-ulp at precision bf16-true" in printed


def test_a_directory_that_is_no_run_and_a_broken_line_are_refused(tmp_path, run_dir):
    with pytest.raises(UserError, match="holds no config.yaml"):
        audit_run_dir(tmp_path / "nothing")
    with open(run_dir / "numerics.jsonl", "a") as f:
        f.write("{not json\n")
    with pytest.raises(UserError, match="line 5 is not JSON"):
        audit_run_dir(run_dir)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_run_the_trainer_wrote_is_audited_with_options_after_the_directory(tmp_path, capsys):
    from amptrain.trainer import Trainer
    from tests.conftest import tiny_classification, tiny_mlp

    run = tmp_path / "run"
    Trainer(precision="16-mixed", batch_size=16, max_steps=4, log_every=2, no_progress=True,
            device="cpu", numerics="2", out=run).fit(tiny_mlp(), tiny_classification())
    report, has_numerics = audit_run_dir(run)
    assert has_numerics and report.steps == 2            # steps 2 and 4 were sampled
    assert "whatif-fits" in {f.kind for f in report.findings}
    out = tmp_path / "audit.json"
    assert cli.main(["audit", str(run), "--json", str(out)]) == 0   # options after RUN_DIR
    assert "2 sampled steps in numerics.jsonl" in capsys.readouterr().out
    assert json.loads(out.read_text())["findings"]
    assert cli.main(["audit", str(run), "extra"]) == 2
    assert "takes no further words (got 'extra')" in capsys.readouterr().err
