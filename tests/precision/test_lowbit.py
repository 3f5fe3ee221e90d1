"""The low-bit precisions (fp8, fp8-rowwise, fp8-rowwise-gw-hp, mxfp8, mxfp4, nvfp4,
nvfp4-plain; fp8-blockwise in test_lowbit_training.py) emulated: the linear
against torchao's own emulated Float8Linear, gradients in every format, which layers they
touch, what the device support says, and fp32 checkpoints that load without torchao."""
from __future__ import annotations

import copy
import dataclasses
import importlib.util
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from amptrain.common.errors import AmptrainWarning, cli_spelling
from amptrain.precision import MODES, Precision
from amptrain.precision.lowbit import RECIPES, lowbit_linear
from amptrain.precision.hardware.support import support_table
from amptrain.common.quiet import quiet_torchao
from tests import conftest

ROOT = Path(__file__).parents[2]
FORMATS = ("fp8", "fp8-rowwise", "fp8-rowwise-gw-hp", "mxfp8", "mxfp4", "nvfp4", "nvfp4-plain")
needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                   reason="torchao is not installed")


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))


@needs_torchao
@pytest.mark.parametrize("name,recipe", [("fp8", "tensorwise"), ("fp8-rowwise", "rowwise"),
                                         ("fp8-rowwise-gw-hp", "rowwise_with_gw_hp")])
def test_emulated_fp8_linear_agrees_with_torchao_emulate(name, recipe):
    with quiet_torchao():
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    theirs = nn.Sequential(copy.deepcopy(linear))
    config = dataclasses.replace(Float8LinearConfig.from_recipe_name(recipe), emulate=True)
    convert_to_float8_training(theirs, config=config)
    assert type(theirs[0]).__name__ == "Float8Linear"
    x = (torch.randn(4, 8, 64) * 5).requires_grad_()
    mine_x = x.detach().clone().requires_grad_()
    expected = theirs(x)
    grad = torch.randn_like(expected)
    expected.backward(grad)
    got = lowbit_linear(mine_x, linear.weight, linear.bias, RECIPES[name])
    got.backward(grad)
    pairs = {"output": (got, expected), "grad_input": (mine_x.grad, x.grad),
             "grad_weight": (linear.weight.grad, theirs[0].weight.grad),
             "grad_bias": (linear.bias.grad, theirs[0].bias.grad)}
    for what, (a, b) in pairs.items():
        largest = float((a - b).detach().abs().max())
        print(f"{name} {what}: largest difference from torchao emulate=True {largest:.3g}")
        # Only the order of fp32 accumulation may differ: a few ulps of the magnitude.
        assert largest <= 1e-5 * float(b.abs().max()), what


@pytest.mark.parametrize("name", FORMATS)
def test_every_format_trains_with_finite_gradients_in_every_layer(name):
    model = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AmptrainWarning)   # the emulation note
        precision = Precision(name, device="cpu", fp8_skip_first_last=False)
        precision.setup(model, optimizer)
    assert precision.float8_plan is not None
    assert precision.float8_plan.convert == ["2", "4"]   # 20 and 3 are not multiples of 16
    torch.manual_seed(1)
    x, y = torch.randn(64, 20), torch.randint(0, 3, (64,))
    losses = []
    for _ in range(8):
        with precision.autocast():
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)
        assert out.dtype == torch.bfloat16
        optimizer.zero_grad()
        precision.backward(loss)
        for param in model.parameters():
            assert param.grad is not None and torch.isfinite(param.grad).all()
            assert param.grad.abs().sum() > 0 and param.dtype == torch.float32
        precision.step(optimizer)
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    precision.teardown()
    assert all("forward" not in m.__dict__ for m in model.modules())   # forwards given back


