"""Device selection, and what a device is (amptrain/precision/hardware/devices.py)."""
from __future__ import annotations

import os

import pytest
import torch

from amptrain.precision.hardware import devices
from amptrain.precision.hardware.devices import (
    CPU_FLAGS,
    cpu_flags,
    cpu_model,
    gpu_info,
    read_cpu_flags,
    resolve_device,
)
from amptrain.common.errors import UserError, cli_spelling
from tests.conftest import fake_gpu


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


# ------------------------------------------------------------- resolve_device
def test_auto_is_the_cpu_without_a_gpu(no_gpu):
    assert resolve_device() == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks this machine has no GPU")
def test_auto_is_the_cpu_here():
    assert resolve_device("auto").type == "cpu"


def test_auto_is_the_first_gpu_when_there_is_one(monkeypatch):
    fake_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", 9, 0, count=2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)


@pytest.mark.parametrize("name,message", [
    ("gpu", "--device 'gpu' is not a device (use cpu, cuda, cuda:N or auto)"),
    ("cuda:x", "--device 'cuda:x' is not a device (use cpu, cuda, cuda:N or auto)"),
    ("", "--device '' is not a device (use cpu, cuda, cuda:N or auto)"),
    ("Auto", "--device 'Auto' is not a device (use cpu, cuda, cuda:N or auto)"),
    ("mps", "--device mps: amptrain supports cpu and cuda"),
    ("meta", "--device meta: amptrain supports cpu and cuda"),
])
def test_bad_names_are_user_errors_naming_the_flag(name, message, no_gpu):
    with cli_spelling(), pytest.raises(UserError) as error:
        resolve_device(name)
    assert str(error.value) == message
    with pytest.raises(UserError) as library:  # a library caller is told the keyword
        resolve_device(name)
    assert str(library.value) == message.replace("--device", "device")


@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu_says_to_use_the_cpu(name, no_gpu):
    with cli_spelling(), pytest.raises(UserError) as error:
        resolve_device(name)
    assert str(error.value) == "--device cuda: no CUDA GPU is visible here; use --device cpu"


def test_a_gpu_index_beyond_the_visible_ones_is_refused(monkeypatch):
    fake_gpu(monkeypatch, "Tesla T4", 7, 5, 15, count=2)
    with cli_spelling(), pytest.raises(UserError,
                                       match=r"^--device cuda:2: only 2 GPU\(s\) visible$"):
        resolve_device("cuda:2")


# ------------------------------------------------------------- what a device is
def test_read_cpu_flags_reads_x86_flags_and_arm_features(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: Fake CPU\n"
                   "flags\t\t: fpu sse avx512_bf16\n\nprocessor\t: 1\nflags\t\t: other\n")
    assert read_cpu_flags(str(x86)) == {"fpu", "sse", "avx512_bf16"}  # the first CPU's
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16 sve\nCPU implementer\t: 0x41\n")
    assert read_cpu_flags(str(arm)) == {"fp", "asimd", "bf16", "sve"}
    assert cpu_flags(str(arm)) == dict.fromkeys(CPU_FLAGS, False)
    none = tmp_path / "none"
    none.write_text("processor\t: 0\n")
    assert read_cpu_flags(str(none)) is None
    assert read_cpu_flags(str(tmp_path / "missing")) is None


def test_cpu_model_is_cpuinfos_model_name():
    names = []
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as handle:
            names = [line.split(":", 1)[1].strip() for line in handle
                     if line.startswith("model name")]
    if not names:
        pytest.skip("no model name in /proc/cpuinfo here")
    assert cpu_model() == names[0] and names[0]


def test_gpu_info_reports_name_capability_and_memory(monkeypatch):
    fake_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", 9, 0, memory_gib=80)
    assert gpu_info(0) == {"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0",
                           "memory_bytes": 80 * 2 ** 30, "multiprocessors": 80}


def test_cpu_flags_are_parsed_from_cpuinfo(tmp_path):
    fake = tmp_path / "cpuinfo"
    fake.write_text("processor\t: 0\nmodel name\t: Fake CPU\n"
                    "flags\t\t: fpu sse avx512f avx512_bf16 amx_tile amx_bf16\n\n")
    assert devices.cpu_flags(str(fake)) == {"amx_bf16": True, "amx_fp16": False, "amx_tile": True,
                                        "avx512_bf16": True, "avx512_fp16": False}
    assert set(devices.cpu_flags(str(tmp_path / "missing")).values()) == {None}


_AVX2 = "fpu sse4_1 avx avx2 fma"                                     # AMD EPYC (Zen 2/3)
_AVX512 = _AVX2 + " avx512f avx512bw avx512vl avx512dq"               # Skylake-SP
_ZEN4 = _AVX512 + " avx512_bf16"                                      # AMD EPYC (Zen 4)
_SPR = _ZEN4 + " avx512_fp16 amx_tile amx_bf16"                       # Sapphire Rapids


@pytest.mark.parametrize("flags,isa,avx512,amx", [
    (_AVX2, "AVX2", False, False), (_AVX512, "AVX512_CORE", True, False),
    (_ZEN4, "AVX512_CORE_BF16", True, False), (_SPR, "AVX512_CORE_AMX", True, True),
    ("fp asimd bf16", "none", False, False),                          # ARM
])
def test_cpu_isa_is_what_the_real_cpu_reaches(tmp_path, monkeypatch, flags, isa, avx512, amx):
    fake = tmp_path / "cpuinfo"
    fake.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\n")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")  # a cap never raises it
    assert devices.cpu_isa(str(fake)) == isa
    assert devices.cpu_reaches("AVX512_CORE", str(fake)) is avx512
    assert devices.cpu_reaches("AVX512_CORE_AMX", str(fake)) is amx
    assert devices.cpu_reaches("AVX2", str(tmp_path / "missing")) is None
    with pytest.raises(ValueError, match="unknown ISA level"):
        devices.cpu_reaches("AVX1024")
