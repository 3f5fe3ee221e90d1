"""The Hugging Face DiagnoseCallback in a real ``transformers.Trainer`` on the CPU: an fp32
run whose layer overflows fp32 is named at its first inf; one whose layer only leaves
fp16's range gets it recommended for fp32 with bf16 as the way out; the loss scale and
skipped steps reach the log history; diagnose.md/.json land in the output directory."""
from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

# Below the importorskips on purpose (E402): without the hf extra the module is skipped
# before amptrain.integrations.hf, which refuses to import without transformers, is reached.
from amptrain.common.errors import UserError  # noqa: E402
from amptrain.integrations.core import check_version  # noqa: E402
from amptrain.integrations.hf import DiagnoseCallback  # noqa: E402

from .models import Overflowing, Rows, dataset  # noqa: E402


class _Bf16(torch.nn.Module):
    """The classifier with its weights in bf16 (a "pure bf16" model, no fp32 master)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Overflowing(1.0).to(torch.bfloat16)

    def forward(self, x, labels=None):
        return self.net(x.to(torch.bfloat16), labels)


def _train(tmp_path, factor: float, steps: int = 6, model=None, **options):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=8,
        use_cpu=True, report_to=[], logging_steps=2, save_strategy="no",
        disable_tqdm=True, learning_rate=1e-3, seed=0)
    callback = DiagnoseCallback(every=2, check_every=2, **options)
    trainer = transformers.Trainer(model=model or Overflowing(factor), args=args,
                                   train_dataset=Rows(dataset()), callbacks=[callback])
    trainer.train()
    return trainer, callback, tmp_path / "out"


def test_names_the_layer_that_overflows_fp32_at_its_first_inf(tmp_path, capsys):
    trainer, callback, out = _train(tmp_path, 1e39, stop_on_nonfinite=True)
    first = callback.session.first
    assert first is not None and (first.module, first.phase, first.step) == ("scale", "forward", 1)
    assert trainer.state.global_step < 6  # stopped at the check after the first inf
    report = json.loads((out / "diagnose.json").read_text())
    assert report["first_nonfinite"]["module"] == "scale"
    assert report["modules"]["scale"]["reasons"][0].startswith("first inf/NaN")
    assert "module 'scale' (forward" in (out / "diagnose.md").read_text()
    assert "module 'scale'" in capsys.readouterr().err


def test_an_fp32_run_says_which_layer_would_overflow_fp16(tmp_path):
    trainer, callback, out = _train(tmp_path, 1e5)
    assert callback.session.first is None
    report = json.loads((out / "diagnose.json").read_text())
    # The layer itself first (then the head it feeds, whose outputs grow as large).
    keep = {k["pattern"]: k["reason"] for k in report["recommendations"]["keep_fp32"]}
    assert list(keep)[0] == "scale" and "above fp16's max" in keep["scale"]
    assert "body" not in keep and "body.0" not in keep
    assert report["recommendations"]["bf16"]["avoids_problem"] is True
    assert report["sampled_steps"] == 3 and report["steps"] == 6
    assert report["precision"] == "32-true" and report["trainer"].startswith("transformers ")
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert logged and all(h["amp_skipped_steps"] == 0 and h["amp_loss_scale"] is None
                          for h in logged)
    md = (out / "diagnose.md").read_text()
    assert "keep in fp32: scale" in md and "| `scale` |" in md
    # transformers' own loop (AdamW, clipping, schedule) in fp32: the audit finds nothing.
    assert callback.session.audit_report.findings == [] and report["audit"] == []


def test_the_audit_finds_a_pure_bf16_model_at_the_end_of_training(tmp_path, capsys):
    trainer, callback, out = _train(tmp_path, 1.0, model=_Bf16())
    kinds = callback.session.audit_report.kinds()
    assert kinds[0] == "half-optimizer-state", kinds
    assert "error: half-optimizer-state at AdamW over net.body.0.weight" in capsys.readouterr().err
    report = json.loads((out / "diagnose.json").read_text())
    assert report["audit"][0]["kind"] == "half-optimizer-state"


def test_bad_options_and_old_versions_are_one_line():
    with pytest.raises(UserError, match="every"):
        DiagnoseCallback(every=0)
    with pytest.raises(UserError, match="unexpected keyword"):
        DiagnoseCallback(evry=3)
    with pytest.raises(UserError, match=r"needs transformers>=4\.40 \(found transformers 4\.30"):
        check_version("transformers", "4.30.2", (4, 40), "DiagnoseCallback")
    check_version("transformers", transformers.__version__, (4, 40), "DiagnoseCallback")


def test_numerics_and_the_first_nonfinite_through_the_callback(tmp_path):
    _, callback, out = _train(tmp_path, 1e39, numerics=2)
    records = [json.loads(line) for line in (out / "numerics.jsonl").open()]
    assert {r["step"] for r in records} == {2, 4, 6}
    assert {"body.0", "head"} <= {r["module"] for r in records}
    assert (out / "numerics.png").exists()
    trace = json.loads((out / "nonfinite.json").read_text())
    assert (trace["module"], trace["phase"], trace["step"]) == ("scale", "forward", 1)


def test_numerics_off_through_the_callback(tmp_path):
    _, _, out = _train(tmp_path, 1.0, steps=2, numerics="off")
    assert not (out / "numerics.jsonl").exists() and (out / "diagnose.json").exists()
    with pytest.raises(UserError, match="numerics="):
        DiagnoseCallback(numerics="sometimes")