def test_which_layers_each_format_takes():
    model = nn.Sequential(nn.Linear(32, 48), nn.Linear(48, 64), nn.Linear(64, 64),
                          nn.Linear(64, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AmptrainWarning)
        fp8 = Precision("fp8", device="cpu")
        fp8.setup(copy.deepcopy(model), None)
        plan = fp8.float8_plan
        mx = Precision("mxfp8", device="cpu")
        mx.setup(copy.deepcopy(model), None)
    assert plan.convert == ["1", "2"]                              # 48 is a multiple of 16
    assert mx.float8_plan.convert == ["2"]                         # ... not of 32
    assert mx.float8_plan.skipped["1"] == "dims not multiples of 32"
    assert "mxfp8: 1 of 4 Linear layers run in mxfp8 (emulated)" in mx.float8_plan.summary(
        "mxfp8", emulated=True)


def test_a_model_with_no_eligible_layer_is_told_so_naming_the_flags():
    tiny = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    with cli_spelling(), pytest.warns(AmptrainWarning) as caught:
        Precision("nvfp4", device="cpu").setup(tiny, None)
    messages = [str(w.message) for w in caught if "eligible" in str(w.message)]
    assert len(messages) == 1 and "\n" not in messages[0]
    assert messages[0].startswith("--precision nvfp4: no Linear layer is eligible (")
    assert "first/last Linear: 0, 2" in messages[0] and "--keep-fp32" in messages[0]
    assert "trains like bf16-mixed" in messages[0]


def test_the_cpu_emulates_every_format_and_auto_never_picks_one():
    table = support_table(torch.device("cpu"))
    for name in FORMATS:
        assert table["supported"][name] is False
        assert table["emulated"][name] and table["emulated_fast"][name]
        assert MODES[name].param_dtype == torch.float32
        assert MODES[name].compute_dtype == torch.bfloat16
    assert table["recommended_precision"] not in FORMATS
    assert "native" in table["needs"]["mxfp4"]


@pytest.mark.parametrize("gpu,cc,native", [("NVIDIA H100 80GB HBM3", (9, 0), True),
                                           ("NVIDIA A100-SXM4-80GB", (8, 0), False)])
def test_gpus_run_fp8_natively_from_ada_on_and_emulate_the_rest(monkeypatch, gpu, cc, native):
    conftest.fake_gpu(monkeypatch, gpu, *cc)
    table = support_table(torch.device("cuda"))
    assert table["supported"]["fp8"] is native and table["supported"]["fp8-rowwise"] is native
    assert table["emulated"]["fp8"] is not native
    for name in ("mxfp8", "mxfp4", "nvfp4"):      # never native: amptrain has no sm100 path
        assert table["supported"][name] is False and table["emulated"][name]
    note = Precision("mxfp8", device="cuda").emulation_note()
    assert note is not None and note.startswith("mxfp8 is emulated on this cuda")
    assert (Precision("fp8", device="cuda").emulation_note() is None) is native


def test_a_gpu_without_bf16_refuses_the_formats(monkeypatch):
    conftest.fake_gpu(monkeypatch, "Tesla T4", 7, 5)
    from amptrain.common.errors import UserError
    with cli_spelling(), pytest.raises(UserError, match=r"--precision mxfp4 needs a GPU with bf16"):
        Precision("mxfp4", device="cuda")


@pytest.mark.slow
def test_cli_trains_mxfp4_and_its_checkpoint_loads_without_torchao(tmp_path):
    out = tmp_path / "run"
    run = subprocess.run(
        [sys.executable, "-m", "amptrain", "train", "--model",
         "transformer:d_model=32,layers=1,heads=2,ff=64", "--data",
         "synthetic-seq:samples=64,length=16,vocab=50", "--precision", "mxfp4", "--device",
         "cpu", "--epochs", "1", "--batch-size", "16", "--no-progress", "--out", str(out)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=300)
    assert run.returncode == 0, run.stderr
    assert "mxfp4 is emulated on this cpu" in run.stderr
    script = (
        "import sys; sys.modules['torchao'] = None\n"
        "import torch\n"
        "from amptrain import checkpoint\n"
        f"state = checkpoint.load({str(out / 'checkpoints' / 'last.pt')!r})\n"
        "assert all(v.dtype in (torch.float32, torch.int64) for v in state['model'].values())\n"
        "assert state['precision_name'] == 'mxfp4'\n"
        "print('loaded', len(state['model']))\n")
    loaded = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.startswith("loaded ")


def test_env_lists_each_format_as_emulated_with_what_native_needs():
    if torch.cuda.is_available():
        pytest.skip("checks the CPU report")
    from amptrain.workflows import env
    from amptrain.precision.hardware.probe import collect_env
    text = env.format_env(collect_env())
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ")
            and line.split() and line.split()[0] in (*FORMATS, "fp8-blockwise")}
    assert set(rows) == {*FORMATS, "fp8-blockwise"}
    for name, row in rows.items():
        assert "emulated (format numerics, fp32 GEMMs)" in row
        needs = "compute capability 9.0+" if name == "fp8-blockwise" else \
            "compute capability 8.9+" if name.startswith("fp8") else "sm100"
        assert needs in row


def test_a_library_run_sees_which_linear_layers_run_low_bit(monkeypatch):
    """issue 49: the "N of M Linear layers" line went only to an INFO log that a library
    caller never sees; without a handler it comes as a warning."""
    import logging

    logger = logging.getLogger("amptrain")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "propagate", False)  # nothing handles amptrain's log
    model = nn.Sequential(nn.Linear(32, 48), nn.Linear(48, 64), nn.Linear(64, 64),
                          nn.Linear(64, 8))
    with pytest.warns(AmptrainWarning, match=r"^fp8: 2 of 4 Linear layers run in fp8"):
        Precision("fp8", device="cpu").setup(model, None)
