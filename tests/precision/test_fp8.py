"""``--precision fp8``: which hardware it runs on (faked GPUs), which Linear layers it
converts, what ``env`` reports, and that its checkpoints are plain fp32.

The conversion itself needs torchao; those tests skip without it. torchao's float8
Linear also runs (slowly) on the CPU, which lets them train a few real fp8 steps here with
the hardware check switched on. Off fp8 hardware amptrain emulates the formats itself
(tests/precision/test_lowbit.py). The test that needs an fp8 GPU skips
without one.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from amptrain.precision.hardware import probe, support
from amptrain.config import RunConfig
from amptrain.common.errors import UserError, cli_spelling
from amptrain.precision import MODES, Precision
from amptrain.precision.fp8 import plan_float8
from amptrain.workflows.runner import data_and_model
from amptrain.trainer import Trainer
from tests import conftest

ROOT = Path(__file__).parents[2]
HAS_TORCHAO = importlib.util.find_spec("torchao") is not None
needs_torchao = pytest.mark.skipif(not HAS_TORCHAO,
                                   reason="torchao is not installed (pip install 'amptrain[fp8]')")


def fake_gpu(monkeypatch, name: str, major: int, minor: int, torchao: bool = True) -> None:
    """torch.cuda.* report one GPU of this compute capability; torchao present or not."""
    conftest.fake_gpu(monkeypatch, name, major, minor)
    monkeypatch.setattr(support, "torchao_available", lambda: torchao)


# ------------------------------------------------------------ mode selection
def test_fp8_is_a_mode_with_fp32_weights_and_bf16_autocast():
    spec = MODES["fp8"]
    assert spec.float8_linears and spec.param_dtype == torch.float32
    assert spec.compute_dtype == torch.bfloat16 and not spec.loss_scaling


def test_cpu_emulates_fp8_and_says_so():
    precision = Precision("fp8", device="cpu")
    assert precision.name == "fp8" and precision.emulated_fast
    with cli_spelling():
        note = precision.emulation_note()
    assert note is not None and note.startswith("fp8 is emulated on this cpu")
    assert "compute capability 8.9+" in note and "\n" not in note


@pytest.mark.parametrize("gpu,cc,refused", [("NVIDIA A100-SXM4-80GB", (8, 0), False),
                                            ("NVIDIA A10G", (8, 6), False),
                                            ("Tesla T4", (7, 5), True),
                                            ("Tesla V100-SXM2-16GB", (7, 0), True)])
def test_gpus_before_ada_emulate_fp8_or_refuse_it_without_bf16(monkeypatch, gpu, cc, refused):
    fake_gpu(monkeypatch, gpu, *cc)
    if not refused:   # no fp8 Tensor Cores: emulated, with bf16 autocast elsewhere
        assert Precision("fp8", device="cuda").emulation_note() is not None
        return
    with cli_spelling(), pytest.raises(UserError) as caught:
        Precision("fp8", device="cuda")
    message = str(caught.value)
    assert f"{gpu} has {cc[0]}.{cc[1]}" in message and "needs a GPU with bf16" in message
    assert message.endswith("use --precision 16-mixed (what auto picks here)")


@pytest.mark.parametrize("gpu,cc", [("NVIDIA L4", (8, 9)), ("NVIDIA H100 80GB HBM3", (9, 0)),
                                    ("NVIDIA H200", (9, 0)), ("NVIDIA B200", (10, 0))])
def test_ada_hopper_and_later_are_accepted_with_torchao(monkeypatch, gpu, cc):
    fake_gpu(monkeypatch, gpu, *cc)
    precision = Precision("fp8", device="cuda")
    assert precision.name == "fp8" and precision.loss_scale is None


def test_missing_torchao_is_refused_with_the_install_command(monkeypatch):
    fake_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", 9, 0, torchao=False)
    with cli_spelling(), pytest.raises(UserError, match=r"--precision fp8 needs the torchao "
                                                      r"package.*pip install torchao.*"
                                                      r"--precision bf16-mixed"):
        Precision("fp8", device="cuda")


@pytest.mark.parametrize("cc,torchao", [((9, 0), True), ((9, 0), False), ((8, 9), True),
                                        ((8, 0), True), ((7, 5), False)])
def test_env_reports_fp8_exactly_when_the_precision_layer_accepts_it(monkeypatch, cc, torchao):
    fake_gpu(monkeypatch, "NVIDIA Test GPU", *cc, torchao=torchao)
    info = probe.collect_env()
    try:
        Precision("fp8", device="cuda")
        accepted = True
    except UserError:
        accepted = False
    assert (info["supported"]["fp8"] or info["emulated"]["fp8"]) is accepted
    assert info["supported"]["fp8"] is (accepted and cc >= (8, 9))   # native only on sm89+
    assert info["features"]["fp8"] is (cc >= (8, 9))      # the hardware alone
    assert info["recommended_precision"] != "fp8"         # auto never picks fp8
    if cc >= (8, 9) and not torchao:
        assert any("fp8 needs torchao" in note for note in info["notes"])


def test_env_on_this_cpu_says_fp8_is_emulated():
    if torch.cuda.is_available():
        pytest.skip("checks the CPU report")
    info = probe.collect_env()
    assert info["supported"]["fp8"] is False and info["emulated"]["fp8"] is True
    assert "compute capability 8.9+" in info["needs"]["fp8"]
    assert list(info["supported"]).count("fp8") == 1


# ------------------------------------------------------------ which layers
class Mixed(nn.Module):
    """Linear layers of every kind the plan must tell apart."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(10, 64)                  # first Linear
        self.attn = nn.MultiheadAttention(64, 4, batch_first=True)   # out_proj: a subclass
        self.up = nn.Linear(64, 256)                    # eligible
        self.down = nn.Linear(256, 64)                  # eligible
        self.odd = nn.Linear(64, 40)                    # 40 is not a multiple of 16
        self.block = nn.Sequential(nn.Linear(40, 48), nn.GELU(), nn.Linear(48, 64))
        self.head = nn.Linear(64, 3)                    # last Linear


