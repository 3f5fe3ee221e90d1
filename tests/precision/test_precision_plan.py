"""precision/precision_plan.py: ``--precision plan:FILE`` -- one format per Linear layer,
safe YAML, one-line errors for a malformed plan, the plan's content in the checkpoint."""
from __future__ import annotations

import warnings
from collections import OrderedDict

import pytest
import torch
from torch import nn

from amptrain.checkpoint.files import load
from amptrain.common.errors import AmptrainWarning, UserError
from amptrain.precision import Precision
from amptrain.precision.lowbit import RECIPES
from amptrain.precision.precision_plan import lowbit_flops_share, native_formats
from amptrain.trainer import Trainer
from tests.conftest import tiny_classification


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(inp=nn.Linear(8, 32), act=nn.Tanh(),
                                     mid=nn.Linear(32, 32), tail=nn.Linear(32, 32),
                                     out=nn.Linear(32, 3)))


def _plan(tmp_path, text: str, name: str = "plan.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return f"plan:{path}"


def _set_up(precision_name: str, model: nn.Module) -> Precision:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AmptrainWarning)
        precision = Precision(precision_name, device="cpu")
        precision.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return precision


def test_each_layer_runs_in_its_own_format_and_the_rest_as_bf16_mixed(tmp_path):
    name = _plan(tmp_path, "layers:\n  mid: mxfp4\n  tail: fp8-rowwise\n  out: bf16\n")
    model = _model()
    precision = _set_up(name, model)
    assert precision.name == name and precision.spec.compute_dtype == torch.bfloat16
    assert precision.float8_plan is not None
    assert precision.float8_plan.convert == ["mid", "tail"]
    assert precision.float8_plan.skipped == {"out": "plan: bf16", "inp": "not in the plan"}
    # mid's output is exactly the emulated mxfp4 GEMM of its input and weight
    x = torch.randn(4, 32)
    with precision.autocast():
        got = model.mid(x)
    recipe = RECIPES["mxfp4"]
    want = (recipe.input(x, -1) @ recipe.weight(model.mid.weight.detach(), -1).t()
            + model.mid.bias.detach()).to(torch.bfloat16)
    assert torch.equal(got, want)
    # mid's and tail's 32x32 of the 8x32 + 2 x 32x32 + 32x3 multiply-adds per token
    assert lowbit_flops_share(model, ["mid", "tail"]) == pytest.approx(
        2048 / (256 + 2048 + 96))
    assert native_formats(precision.mode.plan, torch.device("cpu")) == {
        "mxfp4": False, "fp8-rowwise": False}


@pytest.mark.parametrize("text, where, message", [
    ("mid: fp5\n", "load", "module 'mid': unknown format 'fp5'; choose one of fp8,"),
    ("nope: mxfp4\n", "setup", "no module 'nope' in the model (its Linear layers: inp, mid,"),
    ("inp: mxfp4\n", "setup", "module 'inp' cannot run in mxfp4: it is its dimensions 8x32 "
                              "are not multiples of 32"),
    ("act: fp8\n", "setup", "module 'act' cannot run in fp8: it is a Tanh, not a plain "
                            "nn.Linear"),
    ("- mid\n- tail\n", "load", "the file must hold a mapping of module names to formats"),
    ("mid: [mxfp4\n", "load", "not valid YAML at line"),
    # safe YAML: a Python tag is refused, never constructed
    ("mid: !!python/object/apply:os.system ['echo owned']\n", "load", "not valid YAML"),
])
def test_a_malformed_plan_is_one_line_naming_the_flag_the_module_and_the_format(
        tmp_path, text, where, message):
    name = _plan(tmp_path, text)
    model = _model()
    with pytest.raises(UserError) as caught:
        Precision(name, device="cpu")
        assert where == "setup"   # a file error is found when the plan is read
        _set_up(name, model)
    line = str(caught.value)
    assert "\n" not in line and line.startswith(f"precision {name}: ")
    assert message in line


def test_a_missing_plan_file_and_an_empty_path_are_one_line(tmp_path):
    with pytest.raises(UserError, match="cannot read the plan file"):
        Precision(f"plan:{tmp_path / 'absent.yaml'}", device="cpu")
    with pytest.raises(UserError, match="plan:FILE needs the plan file's path"):
        Precision("plan:", device="cpu")


def test_the_checkpoint_records_the_plan_and_a_resume_uses_it(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("mid: mxfp4\ntail: nvfp4\n")
    data = tiny_classification(n=64)
    options = dict(precision=f"plan:{plan}", device="cpu", no_progress=True, batch_size=16,
                   scheduler="none", out=str(tmp_path / "run"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AmptrainWarning)
        Trainer(max_steps=2, **options).fit(_model(), data)
        saved = load(tmp_path / "run" / "checkpoints" / "last.pt")
        # the content, not the path: a resume checks it against the plan given
        assert saved["precision"]["precision_plan"] == {"mid": "mxfp4", "tail": "nvfp4"}
        assert saved["precision"]["stochastic_rounding"][0]["calls"]["tail"] > 0
        resumed = Trainer(max_steps=4, resume="auto", **options)
        result = resumed.fit(_model(), data)
        assert result.steps == 4 and resumed.precision.float8_plan is not None
        assert resumed.precision.float8_plan.convert == ["mid", "tail"]
        plan.write_text("mid: mxfp4\ntail: bf16\n")   # another plan under the same path
        with pytest.raises(UserError, match="the checkpoint trained with another plan .first "
                                            "difference: tail"):
            Trainer(max_steps=6, resume="auto", **options).fit(_model(), data)
