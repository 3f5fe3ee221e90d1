"""Per-module precision overrides installed by wrapping ``module.forward``.

* fp32 islands (``keep_fp32``): the matching modules see fp32 inputs and run with
  autocast disabled, the generalised Keras rule "keep the output layer in float32".
* CPU fp16 convolutions: on CPUs without AMX-FP16, PyTorch's fp16 convolution backward
  falls back to a reference kernel over 100x slower than fp32. We run the forward in
  fp16 as autocast would and compute the backward in fp32, rounding the results to
  fp16 -- what a GPU's tensor cores do (fp32 accumulation, fp16 outputs).
* CPU fp32-islands: under fp16 (:data:`CPU_FP16_FP32_TYPES`) norm layers, which CUDA
  autocast runs in fp32 but CPU autocast leaves in fp16, and recurrent layers, whose fp16
  oneDNN kernels fail on CPU when gradients are needed; under bf16 on a CPU where oneDNN
  has no bf16 kernels (AVX2-only, :data:`CPU_BF16_NO_KERNEL_FP32_TYPES`) recurrent layers.

Wrapping ``forward`` on the instance leaves parameter names and state_dict keys
untouched, so checkpoints do not depend on the precision.
"""
from __future__ import annotations

import contextlib
import fnmatch
import functools
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn
from torch.nn import functional as F

from ..common import nested
from ..common.errors import UserError, warn
from .hardware.support import onednn_has_bf16_kernels


#: A model may name the modules it wants in fp32 by default in this attribute (a list of
#: --keep-fp32 patterns): ``keras:`` models name their output layer, Keras's rule. They join
#: the user's ``keep_fp32``; the model's own option turns them off (``keras:F,fp32_output=0``).
DEFAULT_KEEP_FP32 = "amptrain_keep_fp32"


def default_keep_fp32(model: nn.Module) -> list[str]:
    """The --keep-fp32 patterns ``model`` asks for itself (:data:`DEFAULT_KEEP_FP32`)."""
    return [str(p) for p in getattr(model, DEFAULT_KEEP_FP32, None) or ()]


def match_modules(model: nn.Module, patterns: Iterable[str]) -> dict[str, nn.Module]:
    """Modules whose qualified name matches any glob; a pattern matching none is an error."""
    named = dict(model.named_modules())
    matched: dict[str, nn.Module] = {}
    for pattern in patterns:
        hits = {name: m for name, m in named.items() if name and fnmatch.fnmatchcase(name, pattern)}
        if not hits:
            examples = ", ".join(n for n in list(named)[1:7])
            raise UserError(f"--keep-fp32 {pattern!r} matches no module; "
                            f"names look like: {examples}")
        matched.update(hits)
    # A matched module's descendants already run inside its fp32 region.
    return {name: m for name, m in matched.items()
            if not any(name.startswith(other + ".") for other in matched)}


def _cast_floats(value: Any, dtype: torch.dtype) -> Any:
    return nested.map_tensors(
        lambda tensor: tensor.to(dtype) if tensor.is_floating_point() else tensor, value)


class ForwardPatches:
    """Installed forward wrappers, removable to give the user back an untouched module."""

    def __init__(self) -> None:
        self._patched: list[nn.Module] = []
        self._removed: list[tuple[nn.Module, Callable]] = []  # what remove() took off

    def wrap(self, module: nn.Module, make_forward: Callable[[Callable], Callable]) -> None:
        original = module.forward
        module.forward = functools.wraps(original)(make_forward(original))
        self._patched.append(module)

    def remove(self) -> None:
        for module in self._patched:
            forward = module.__dict__.pop("forward", None)
            if forward is not None:
                self._removed.append((module, forward))
        self._patched.clear()

    @contextlib.contextmanager
    def reinstated(self) -> Iterator[None]:
        """The removed wrappers back for a block (evaluating after training), then off."""
        for module, forward in self._removed:
            module.forward = forward
        try:
            yield
        finally:
            for module, _ in self._removed:
                module.__dict__.pop("forward", None)