def test_plan_skips_first_last_unaligned_subclasses_and_islands():
    plan = plan_float8(Mixed(), islands=["block"])
    assert plan.convert == ["up", "down"]
    assert plan.skipped == {"embed": "first/last Linear",
                            "attn.out_proj": "NonDynamicallyQuantizableLinear (weight used "
                                             "outside forward)",
                            "odd": "dims not multiples of 16", "block.0": "--keep-fp32",
                            "block.2": "--keep-fp32", "head": "first/last Linear"}
    summary = plan.summary()
    assert summary.startswith("fp8: 2 of 8 Linear layers run in fp8 (kept in bf16 - ")
    assert "first/last Linear: embed, head" in summary
    # Issue 48: the layers --keep-fp32 names stay in fp32, and the line says so.
    bf16, fp32 = summary.split("; kept in fp32 - ")
    assert "--keep-fp32" not in bf16 and fp32 == "--keep-fp32: block.0, block.2)"


def test_plan_options_and_nothing_eligible():
    everything = plan_float8(Mixed(), skip_first_last=False)
    assert everything.convert == ["up", "down", "block.2"]
    assert everything.skipped["embed"] == "dims not multiples of 16"   # in_features 10
    assert everything.skipped["head"] == "dims not multiples of 16"
    patterned = plan_float8(Mixed(), skip=["do*"])
    assert patterned.convert == ["up", "block.2"]
    assert patterned.skipped["down"] == "skipped by pattern"
    tiny = plan_float8(nn.Sequential(nn.Linear(8, 4), nn.Linear(4, 2)))
    assert tiny.convert == [] and "nothing is eligible" in tiny.summary()


def test_builtin_transformer_converts_its_feed_forward_layers():
    config = RunConfig.from_options(model="transformer:d_model=64,layers=2,heads=4,ff=128",
                       data="synthetic-seq:samples=64,length=16")
    _, model = data_and_model(config)
    plan = plan_float8(model)
    assert plan.convert == ["encoder.layers.0.linear1", "encoder.layers.0.linear2",
                            "encoder.layers.1.linear1", "encoder.layers.1.linear2"]


# ------------------------------------------------------------ with torchao
@pytest.fixture
def fp8_on_cpu(monkeypatch):
    """Take torchao's native fp8 path on the CPU (torchao's float8 matmuls run there)."""
    monkeypatch.setattr(support, "fp8_native", lambda device: True)


