"""Emulated half precision at fp32 speed: the numerics of bf16/fp16 hardware computed with
fp32 kernels, on CPUs that have no hardware for the format.

A tensor-core (or AVX512-BF16/AMX) matmul does three things: it reads its inputs in the
half format, accumulates the products in fp32, and rounds the result once to the half
format (inf above fp16's 65504, fp16's subnormals below 6.1e-5). Its backward does the
same with the half gradient. Computing exactly that with fp32 kernels -- round the
inputs, run the fp32 GEMM/convolution/attention, round the output -- costs one fp32
step plus a few casts, while PyTorch's own fp16/bf16 CPU kernels without the hardware
run 5-15x slower than fp32 (conversions around every element, reference loops).

How: the autocast kernels of the ops that autocast runs in half precision on the CPU
(:data:`EMULATED_OPS`: linear, matmul, mm, bmm, addmm, baddbmm, addbmm, convolutions and
scaled_dot_product_attention) are replaced, through ``torch.library``, at the
``AutocastCPU`` dispatch key. While an :class:`EmulatedAutocast` context of the same
dtype is active in the thread, such an op

1. rounds every floating input to the half dtype and back up (:func:`round_in`: two
   casts, whose backward autograd runs natively: the input's gradient rounded to the
   half dtype, as the half kernel's backward output is, and handed back in the input's
   own dtype, as autocast's cast node does),
2. runs the fp32 op with autocast off (fp32 kernels, fp32 accumulation; its fp32
   backward is recorded by autograd as usual), and
3. returns the result cast to the half dtype (a plain ``.to``: its backward turns the
   incoming half gradient into fp32 exactly). An op on fp64 tensors, which autocast
   never casts, returns its fp64 result as under native autocast.

So every tensor a model or a loss sees has exactly the dtype native autocast gives
(half outputs, fp32 gradients of fp32 weights, half gradients of half weights): the loss
scaler, overflow detection, master weights and hooks behave as on native hardware, and
the forward and backward values are those of a half kernel that accumulates in fp32.
The only differences from a native kernel are the order of the fp32 accumulation
(a few units in the last place of the half result; tests/precision/test_emulation.py
measures them) and what a native kernel does inside a fused op (CPU flash attention
rounds the softmax probabilities to the half type before multiplying by V; here the
whole attention is fp32 between the rounded q, k, v and the rounded output).

Why at the autocast dispatch key, and not a ``TorchFunctionMode`` or swapped module
forwards: the dispatcher sees every call, including those made inside Python composites
(``F.multi_head_attention_forward``, which a function mode cannot enter without
re-dispatching to itself) and C++ ones; ops outside the list pay nothing; and the
dtypes come out exactly as autocast's because the replaced kernel is autocast's own.
Module swaps would miss functional calls (``q @ k.T``, SDPA). The registration is made
once per process (the first emulated setup) and stays; outside an emulating context the
replacement does what autocast does (cast eligible inputs, run the op), so other
autocast users in the process see no change but a Python call per listed op.

Memory: the fp32 op saves fp32 copies of its (rounded) inputs for backward where a
native kernel saves half ones, so emulated runs' peak memory is not the hardware's.

``AMPTRAIN_EMULATION=off`` turns the replacement off for precisions created afterwards:
they then run PyTorch's own half kernels (slow, for comparison in tests and benchmarks).
"""
from __future__ import annotations

import os
import threading
import warnings
from types import TracebackType
from typing import Any, Callable

import torch

#: ``off`` (or ``0``/``no``/``native``) runs emulated precisions on PyTorch's own half CPU
#: kernels instead, the slow path this module replaces.
ENV_SWITCH = "AMPTRAIN_EMULATION"
_OFF = ("off", "0", "no", "false", "native")

_HALF = (torch.float16, torch.bfloat16)

