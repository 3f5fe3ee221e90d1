"""precision/hardware/probe.py: versions, CPU flags, per-precision support and the
recommendation, on this machine and on faked CUDA GPUs (the table: tests/test_env.py; the
``amptrain env`` command: tests/commands/test_env.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from amptrain.workflows import env
from amptrain.precision import MODES
from amptrain.precision.hardware import probe, support
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
    info = probe.collect_env()
    assert info["cpu_flags"]["amx_bf16"] and info["recommended_precision"] == "bf16-mixed"
    assert info["channels_last"] is True


def test_collect_env_keeps_the_keys_other_reports_embed():
    info = probe.collect_env()
    assert {"python", "torch", "cuda", "cpu", "cpu_cores", "gpus"} <= set(info)
    json.dumps(info)  # JSON-ready


# ---------------------------------------------------------------- fake CUDA
def test_fake_h100_supports_fp8_and_recommends_bf16(monkeypatch):
    fake_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", 9, 0, 80)
    monkeypatch.setattr(support, "torchao_available", lambda: True)
    monkeypatch.setattr(support, "triton_available", lambda: True)
    info = probe.collect_env()
    assert info["device"] == "cuda"
    assert info["cuda"] == "12.4" and info["cudnn"] == "90100" and info["nccl"] == "2.21.5"
    gpu = info["gpus"][0]
    assert gpu["compute_capability"] == "9.0" and gpu["memory_bytes"] == 80 * 2 ** 30
    assert gpu["tensor_cores"] and gpu["bf16"] and gpu["tf32"] and gpu["fp8"]
    # the block formats are emulated even here: amptrain drives no sm100 MX/NVFP4 kernels
    block = {"mxfp8", "mxfp4", "nvfp4", "nvfp4-plain"}
    assert info["supported"] == {name: name not in block for name in MODES}
    assert {name for name, on in info["emulated"].items() if on} == block
    assert info["recommended_precision"] == "bf16-mixed"
    assert info["channels_last"] is True
    text = env.format_env(info)
    assert "NVIDIA H100 80GB HBM3, compute capability 9.0" in text
    assert "recommended: --precision bf16-mixed" in text


def test_fake_l4_runs_the_fp8_recipes_natively_but_emulates_the_blockwise_one(monkeypatch):
    """fp8-rowwise-gw-hp is torchao Float8Linear (sm89+); fp8-blockwise needs torchao's
    Hopper (sm90+) Triton kernels, so an L4 (8.9) emulates it, and env says so."""
    fake_gpu(monkeypatch, "NVIDIA L4", 8, 9, 24)
    monkeypatch.setattr(support, "torchao_available", lambda: True)
    monkeypatch.setattr(support, "triton_available", lambda: True)
    info = probe.collect_env()
    assert info["supported"]["fp8-rowwise-gw-hp"] and info["supported"]["fp8"]
    assert not info["supported"]["fp8-blockwise"] and info["emulated"]["fp8-blockwise"]
    assert "9.0+" in info["needs"]["fp8-blockwise"]
    text = env.format_env(info)
    assert "fp8-blockwise" in text and "fp8-rowwise-gw-hp" in text


def test_fake_t4_has_no_bf16_and_recommends_fp16(monkeypatch):
    fake_gpu(monkeypatch, "Tesla T4", 7, 5, 15, count=2)
    info = probe.collect_env()
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
    info = probe.collect_env()
    assert info["recommended_precision"] == "32-true"
    assert not info["supported"]["16-mixed"] and not info["features"]["tensor_cores"]