@needs_torchao
def test_conversion_keeps_parameters_names_and_optimizer(fp8_on_cpu):
    config = RunConfig.from_options(model="transformer:d_model=64,layers=2,heads=4,ff=128",
                       data="synthetic-seq:samples=64,length=16")
    _, model = data_and_model(config)
    names = list(model.state_dict())
    params = dict(model.named_parameters())
    optimizer = torch.optim.AdamW(model.parameters())
    precision = Precision("fp8", device="cpu", keep_fp32=["encoder.layers.1"])
    precision.setup(model, optimizer)
    converted = {n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"}
    assert converted == {"encoder.layers.0.linear1", "encoder.layers.0.linear2"}
    assert list(model.state_dict()) == names
    assert all(p is params[n] for n, p in model.named_parameters())
    assert all(type(p) is nn.Parameter for p in model.parameters())


@needs_torchao
@pytest.mark.slow
def test_fp8_trains_and_checkpoints_load_without_torchao(fp8_on_cpu, tmp_path):
    config = RunConfig.from_options(model="transformer:d_model=32,layers=2,heads=2,ff=64",
                       data="synthetic-seq:samples=160,length=16,vocab=100,signal=0.5",
                       precision="fp8", device="cpu", epochs=3, batch_size=16, lr=3e-3,
                       log_every=4, no_progress=True, out=str(tmp_path / "run"))
    from amptrain.workflows.runner import run_training
    result = run_training(config)
    assert result.precision == "fp8" and result.skipped_steps == 0
    losses = [r["loss"] for r in result.history if "loss" in r]
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    checkpoint = tmp_path / "run" / "checkpoints" / "last.pt"
    # A process where `import torchao` fails loads the checkpoint into a plain model.
    script = (
        "import sys; sys.modules['torchao'] = None\n"
        "import torch\n"
        "from amptrain import checkpoint\n"
        "from amptrain.models import ModelInputs, build_model\n"
        f"state = checkpoint.load({str(checkpoint)!r})\n"
        "inputs = ModelInputs(**{**state['run']['inputs'],\n"
        "                        'input_shape': tuple(state['run']['inputs']['input_shape'])})\n"
        "model = build_model(state['run']['model'], inputs)\n"
        "model.load_state_dict(state['model'])\n"
        "assert all(type(v) is torch.Tensor and v.dtype in (torch.float32, torch.int64)\n"
        "           for v in state['model'].values())\n"
        "assert state['precision_name'] == 'fp8'\n"
        "print('loaded', len(state['model']))\n")
    loaded = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.startswith("loaded ")


# ------------------------------------------------------------ on a real GPU
def _fp8_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9) \
        and HAS_TORCHAO


@pytest.mark.skipif(not _fp8_gpu(), reason="needs a CUDA GPU with compute capability 8.9+ "
                                           "(Ada/Hopper) and torchao")
def test_fp8_on_gpu_tracks_bf16_loss():
    torch.manual_seed(0)
    data_spec = "synthetic-seq:samples=2048,length=128,vocab=1000,signal=0.3"
    losses = {}
    for name in ("bf16-mixed", "fp8"):
        config = RunConfig.from_options(model="transformer:d_model=256,layers=2,heads=4,ff=1024",
                           data=data_spec, seed=0)
        data, model = data_and_model(config)
        trainer = Trainer(precision=name, device="cuda", batch_size=64, max_steps=60,
                          log_every=10, lr=1e-3, no_progress=True)
        result = trainer.fit(model, data.train)
        if name == "fp8":
            assert any(type(m).__name__ == "Float8Linear" for m in model.modules())
        losses[name] = [r["loss"] for r in result.history if "loss" in r]
    assert losses["fp8"][-1] < losses["fp8"][0]
    assert abs(losses["fp8"][-1] - losses["bf16-mixed"][-1]) < 0.1 * losses["bf16-mixed"][0]


# ------------------------------------------------------------ the GPU benchmark
def _benchmark():
    spec = importlib.util.spec_from_file_location("gpu_fp8", ROOT / "benchmarks" / "gpu_fp8.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_gpu_benchmark_stops_clearly_without_cuda(capsys):
    benchmark = _benchmark()
    assert benchmark.main([]) == 2
    error = capsys.readouterr().err
    assert "needs a CUDA GPU with compute capability 8.9+" in error and "--tiny" in error


@pytest.mark.slow
def test_gpu_benchmark_runs_end_to_end_in_its_cpu_smoke_mode(tmp_path, capsys):
    benchmark = _benchmark()
    out = tmp_path / "fp8.json"
    assert benchmark.main(["--tiny", "--device", "cpu", "--precisions", "32-true,bf16-mixed",
                           "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| precision | step ms | tokens/s | speed-up |" in table
    assert "| 32-true |" in table and "| bf16-mixed |" in table
    import json
    results = json.loads(out.read_text())
    assert results["throughput"]["32-true"]["speedup"] == 1.0
    assert len(results["curves"]["bf16-mixed"]) == 4            # 8 steps, logged every 2
    assert results["comparison"]["bf16-mixed"]["verdict"] == "ok"


def test_loss_curve_comparison_flags_a_diverging_curve():
    benchmark = _benchmark()
    curves = {"bf16-mixed": [2.0, 1.5, 1.0, 0.8], "fp8": [2.0, 1.5, 1.02, 0.81],
              "bad": [2.0, 1.8, 1.7, float("nan")]}
    verdicts = benchmark.compare_curves(curves, "bf16-mixed", tolerance=0.05)
    assert verdicts["bf16-mixed"]["verdict"] == "ok" and verdicts["fp8"]["verdict"] == "ok"
    assert verdicts["fp8"]["max_rel_gap"] < 0.02
    assert verdicts["bad"]["verdict"] == "differs"