def install_fp32_islands(patches: ForwardPatches, modules: Iterable[nn.Module],
                         device_type: str) -> None:
    """Run ``modules`` in fp32 with autocast off; their outputs come back fp32."""
    def make_forward(original: Callable) -> Callable:
        def forward(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = _cast_floats(args, torch.float32), _cast_floats(kwargs, torch.float32)
            with torch.autocast(device_type, enabled=False):
                return original(*args, **kwargs)
        return forward

    for module in modules:
        patches.wrap(module, make_forward)


_CONV_FUNCTIONS: dict[type[nn.Module], Callable[..., torch.Tensor]] = {
    nn.Conv1d: F.conv1d, nn.Conv2d: F.conv2d, nn.Conv3d: F.conv3d}


class _HalfConvFp32Backward(torch.autograd.Function):
    """fp16 convolution forward; backward computed in fp32 and rounded to fp16."""

    @staticmethod
    def forward(ctx, x, weight, bias, conv, stride, padding, dilation, groups):  # noqa: D102
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.conf = (stride, padding, dilation, groups)
        x16, w16 = x.to(torch.float16), weight.to(torch.float16)
        b16 = None if bias is None else bias.to(torch.float16)
        ctx.save_for_backward(x16, w16)
        ctx.bias_shape = None if bias is None else list(bias.shape)
        with torch.autocast("cpu", enabled=False):
            return conv(x16, w16, b16, stride, padding, dilation, groups)

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102
        x16, w16 = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conf
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        gx, gw, gb = torch.ops.aten.convolution_backward(
            grad_out.float(), x16.float(), w16.float(), ctx.bias_shape, stride, padding,
            dilation, False, [0] * len(stride), groups, [need_x, need_w, need_b])
        x_dtype, w_dtype, b_dtype = ctx.dtypes

        def rounded(g, dtype):
            # Round through fp16 as an fp16 kernel's output would be, then hand back the
            # dtype autocast's cast node would have produced.
            return None if g is None else g.to(torch.float16).to(dtype)

        return (rounded(gx, x_dtype), rounded(gw, w_dtype), rounded(gb, b_dtype),
                None, None, None, None, None)


def install_cpu_fp16_conv(patches: ForwardPatches, model: nn.Module,
                          skip: set[nn.Module]) -> int:
    """Route the model's zero-padded convolutions through :class:`_HalfConvFp32Backward`."""
    count = 0
    for module in model.modules():
        conv = _CONV_FUNCTIONS.get(type(module))
        if conv is None or module in skip or module.padding_mode != "zeros" \
                or isinstance(module.padding, str):
            continue

        def make_forward(original: Callable, module: nn.Module = module, conv=conv) -> Callable:
            def forward(x: torch.Tensor) -> torch.Tensor:
                if not (torch.is_autocast_enabled("cpu")
                        and torch.get_autocast_dtype("cpu") == torch.float16):
                    return original(x)
                return _HalfConvFp32Backward.apply(
                    x, module.weight, module.bias, conv, module.stride, module.padding,
                    module.dilation, module.groups)
            return forward

        patches.wrap(module, make_forward)
        count += 1
    return count


#: Modules that run as fp32 islands under CPU fp16 autocast, and why:
#:
#: * norm layers: CUDA autocast puts layer_norm, group_norm and rms_norm on its fp32
#:   list, so their outputs -- and a post-norm residual stream -- are fp32 there. CPU
#:   autocast (torch 2.13) does not: an fp16 input gives an fp16 output, and a residual
#:   ``x + block(x)`` summed in fp16 overflows at 65504 where CUDA's does not. (The CPU
#:   kernels accumulate in fp32 inside, so the norm itself is accurate; its output dtype
#:   is the difference.) Softmax and scaled_dot_product_attention need nothing: their CPU
#:   kernels also accumulate in fp32 and stay finite for scores beyond fp16's range
#:   (tests/precision/test_islands.py checks both).
#: * recurrent layers: oneDNN has no fp16 LSTM; with gradients enabled the fp16 call
#:   fails ("could not create a primitive descriptor for the LSTM forward propagation
#:   primitive"). GRU and RNN take the same path.
CPU_FP16_FP32_TYPES: tuple[type[nn.Module], ...] = (
    nn.LayerNorm, nn.GroupNorm, *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()), nn.RNNBase)


#: Modules that run as fp32 islands under CPU bf16 autocast where oneDNN has no bf16
#: kernels (an AVX2-only CPU): its bf16 LSTM primitive does not exist there ("could not
#: create a primitive descriptor for the LSTM forward propagation primitive"); GRU and RNN
#: take the same path. Norms are fine: bf16 has fp32's range.
CPU_BF16_NO_KERNEL_FP32_TYPES: tuple[type[nn.Module], ...] = (nn.RNNBase,)