#: The CPU-autocast ops (``aten`` overload names) computed in fp32 with half rounding:
#: every lower-precision op of torch's CPU autocast list that a model trains through,
#: except prelu (elementwise), linalg_vecdot and conv_tbc (rare) and the RNN kernels
#: (recurrent layers run as fp32 islands on the CPU, see islands.py).
EMULATED_OPS = ("linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "addbmm",
                "conv1d", "conv1d.padding", "conv2d", "conv2d.padding", "conv3d",
                "conv3d.padding", "conv_transpose1d", "conv_transpose2d.input",
                "conv_transpose3d.input", "scaled_dot_product_attention")


def emulation_switched_on() -> bool:
    """False when ``AMPTRAIN_EMULATION`` asks for PyTorch's own (slow) half kernels."""
    return os.environ.get(ENV_SWITCH, "").strip().lower() not in _OFF


def _eligible(value: Any) -> bool:
    """Autocast's rule: CPU floating tensors other than fp64 are cast."""
    return isinstance(value, torch.Tensor) and value.is_floating_point() \
        and value.dtype != torch.float64 and value.device.type == "cpu"


def round_in(x: torch.Tensor, half: torch.dtype) -> torch.Tensor:
    """``x`` rounded to ``half``, as fp32. Its gradient is rounded to ``half`` and returned
    in ``x``'s dtype, as a half kernel's backward and autocast's cast give: autograd's own
    backward of the two casts does exactly that, with no Python in the backward."""
    return x.to(half).float()


class _State(threading.local):
    def __init__(self) -> None:
        self.dtypes: list[torch.dtype] = []   # the active EmulatedAutocast contexts'


_STATE = _State()
_LOCK = threading.Lock()
_LIBRARY: torch.library.Library | None = None


def _kernel(op: Callable[..., Any]) -> Callable[..., Any]:
    """The ``AutocastCPU`` kernel replacing autocast's for ``op``."""
    def kernel(*args: Any, **kwargs: Any) -> Any:
        half = torch.get_autocast_dtype("cpu")
        emulate = bool(_STATE.dtypes) and _STATE.dtypes[-1] == half
        if emulate:
            args = tuple(round_in(a, half) if _eligible(a) else a for a in args)
            kwargs = {k: round_in(v, half) if _eligible(v) else v for k, v in kwargs.items()}
        else:  # what autocast's own kernel does
            args = tuple(a.to(half) if _eligible(a) else a for a in args)
            kwargs = {k: v.to(half) if _eligible(v) else v for k, v in kwargs.items()}
        with torch.autocast("cpu", enabled=False):
            out = op(*args, **kwargs)
        # Only a result computed in fp32 from rounded inputs is a half kernel's: autocast
        # leaves fp64 alone (FD statistics, metric sums), so an fp64 product stays fp64.
        return out.to(half) if emulate and out.dtype == torch.float32 else out
    return kernel


def install_emulated_kernels() -> None:
    """Register the replacement kernels (once per process; idempotent, thread-safe)."""
    global _LIBRARY
    with _LOCK:
        if _LIBRARY is not None:
            return
        library = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            # torch warns once that a kernel is overridden: that is the point here.
            warnings.simplefilter("ignore", UserWarning)
            for name in EMULATED_OPS:
                base, _, overload = name.partition(".")
                op = getattr(getattr(torch.ops.aten, base), overload or "default")
                library.impl(name, _kernel(op), "AutocastCPU")
        _LIBRARY = library


class EmulatedAutocast:
    """CPU autocast in ``dtype`` whose matmuls, convolutions and attention are emulated
    (see the module doc); a drop-in for ``torch.autocast("cpu", dtype=dtype)``."""

    def __init__(self, dtype: torch.dtype) -> None:
        if dtype not in _HALF:
            raise ValueError(f"emulation is for float16/bfloat16, not {dtype}")
        self.dtype = dtype
        self._autocast = torch.autocast("cpu", dtype=dtype)

    def __enter__(self) -> EmulatedAutocast:
        install_emulated_kernels()
        self._autocast.__enter__()
        _STATE.dtypes.append(self.dtype)
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        _STATE.dtypes.pop()
        self._autocast.__exit__(kind, value, traceback)

