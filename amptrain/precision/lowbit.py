"""``--precision fp8 / fp8-rowwise / mxfp8 / mxfp4 / nvfp4``: low-bit matmuls in eligible
Linear layers, bf16 autocast elsewhere, fp32 weights and checkpoints.

Natively (fp8 and fp8-rowwise on CUDA compute capability 8.9+ with torchao) the layers
become torchao ``Float8Linear`` (:mod:`.fp8`). Everywhere else the formats are
*emulated*: each planned layer's forward is swapped (through the precision's
``ForwardPatches``, so ``teardown`` gives the module its forward back) for
:class:`_LowBitLinear`, which quantises and dequantises each GEMM operand with the
format's exact rules (:mod:`.lowbit_formats`), multiplies in fp32 and returns the output
in the autocast dtype. The backward quantises the same way, following torchao's recipes
for which operand is scaled along which axis:

============  ==========================  ====================================
format        forward (input, weight)     backward
============  ==========================  ====================================
fp8           e4m3, one scale per tensor  grad_output e5m2 per tensor; the
                                          forward's fp8 input and weight reused
fp8-rowwise   e4m3, power-of-2 scale per  every operand e4m3, scaled along the
              row of the reduction axis   GEMM's own reduction axis
mxfp8         e4m3, e8m0 scale per 32     as rowwise, in blocks of 32
mxfp4         e2m1, e8m0 scale per 32     as rowwise, in blocks of 32
nvfp4         e2m1, e4m3 scale per 16 +   as rowwise, in blocks of 16
              fp32 scale per tensor
============  ==========================  ====================================

NVIDIA's NVFP4 training recipe adds random Hadamard transforms and stochastic rounding
of gradients on top of these numerics; the emulation rounds to nearest everywhere.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ..common.errors import flag, warn
from .fp8 import Float8Plan, convert_linears, plan_float8
from .islands import ForwardPatches
from .lowbit_formats import MX_BLOCK, NVFP4_BLOCK, Quantiser
from .modes import ModeSpec
from .hardware.support import lowbit_native

log = logging.getLogger("amptrain")


@dataclass(frozen=True)
class Recipe:
    """How a format quantises the three operands of a Linear's GEMMs."""

    name: str
    input: Quantiser
    weight: Quantiser
    grad_output: Quantiser
    #: The GEMM's dimensions must be multiples of this (fp8: torch._scaled_mm's 16;
    #: MX: the 32-value block; NVFP4: the 16-value block).
    dim_multiple: int
    #: Native hardware: ``fp8`` (sm89+, torchao Float8Linear) or None (emulated only).
    native: str | None
    #: torchao's Float8LinearRecipeName for the native path.
    torchao_recipe: str | None
    summary: str

    @property
    def tensorwise(self) -> bool:
        """One scale per tensor: the forward's quantised operands serve the backward too."""
        return self.input.scaling == "tensorwise"


def _same(scaling: str, elem: str) -> tuple[Quantiser, Quantiser, Quantiser]:
    quantiser = Quantiser(scaling, elem)
    return quantiser, quantiser, quantiser


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("fp8", Quantiser("tensorwise", "e4m3"), Quantiser("tensorwise", "e4m3"),
           Quantiser("tensorwise", "e5m2"), 16, "fp8", "tensorwise",
           "fp8 e4m3 forward, e5m2 gradients, one dynamic scale per tensor"),
    Recipe("fp8-rowwise", *_same("rowwise", "e4m3"), 16, "fp8", "rowwise",
           "fp8 e4m3 everywhere, a power-of-two scale per row"),
    Recipe("mxfp8", *_same("mx", "e4m3"), MX_BLOCK, None, None,
           "MXFP8: e4m3 values, a power-of-two (e8m0) scale per 32"),
    Recipe("mxfp4", *_same("mx", "e2m1"), MX_BLOCK, None, None,
           "MXFP4: e2m1 values, a power-of-two (e8m0) scale per 32"),
    Recipe("nvfp4", *_same("nvfp4", "e2m1"), NVFP4_BLOCK, None, None,
           "NVFP4: e2m1 values, an e4m3 scale per 16 and an fp32 scale per tensor"),
)}


def _fp32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.dtype == torch.float32 else tensor.float()