def cpu_fp32_island_types(compute_dtype: torch.dtype | None,
                          bf16_kernels: bool) -> tuple[type[nn.Module], ...]:
    """The module types that run in fp32 under CPU autocast in ``compute_dtype``."""
    if compute_dtype == torch.float16:
        return CPU_FP16_FP32_TYPES
    if compute_dtype == torch.bfloat16 and not bf16_kernels:
        return CPU_BF16_NO_KERNEL_FP32_TYPES
    return ()


def cpu_fp32_modules(model: nn.Module, types: tuple[type[nn.Module], ...],
                     skip: Iterable[nn.Module] = ()) -> list[nn.Module]:
    """The model's modules of ``types``, outside ``skip``'s subtrees.

    A module inside another match (or inside a keep_fp32 island) is already in fp32.
    """
    if not types:
        return []
    skipped = {id(m) for root in skip for m in root.modules()}
    found: list[nn.Module] = []
    covered: set[int] = set()
    for module in model.modules():
        if id(module) in skipped or id(module) in covered:
            continue
        if isinstance(module, types):
            found.append(module)
            covered.update(id(m) for m in module.modules())
    return found


def cpu_fp32_layers(model: nn.Module, compute_dtype: torch.dtype | None,
                    device: torch.device, islands: Iterable[nn.Module],
                    mode: str) -> list[nn.Module]:
    """Layers whose CPU half kernels are missing or differ from CUDA's, to run in fp32:
    norms and RNNs under fp16, RNNs under bf16 without oneDNN's bf16 kernels (AVX2); none
    on a GPU. ``islands``: the keep_fp32 modules (already fp32); ``mode`` names the
    precision in the warning about recurrent layers."""
    if device.type != "cpu":
        return []
    kinds = cpu_fp32_island_types(compute_dtype, onednn_has_bf16_kernels())
    layers = cpu_fp32_modules(model, kinds, skip=islands)
    if layers and compute_dtype != torch.float16:
        warn(f"{mode}: oneDNN has no bf16 kernels on this CPU; {len(layers)} "
             f"recurrent layer(s) run as fp32 islands")
    return layers


def install_cpu_fp32_islands(patches: ForwardPatches, modules: Iterable[nn.Module],
                             dtype: torch.dtype) -> int:
    """Run ``modules`` in fp32 (inputs cast up, autocast off) while CPU autocast in
    ``dtype`` is on.

    Outside that autocast (evaluation in another mode, a plain forward) they run as they
    are. Their own weights must be fp32, which :func:`~.master.modules_kept_fp32` ensures
    for the half-weight modes.
    """
    def make_forward(original: Callable) -> Callable:
        def forward(*args: Any, **kwargs: Any) -> Any:
            if not (torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == dtype):
                return original(*args, **kwargs)
            args = _cast_floats(args, torch.float32)
            kwargs = _cast_floats(kwargs, torch.float32)
            with torch.autocast("cpu", enabled=False):
                return original(*args, **kwargs)
        return forward

    count = 0
    for module in modules:
        patches.wrap(module, make_forward)
        count += 1
    return count


def install_forward_patches(patches: ForwardPatches, model: nn.Module, *, device_type: str,
                            compute_dtype: torch.dtype | None, islands: list[nn.Module],
                            cpu_fp32: list[nn.Module], fp16_conv_in_fp32: bool) -> None:
    """A mode's forward wrappers on ``model``: the ``keep_fp32`` ``islands``, the CPU's
    fp32 layers (:func:`cpu_fp32_modules`) and, with ``fp16_conv_in_fp32`` (fp16 on a CPU
    that does not emulate it: emulation computes convolutions in fp32 anyway), fp16
    convolutions whose backward runs in fp32 (:func:`install_cpu_fp16_conv`)."""
    install_fp32_islands(patches, islands, device_type)
    if fp16_conv_in_fp32:
        install_cpu_fp16_conv(patches, model, skip=set(islands))
    if cpu_fp32 and compute_dtype is not None:
        install_cpu_fp32_islands(patches, cpu_fp32, compute_dtype)
