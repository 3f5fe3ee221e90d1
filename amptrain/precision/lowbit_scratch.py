"""Reusable temporaries of the emulated low-bit quantisers.

A quantiser makes a few temporaries the size of its operand (the magnitudes' exponent
bits, the stochastic rounding's random offsets, the block maxima's first halving). Made
afresh on every call, each one of several MB comes back from the C allocator as new pages
(glibc returns freed heap to the kernel past its trim threshold), and on the CPU the page
faults cost more than the arithmetic: on the gpt of ``benchmarks/lowbit.py`` they were a
third of the NVFP4 recipe's quantisation time. Here each temporary has a named slot whose
storage is kept and reused, per thread and device: a step of the emulated recipe then
allocates little more than its outputs.

A slot's tensor holds garbage and lives until the next :func:`scratch` call with the same
slot on the same thread: only for temporaries that die before the function that took
them returns (never returned, saved for backward, or used across a call that takes the
same slot). The storage kept is the largest operand's, a few times over, per thread;
:func:`release` frees it.
"""
from __future__ import annotations

import threading
from typing import Sequence

import torch


class _Slots(threading.local):
    def __init__(self) -> None:
        self.buffers: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}
        # each slot's views by shape: a hit is one dict look-up (the emulation takes a
        # few dozen temporaries per layer and step; slicing and viewing cost microseconds)
        self.views: dict[tuple[str, tuple[int, ...], torch.dtype, torch.device],
                         torch.Tensor] = {}


_SLOTS = _Slots()


def scratch(slot: str, shape: Sequence[int], dtype: torch.dtype,
            device: torch.device) -> torch.Tensor:
    """An uninitialised contiguous tensor of ``shape`` in ``slot``'s reused storage."""
    shape = tuple(shape)
    key = (slot, shape, dtype, device)
    view = _SLOTS.views.get(key)
    if view is not None:
        return view
    numel = 1
    for size in shape:
        numel *= int(size)
    base = (slot, dtype, device)
    buffer = _SLOTS.buffers.get(base)
    if buffer is None or buffer.numel() < numel:
        # A normal tensor even under inference_mode (an inference tensor could not be
        # written outside it later); outside autograd (temporaries carry no history).
        with torch.inference_mode(False), torch.no_grad():
            buffer = torch.empty(numel, dtype=dtype, device=device)
        _SLOTS.buffers[base] = buffer
        _SLOTS.views = {k: v for k, v in _SLOTS.views.items() if k[0] != slot
                        or k[2:] != base[1:]}   # views of the old storage
    with torch.inference_mode(False), torch.no_grad():
        view = buffer[:numel].view(shape)
    _SLOTS.views[key] = view
    return view


def release() -> None:
    """Free this thread's kept temporaries."""
    _SLOTS.buffers.clear()
    _SLOTS.views.clear()