class _LowBitLinear(torch.autograd.Function):
    """``x @ W.T + b`` with every GEMM operand quantised by ``recipe`` and fp32 GEMMs."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                recipe: Recipe, out_dtype: torch.dtype) -> torch.Tensor:  # noqa: D102
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        with torch.autocast(x.device.type, enabled=False):
            qx, qw = recipe.input(x2, -1), recipe.weight(weight, -1)
            out = torch.addmm(_fp32(bias), qx, qw.t()) if bias is not None else qx @ qw.t()
        ctx.recipe, ctx.has_bias = recipe, bias is not None
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.x_shape = shape
        # Tensorwise scales do not depend on the axis: the backward reuses qx and qw.
        ctx.save_for_backward(*((qx, qw) if recipe.tensorwise else (x2, weight)))
        return out.to(out_dtype).reshape(*shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # noqa: D102
        recipe: Recipe = ctx.recipe
        first, second = ctx.saved_tensors
        g2 = _fp32(grad.reshape(-1, grad.shape[-1]))
        with torch.autocast(grad.device.type, enabled=False):
            if recipe.tensorwise:
                qg = recipe.grad_output(g2)
                grad_x, grad_w = qg @ second, qg.t() @ first
            else:  # each GEMM quantises along its own reduction axis
                grad_x = recipe.grad_output(g2, -1) @ recipe.weight(second, 0)
                grad_w = recipe.grad_output(g2, 0).t() @ recipe.input(first, 0)
            grad_b = g2.sum(0) if ctx.has_bias else None
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        return (grad_x.to(x_dtype).reshape(ctx.x_shape), grad_w.to(w_dtype),
                None if grad_b is None else grad_b.to(b_dtype), None, None)


def lowbit_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  recipe: Recipe) -> torch.Tensor:
    """``F.linear`` in ``recipe``'s emulated numerics; the output in the autocast dtype
    where autocast is on (as autocast's linear), else in ``x``'s dtype."""
    device = x.device.type
    out_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) \
        else x.dtype
    return _LowBitLinear.apply(x, weight, bias, recipe, out_dtype)


def install_lowbit_linears(patches: ForwardPatches, model: nn.Module, plan: Float8Plan,
                           recipe: Recipe) -> None:
    """Swap the planned Linear layers' forwards for the emulated low-bit linear."""
    modules = dict(model.named_modules())
    for name in plan.convert:
        module = modules[name]
        assert isinstance(module, nn.Linear)  # the plan holds plain Linear layers only

        def make_forward(original: Callable, module: nn.Linear = module) -> Callable:
            def forward(x: torch.Tensor) -> torch.Tensor:
                return lowbit_linear(x, module.weight, module.bias, recipe)
            return forward
        patches.wrap(module, make_forward)


def setup_lowbit(model: nn.Module, patches: ForwardPatches, spec: ModeSpec,
                 device: torch.device, islands: list[str], skip_first_last: bool) -> Float8Plan:
    """Plan ``spec``'s eligible Linear layers and make them low-bit: torchao's
    ``Float8Linear`` where the format is native on ``device``, else the emulated forward.
    Logs the plan's one-line summary (a warning where nothing handles amptrain's log: a
    library caller's run); warns (naming the flags) when nothing is eligible."""
    recipe = RECIPES[str(spec.lowbit)]
    native = lowbit_native(spec, device)
    plan = plan_float8(model, islands=islands, skip_first_last=skip_first_last,
                       dim_multiple=recipe.dim_multiple)
    if not plan.convert:
        why = f" ({plan.reasons()})" if plan.skipped else " (the model has no nn.Linear)"
        warn(f"{flag('precision')} {spec.name}: no Linear layer is eligible{why}, so nothing "
             f"runs in {recipe.name} and this trains like bf16-mixed; eligible are plain "
             f"nn.Linear layers with both dimensions multiples of {recipe.dim_multiple}, "
             f"outside {flag('keep_fp32')}, other than the first and the last")
    elif native:
        convert_linears(model, plan, recipe=recipe.torchao_recipe or "tensorwise")
    else:
        install_lowbit_linears(patches, model, plan, recipe)
    summary = plan.summary(recipe.name, emulated=not native)
    if log.hasHandlers():  # the command line's log (or the caller's logging set-up)
        log.info("%s", summary)
    elif plan.convert:  # a library caller has no handler: the line would go nowhere
        warn(summary)
    return plan


def lowbit_warning(spec: ModeSpec, device: torch.device) -> str | None:
    """The warning for training in a low-bit format that ``device`` only emulates (None
    where it is native): what the emulation computes and what it does not say."""
    if lowbit_native(spec, device):
        return None
    native = ("an NVIDIA GPU of compute capability 8.9+ (Ada, Hopper) with torchao"
              if spec.float8_linears else
              "Blackwell (sm100) GPUs, whose kernels amptrain does not drive yet")
    return (f"{spec.name} is emulated on this {device.type}: each Linear matmul's operands "
            f"are quantised with {spec.name}'s exact rules ({RECIPES[str(spec.lowbit)].summary}"
            f") and multiplied in fp32; use it to study {spec.name}'s accuracy, not its speed "
            f"or memory (native: {native})")


#: Bytes per element of each element format.
_ELEMENT_BYTES = {"e4m3": 1.0, "e5m2": 1.0, "e2m1": 0.5}


def quantised_weight_bytes(recipe: Recipe, weight: torch.Tensor) -> float:
    """Bytes of ``weight``'s low-bit copy in ``recipe``'s forward format, scales included
    (what the format's hardware materialises each step beside the fp32 weight):
    tensorwise one fp32 scale; rowwise one fp32 scale per output row; MX one e8m0 byte
    per 32 values; NVFP4 one e4m3 byte per 16 values and one fp32 scale."""
    rows, numel = weight.shape[0], weight.numel()
    quantiser = recipe.weight
    scales = {"tensorwise": 4.0, "rowwise": 4.0 * rows, "mx": numel / MX_BLOCK,
              "nvfp4": numel / NVFP4_BLOCK + 4.0}[quantiser.scaling]
    return numel * _ELEMENT_BYTES[quantiser.elem] + scales


def lowbit_bytes(model: nn.Module, plan: Float8Plan | None, spec: ModeSpec) -> float:
    """The low-bit weight copies (and their scales) of ``plan``'s layers in ``spec``'s
    format; 0 for a mode without one."""
    if plan is None or not spec.lowbit:
        return 0.0
    modules = dict(model.named_modules())
    recipe = RECIPES[spec.lowbit]
    return sum(quantised_weight_bytes(recipe, modules[name].weight) for name in plan.convert)
