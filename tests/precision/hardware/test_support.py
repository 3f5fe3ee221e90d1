"""What a device supports: native, emulated and refused precisions, auto's choice, and
name resolution, on faked CPUs and GPUs."""
from __future__ import annotations

import pytest
import torch

from amptrain.common.errors import UserError, cli_spelling
from amptrain.precision.hardware import support
from amptrain.precision.resolve import resolve_precision
from tests.conftest import fake_gpu

NO_FLAGS = {"amx_bf16": False, "amx_fp16": False, "amx_tile": False, "avx512_bf16": False,
            "avx512_fp16": False}
CPU = torch.device("cpu")


@pytest.mark.parametrize("flags,native_bf16,fp16,bf16", [
    # AVX2-only: bf16 and fp16 both emulated
    ({}, False, "emulated", "emulated"),
    # AMD EPYC Zen 4: AVX512-BF16, no fp16 units
    ({"avx512_bf16": True}, True, "emulated", "native"),
    # Sapphire Rapids: AMX-BF16 and AVX512-FP16
    ({"amx_bf16": True, "amx_tile": True, "avx512_fp16": True}, True, "native", "native"),
])
def test_cpu_classes(monkeypatch, flags, native_bf16, fp16, bf16):
    # The flags stand for the whole CPU: a cap on oneDNN's ISA from the environment (the
    # AVX2-class check of docs/development.md) would lower the AMX row to AVX2
    # (support.onednn_may_use).
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(support, "cpu_has_native_bf16", lambda flags=None: native_bf16)
    table = support.support_table(CPU, {**NO_FLAGS, **flags})
    for name in ("16-mixed", "16-master", "16-true"):
        assert table["emulated"][name] is (fp16 == "emulated")
        assert table["supported"][name] is (fp16 == "native")
    for name in ("bf16-mixed", "bf16-master", "bf16-true"):
        assert table["emulated"][name] is (bf16 == "emulated")
    assert not table["emulated"]["32-true"]
    assert table["emulated"]["fp8"] and not table["supported"]["fp8"]   # the low-bit formats
    # auto never picks an emulated precision
    assert table["recommended_precision"] == ("bf16-mixed" if native_bf16 else "32-true")
    assert not table["emulated"][table["recommended_precision"]]


@pytest.mark.parametrize("gpu,major,minor,auto,bf16_ok", [
    ("Tesla T4", 7, 5, "16-mixed", False),
    ("NVIDIA A100", 8, 0, "bf16-mixed", True),
    ("Tesla P100", 6, 0, "32-true", False),
])
def test_gpus(monkeypatch, gpu, major, minor, auto, bf16_ok):
    fake_gpu(monkeypatch, gpu, major, minor)
    cuda = torch.device("cuda")
    assert support.auto_mode(cuda) == auto
    assert resolve_precision("auto", cuda).name == auto
    if bf16_ok:
        assert resolve_precision("bf16", cuda).name == "bf16-mixed"
    else:
        # what to use instead is what auto picks on this GPU (16-mixed, or 32-true before 7.0)
        with cli_spelling(), pytest.raises(UserError, match="--precision bf16-mixed needs a GPU "
                                                            f"with bf16 .* use --precision {auto} "
                                                            r"\(what auto picks here\)"):
            resolve_precision("bf16", cuda)
        # refused is not "emulated"
        features = support.device_features(cuda)
        assert not support.emulated_precisions(cuda, features)["bf16-mixed"]


def test_resolve_precision_maps_aliases_and_refuses_unknown_names():
    assert resolve_precision("mixed_bfloat16", CPU).name == "bf16-mixed"
    assert resolve_precision("32", CPU).name == "32-true"
    with pytest.raises(UserError, match="unknown precision 'fp12'"):
        resolve_precision("fp12", CPU)


def test_needs_name_the_hardware_per_kind():
    needs = support.precision_needs(CPU)
    assert needs["bf16-true"] == needs["bf16-mixed"] and "AVX512-BF16" in needs["bf16-mixed"]
    assert "AVX512-FP16" in needs["16-mixed"] and needs["32-true"] == "any CPU"


@pytest.mark.parametrize("cap,bf16,fp16", [
    ("", True, True), ("ALL", True, True), ("AVX2", False, False),
    ("AVX512_CORE", False, False), ("AVX512_CORE_BF16", True, False),
    ("AVX512_CORE_AMX", True, True),
])
def test_onednn_isa_cap_decides_what_is_native(monkeypatch, cap, bf16, fp16):
    # A Sapphire Rapids CPU, capped the way ONEDNN_MAX_CPU_ISA caps oneDNN.
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    flags = {**NO_FLAGS, "amx_bf16": True, "amx_tile": True, "avx512_bf16": True,
             "avx512_fp16": True}
    features = support.device_features(CPU, flags)
    assert (features["bf16"], features["fp16"]) == (bf16, fp16)


def test_avx512_without_bf16_is_emulated_and_never_auto(monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(support, "cpu_flags", lambda: dict(NO_FLAGS))  # Skylake: AVX512 only
    assert not support.cpu_has_native_bf16()
    assert support.emulated_precisions(CPU, support.device_features(CPU))["bf16-mixed"]
    assert support.auto_mode(CPU) == "32-true"


def test_emulated_modes_run_at_fp32_speed_unless_switched_off(monkeypatch):
    features = {**support.device_features(CPU, NO_FLAGS), "bf16": False, "fp16": False}
    fast = support.emulated_fast(CPU, features)
    assert fast == support.emulated_precisions(CPU, features)
    assert support.emulation_label(True, True) == "emulated (native numerics, fp32 speed)"
    assert support.emulation_label(True, False) == "emulated (slow)"
    assert support.emulation_label(False, True) is None
    monkeypatch.setenv("AMPTRAIN_EMULATION", "off")
    # the switch is about half precision: the low-bit formats have no other CPU path
    assert {name for name, on in support.emulated_fast(CPU, features).items() if on} == \
        {name for name, spec in support.MODES.items() if spec.lowbit}
