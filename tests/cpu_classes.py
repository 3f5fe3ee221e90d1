"""The four CPU classes amptrain must give true advice on, faked for tests.

:func:`fake_cpu` makes ``/proc/cpuinfo`` and oneDNN answer as that class everywhere
amptrain asks (``support``, ``advice``, ``env``, the precision layer), with no GPU visible
and no ``ONEDNN_MAX_CPU_ISA`` cap, so the same test checks each class on any machine.
"""
from __future__ import annotations

import pytest
import torch

NO_FLAGS = {"amx_bf16": False, "amx_fp16": False, "amx_tile": False, "avx512_bf16": False,
            "avx512_fp16": False}

#: class -> (/proc/cpuinfo flags, oneDNN has bf16 kernels: AVX512 and up)
CPU_CLASSES = {
    # Intel Sapphire Rapids: AMX-BF16 tiles, AVX512-FP16 vectors, no AMX-FP16
    "amx": ({"amx_bf16": True, "amx_tile": True, "avx512_bf16": True, "avx512_fp16": True},
            True),
    # AMD EPYC Zen 4 (the development machine): AVX512-BF16, no fp16 units
    "avx512-bf16": ({"avx512_bf16": True}, True),
    # Skylake/Cascade Lake Xeon: AVX512 without BF16 (oneDNN emulates bf16 kernels)
    "avx512": ({}, True),
    # AMD EPYC Zen 2/3: AVX2 only (oneDNN has no bf16 kernels at all)
    "avx2": ({}, False),
}


def fake_cpu(monkeypatch: pytest.MonkeyPatch, name: str) -> dict[str, bool | None]:
    """Make amptrain see a CPU of class ``name`` (a key of :data:`CPU_CLASSES`)."""
    import amptrain.precision.islands
    from amptrain.precision.hardware import advice, probe, support

    extra, kernels = CPU_CLASSES[name]
    flags: dict[str, bool | None] = {**NO_FLAGS, **extra}
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(support, "cpu_flags", lambda path=None: dict(flags))
    monkeypatch.setattr(probe, "cpu_flags", lambda path=None: dict(flags))
    for module in (support, advice, amptrain.precision.islands):
        monkeypatch.setattr(module, "onednn_has_bf16_kernels", lambda: kernels)
    return flags
