"""env.py: versions, CPU flags, per-precision support and the recommendation, on this
machine and on faked CUDA GPUs (the ``amptrain env`` command: tests/commands/test_env.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from amptrain import env
from amptrain.precision import MODES, fp8
from amptrain.precision.hardware.support import onednn_may_use
from tests.conftest import fake_gpu

CPUINFO = Path("/proc/cpuinfo")


def _proc_flags() -> set[str]:
    for line in CPUINFO.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def test_this_machine_with_amx_recommends_bf16_mixed():
    """The machine this project is developed on has AMX-BF16 (see HELPER_GUIDE)."""
    if torch.cuda.is_available() or not CPUINFO.exists() or "amx_bf16" not in _proc_flags():
        pytest.skip("only meaningful on a CPU with AMX-BF16 and no GPU")
    if not onednn_may_use("amx"):
        pytest.skip("ONEDNN_MAX_CPU_ISA keeps oneDNN below AMX here")
    info = env.collect_env()
    assert info["cpu_flags"]["amx_bf16"] and info["recommended_precision"] == "bf16-mixed"
    assert info["channels_last"] is True


def test_collect_env_keeps_the_keys_other_reports_embed():
    info = env.collect_env()
    assert {"python", "torch", "cuda", "cpu", "cpu_cores", "gpus"} <= set(info)
    json.dumps(info)  # JSON-ready


# ---------------------------------------------------------------- fake CUDA
def test_fake_h100_supports_fp8_and_recommends_bf16(monkeypatch):
    fake_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", 9, 0, 80)
    monkeypatch.setattr(fp8, "torchao_available", lambda: True)
    info = env.collect_env()
    assert info["device"] == "cuda"
    assert info["cuda"] == "12.4" and info["cudnn"] == "90100" and info["nccl"] == "2.21.5"
    gpu = info["gpus"][0]
    assert gpu["compute_capability"] == "9.0" and gpu["memory_bytes"] == 80 * 2 ** 30
    assert gpu["tensor_cores"] and gpu["bf16"] and gpu["tf32"] and gpu["fp8"]
    # the block formats are emulated even here: amptrain drives no sm100 MX/NVFP4 kernels
    block = {"mxfp8", "mxfp4", "nvfp4"}
    assert info["supported"] == {name: name not in block for name in MODES}
    assert {name for name, on in info["emulated"].items() if on} == block
    assert info["recommended_precision"] == "bf16-mixed"
    assert info["channels_last"] is True
    text = env.format_env(info)
    assert "NVIDIA H100 80GB HBM3, compute capability 9.0" in text
    assert "recommended: --precision bf16-mixed" in text


def test_fake_t4_has_no_bf16_and_recommends_fp16(monkeypatch):
    fake_gpu(monkeypatch, "Tesla T4", 7, 5, 15, count=2)
    info = env.collect_env()
    assert len(info["gpus"]) == 2
    supported = info["supported"]
    assert not supported["bf16-mixed"] and not supported["bf16-true"] \
        and not supported["bf16-master"]
    assert supported["16-mixed"] and supported["32-true"]
    assert not supported["fp8"] and not supported["tf32"]
    assert info["recommended_precision"] == "16-mixed"
    assert info["features"]["tensor_cores"]
    assert any("no bf16" in note for note in info["notes"])
    assert any("--nproc-per-node 2" in note for note in info["notes"])


def test_fake_old_gpu_recommends_fp32(monkeypatch):
    fake_gpu(monkeypatch, "Tesla K80", 3, 7, 12)
    info = env.collect_env()
    assert info["recommended_precision"] == "32-true"
    assert not info["supported"]["16-mixed"] and not info["features"]["tensor_cores"]


# -------------------------------------------------------------------- bench
def test_bench_measures_every_dtype_on_this_device():
    bench = env.run_bench(torch.device("cpu"), rounds=1, target_s=0.0)
    rows = {(r["op"], r["dtype"]): r for r in bench["results"]}
    assert set(rows) == {(op, d) for op in ("matmul", "conv2d") for d in ("fp32", "bf16", "fp16")}
    assert all(r["tflops"] > 0 and r["ms"] > 0 for r in rows.values())
    assert rows["matmul", "fp32"]["ratio_to_fp32"] == 1.0
    assert "TFLOP/s" in env.format_bench(bench)


@pytest.mark.parametrize("isa, switch, bf16_path", [
    ("AVX2", None, "emulated"),      # no bf16 hardware for oneDNN: a run emulates it
    ("AVX2", "off", "pytorch"),      # ... unless AMPTRAIN_EMULATION=off
    (None, None, None),              # this CPU as it is: native where it has the hardware
])
def test_bench_times_the_path_a_run_takes_here_and_labels_it(monkeypatch, isa, switch,
                                                             bf16_path):
    from amptrain.precision.hardware.support import cpu_has_native_bf16, device_features

    for name, value in (("ONEDNN_MAX_CPU_ISA", isa), ("AMPTRAIN_EMULATION", switch)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    cpu = torch.device("cpu")
    paths = env.kernel_paths(cpu)
    expected_bf16 = bf16_path or ("native" if cpu_has_native_bf16() else "emulated")
    expected_fp16 = "native" if device_features(cpu)["fp16"] else \
        ("pytorch" if switch == "off" else "emulated")
    assert paths == {"fp32": "native", "bf16": expected_bf16, "fp16": expected_fp16}
    timed = []
    original = env._timed

    def spy(case, inputs, device, reps, emulate=None):
        timed.append((case.op, inputs[0].dtype, emulate))
        return original(case, inputs, device, reps, emulate)

    monkeypatch.setattr(env, "_timed", spy)
    bench = env.run_bench(cpu, rounds=1, target_s=0.0)
    assert {r["dtype"]: r["path"] for r in bench["results"]} == paths
    for op, dtype, emulate in timed:  # the emulation: fp32 inputs under its autocast
        half = {torch.bfloat16: "bf16", torch.float16: "fp16"}
        if emulate is not None:
            assert dtype == torch.float32 and paths[half[emulate]] == "emulated"
        elif dtype != torch.float32:
            assert paths[half[dtype]] in ("native", "pytorch")
    table = env.format_bench(bench)
    row = next(line for line in table.splitlines() if line.startswith("  matmul  bf16"))
    assert row.split()[2] == expected_bf16
    assert f"{expected_bf16} = {env.PATHS[expected_bf16]}" in table


@pytest.mark.parametrize("switch,label", [(None, "emulated (native numerics, fp32 speed)"),
                                          ("off", "emulated (slow)")])
def test_emulated_precisions_say_how_they_run(monkeypatch, switch, label):
    # ONEDNN_MAX_CPU_ISA=AVX2 makes every CPU an AVX2-only one for oneDNN: bf16 and fp16
    # are both emulated, at fp32 speed unless AMPTRAIN_EMULATION=off.
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    if switch is None:
        monkeypatch.delenv("AMPTRAIN_EMULATION", raising=False)
    else:
        monkeypatch.setenv("AMPTRAIN_EMULATION", switch)
    info = env.collect_env()
    if info["device"] != "cpu":
        pytest.skip("env describes the GPU here")
    assert info["emulated"]["bf16-mixed"] and info["emulated"]["16-mixed"]
    assert info["emulated_fast"]["bf16-mixed"] is (switch is None)
    rows = [line for line in env.format_env(info).splitlines() if line.startswith("  bf16-")]
    assert rows and all(label in row for row in rows)
    assert "emulated" not in next(line for line in env.format_env(info).splitlines()
                                  if line.startswith("  32-true"))
