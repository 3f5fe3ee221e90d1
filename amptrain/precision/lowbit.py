"""``--precision fp8 / fp8-rowwise / fp8-rowwise-gw-hp / fp8-blockwise / mxfp8 / mxfp4 /
nvfp4 / nvfp4-plain``: low-bit matmuls in eligible Linear layers, bf16 autocast elsewhere,
fp32 weights and checkpoints.

Natively (the fp8 recipes on CUDA compute capability 8.9+ with torchao; fp8-blockwise on
9.0+ with torchao's blockwise kernels) the layers become torchao's float8 Linear layers
(:mod:`.fp8`). Everywhere else the formats are *emulated*: each planned layer's forward
is swapped (through the precision's ``ForwardPatches``, so ``teardown`` gives the module
its forward back) for :class:`_LowBitLinear`, which quantises and dequantises each GEMM
operand with the format's exact rules (:mod:`.lowbit_formats`), multiplies in fp32 and
returns the output in the autocast dtype. The backward quantises the same way, following
torchao's (and Transformer Engine's) recipes for which operand is scaled along which axis:

==================  ===========================  =====================================
recipe              forward (input, weight)      backward
==================  ===========================  =====================================
fp8                 e4m3, one scale per tensor   grad_output e5m2 per tensor; the
                                                 forward's fp8 input and weight reused
fp8-rowwise         e4m3, power-of-2 scale per   every operand e4m3, scaled along the
                    row of the reduction axis    GEMM's own reduction axis
fp8-rowwise-gw-hp   as fp8-rowwise               grad-input: grad_output rowwise, the
                                                 weight one power-of-2 scale; weight
                                                 gradient GEMM unquantised (fp32)
fp8-blockwise       e4m3, fp32 scale per 1x128   grad_output 1x128 tiles along each
                    input tile, 128x128 weight   GEMM's reduction axis; input 128x1
                    block                        tiles; the same 128x128 weight blocks
mxfp8 / mxfp4       e4m3 / e2m1, e8m0 scale per  as rowwise, in blocks of 32
                    32 (FLOOR or RCEIL)
nvfp4               e2m1, fp32 scale per tensor  grad_output stochastically rounded;
                    + e4m3 per 16 (input) or     the weight-gradient GEMM's inputs
                    per 16x16 block (weight)     through a random Hadamard transform
nvfp4-plain         e2m1, e4m3 scale per 16 +    as rowwise, in blocks of 16, rounded
                    fp32 scale per tensor        to nearest
==================  ===========================  =====================================
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ..common.errors import flag, warn
from .fp8 import Float8Selection, convert_linears, plan_float8
from .islands import ForwardPatches
from .lowbit_formats import FP8_BLOCK, MX_BLOCK, NVFP4_BLOCK
from .lowbit_operand import Quantiser
from .lowbit_scratch import scratch
from .lowbit_training import StochasticSeeds, apply_rht
from .modes import ModeSpec
from .hardware.support import lowbit_native

log = logging.getLogger("amptrain")


@dataclass(frozen=True)
class Recipe:
    """How a format quantises the operands of a Linear's three GEMMs."""

    name: str
    input: Quantiser
    weight: Quantiser
    grad_output: Quantiser
    #: The GEMM's dimensions must be multiples of this (fp8: torch._scaled_mm's 16;
    #: MX: the 32-value block; NVFP4: the 16-value block; fp8-blockwise: 128).
    dim_multiple: int
    #: Native hardware: ``fp8`` (sm89+, torchao Float8Linear), ``fp8-blockwise`` (sm90+,
    #: torchao's blockwise kernels) or None (emulated only).
    native: str | None
    #: torchao's Float8LinearRecipeName for the native path.
    torchao_recipe: str | None
    summary: str
    #: The weight in the grad-input GEMM, where it is scaled otherwise than in the forward.
    weight_for_grad_input: Quantiser | None = None
    #: The weight-gradient GEMM's operands as they are, multiplied in fp32 (``GW_HP``).
    grad_weight_hp: bool = False
    #: The random Hadamard transform on the weight-gradient GEMM's inputs (NVFP4).
    hadamard: bool = False

    @property
    def tensorwise(self) -> bool:
        """One scale per tensor: the forward's quantised operands serve the backward too."""
        return self.input.scaling == "tensorwise"

    @property
    def stochastic(self) -> bool:
        """Gradients rounded stochastically (they need :class:`StochasticSeeds`)."""
        return self.grad_output.stochastic


def _same(scaling: str, elem: str, **options: Any) -> tuple[Quantiser, Quantiser, Quantiser]:
    quantiser = Quantiser(scaling, elem, **options)
    return quantiser, quantiser, quantiser


_ROWWISE = Quantiser("rowwise", "e4m3")
_TILES = Quantiser("blockwise", "e4m3")
_NVFP4 = Quantiser("nvfp4", "e2m1")

#: The format whose training recipe ``--nvfp4-without`` ablates (one part left out).
ABLATED = "nvfp4"

RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("fp8", Quantiser("tensorwise", "e4m3"), Quantiser("tensorwise", "e4m3"),
           Quantiser("tensorwise", "e5m2"), 16, "fp8", "tensorwise",
           "fp8 e4m3 forward, e5m2 gradients, one dynamic scale per tensor"),
    Recipe("fp8-rowwise", *_same("rowwise", "e4m3"), 16, "fp8", "rowwise",
           "fp8 e4m3 everywhere, a power-of-two scale per row"),
    Recipe("fp8-rowwise-gw-hp", _ROWWISE, _ROWWISE, _ROWWISE, 16, "fp8",
           "rowwise_with_gw_hp",
           "fp8 e4m3 rowwise forward and grad-input GEMMs, weight gradient in high precision",
           weight_for_grad_input=Quantiser("tensorwise", "e4m3", power_of_2=True),
           grad_weight_hp=True),
    Recipe("fp8-blockwise", _TILES, Quantiser("blockwise", "e4m3", square=True), _TILES,
           FP8_BLOCK, "fp8-blockwise", None,
           "DeepSeek-V3 fp8: e4m3, fp32 scales per 1x128 activation tile and 128x128 "
           "weight block"),
    Recipe("mxfp8", *_same("mx", "e4m3"), MX_BLOCK, None, None,
           "MXFP8: e4m3 values, a power-of-two (e8m0) scale per 32"),
    Recipe("mxfp4", *_same("mx", "e2m1"), MX_BLOCK, None, None,
           "MXFP4: e2m1 values, a power-of-two (e8m0) scale per 32"),
    Recipe("nvfp4", _NVFP4, Quantiser("nvfp4", "e2m1", square=True),
           Quantiser("nvfp4", "e2m1", stochastic=True), NVFP4_BLOCK, None, None,
           "NVFP4 training recipe: e2m1 values, e4m3 scales per 16 (16x16 weight blocks), "
           "an fp32 scale per tensor, stochastically rounded gradients, a random Hadamard "
           "transform on the weight-gradient GEMM", hadamard=True),
    Recipe("nvfp4-plain", *_same("nvfp4", "e2m1"), NVFP4_BLOCK, None, None,
           "NVFP4: e2m1 values, an e4m3 scale per 16 and an fp32 scale per tensor"),
)}


def format_recipe(fmt: str, mx_scale: str = "floor", without: str = "none") -> Recipe:
    """Format ``fmt``'s recipe (a key of :data:`RECIPES`) with its MX block scales chosen by
    ``mx_scale`` (``floor``/``rceil``; a format without MX blocks is as it is) and, for the
    NVFP4 training recipe, one part left out (``without``: ``rht``, ``sr``, ``2d``, the
    ablation; named ``nvfp4 without rht``): how a precision plan's layer in ``fmt``
    computes (the whole recipe), and what diagnose and plan's ranking measure it with."""
    recipe = RECIPES[fmt]
    if mx_scale != "floor" and recipe.input.scaling == "mx":
        rule = replace(recipe.input, mx_mode=mx_scale)
        recipe = replace(recipe, input=rule, weight=rule, grad_output=rule)
    if fmt != ABLATED or without == "none":
        return recipe
    if without == "rht":
        recipe = replace(recipe, hadamard=False)
    elif without == "sr":
        recipe = replace(recipe, grad_output=replace(recipe.grad_output, stochastic=False))
    elif without == "2d":
        recipe = replace(recipe, weight=replace(recipe.weight, square=False))
    return replace(recipe, name=f"{recipe.name} without {without}")


def recipe_for(spec: ModeSpec, mx_scale: str = "floor", without: str = "none") -> Recipe:
    """``spec``'s recipe, its MX scales computed by ``mx_scale`` (``floor``/``rceil``),
    and without one part of the NVFP4 recipe (``rht``, ``sr``, ``2d``: the ablation)."""
    return format_recipe(str(spec.lowbit), mx_scale, without)


def _fp32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.dtype == torch.float32 else tensor.float()


def _own_fp32(tensor: torch.Tensor, slot: str) -> tuple[torch.Tensor, bool]:
    """``tensor`` in fp32 and whether the result is ours to overwrite: ``tensor`` itself
    (the caller's), or its copy in a reused temporary (:mod:`.lowbit_scratch`: the
    emulation's several-MB temporaries cost more in new pages than in arithmetic)."""
    if tensor.dtype == torch.float32 or torch.is_grad_enabled():
        return _fp32(tensor), False
    return scratch(slot, tensor.shape, torch.float32, tensor.device).copy_(tensor), True


def _product(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
             dtype: torch.dtype, slot: str) -> torch.Tensor:
    """``a @ b (+ bias)`` in fp32, returned in ``dtype``: a new tensor; the fp32 product
    in a reused temporary where it is converted after."""
    out = None if dtype == torch.float32 or torch.is_grad_enabled() \
        else scratch(slot, (a.shape[0], b.shape[1]), torch.float32, a.device)
    product = torch.addmm(bias, a, b, out=out) if bias is not None else \
        torch.mm(a, b, out=out)
    return product.to(dtype)


class _LowBitLinear(torch.autograd.Function):
    """``x @ W.T + b`` with every GEMM operand quantised by ``recipe`` and fp32 GEMMs;
    ``seeds`` (with the layer's ``name``) feeds stochastic rounding."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                recipe: Recipe, out_dtype: torch.dtype, seeds: StochasticSeeds | None,
                name: str) -> torch.Tensor:  # noqa: D102
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        with torch.autocast(x.device.type, enabled=False):
            if recipe.tensorwise:   # qx kept for the backward: a tensor of its own
                qx = recipe.input(x2, -1)
            else:                   # used at once: it may be computed in reused storage
                x32, own = _own_fp32(x2, "input")
                qx = recipe.input(x32, -1, overwrite=own, into="q_input")
            qw = recipe.weight(weight, -1)
            out = _product(qx, qw.t(), None if bias is None else _fp32(bias), out_dtype,
                           "output")
        ctx.recipe, ctx.has_bias, ctx.seeds, ctx.name = recipe, bias is not None, seeds, name
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.x_shape = shape
        # Tensorwise scales do not depend on the axis: the backward reuses qx and qw; so
        # do square weight blocks (the same tiles whichever axis the GEMM reduces over).
        keep_w = qw if recipe.weight.square and recipe.weight_for_grad_input is None \
            else weight
        ctx.save_for_backward(*((qx, qw) if recipe.tensorwise else (x2, keep_w)))
        return out.reshape(*shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # noqa: D102
        recipe: Recipe = ctx.recipe
        first, second = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        g2, own_g = _own_fp32(grad.reshape(-1, grad.shape[-1]), "grad")
        with torch.autocast(grad.device.type, enabled=False):
            grad_b = g2.sum(0) if ctx.has_bias else None   # before g2 is quantised in place
            if recipe.tensorwise:
                qg = recipe.grad_output(g2)
                grad_x, grad_w = _product(qg, second, None, x_dtype, "grad_x"), \
                    qg.t() @ first
            else:  # each GEMM quantises along its own reduction axis
                gen = ctx.seeds.generator(ctx.name, g2.device) if recipe.stochastic \
                    else None
                weight_rule = recipe.weight_for_grad_input or recipe.weight
                qw = second if weight_rule.square else weight_rule(second, 0)
                x2, own_x = _own_fp32(first, "input")
                # the transform reads g2 before the grad-input GEMM's quantiser may take it
                wgrad = (apply_rht(g2, "rht_g"), True, apply_rht(x2, "rht_x"), True) \
                    if recipe.hadamard and not recipe.grad_weight_hp else \
                    (g2, own_g, x2, own_x)
                qg = recipe.grad_output(g2, -1, gen, overwrite=own_g and wgrad[0] is not g2,
                                        into="q_grad")
                grad_x = _product(qg, qw, None, x_dtype, "grad_x")
                grad_w = _grad_weight(recipe, *wgrad, gen)
        return (grad_x.reshape(ctx.x_shape), grad_w.to(w_dtype),
                None if grad_b is None else grad_b.to(b_dtype), None, None, None, None)


def _grad_weight(recipe: Recipe, g2: torch.Tensor, own_g: bool, x2: torch.Tensor,
                 own_x: bool, gen: torch.Generator | None) -> torch.Tensor:
    """``g^T x`` (reduced over tokens) in ``recipe``'s weight-gradient numerics, from the
    operands as they enter it (through the Hadamard transform already, where the recipe
    has one; ``own_*``: the operand may be quantised in place)."""
    if recipe.grad_weight_hp:
        return g2.t() @ x2
    return recipe.grad_output(g2, 0, gen, overwrite=own_g, into="q_grad").t() @ \
        recipe.input(x2, 0, overwrite=own_x, into="q_input")


def lowbit_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  recipe: Recipe, seeds: StochasticSeeds | None = None,
                  name: str = "") -> torch.Tensor:
    """``F.linear`` in ``recipe``'s emulated numerics; the output in the autocast dtype
    where autocast is on (as autocast's linear), else in ``x``'s dtype. A stochastic
    recipe needs ``seeds`` holding the layer ``name``."""
    if recipe.stochastic and seeds is None:
        seeds = StochasticSeeds(0, [name])
    device = x.device.type
    out_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) \
        else x.dtype
    return _LowBitLinear.apply(x, weight, bias, recipe, out_dtype, seeds, name)


def install_lowbit_linears(patches: ForwardPatches, model: nn.Module, plan: Float8Selection,
                           recipe: Recipe, seeds: StochasticSeeds | None = None) -> None:
    """Swap the planned Linear layers' forwards for the emulated low-bit linear."""
    modules = dict(model.named_modules())
    for name in plan.convert:
        module = modules[name]
        assert isinstance(module, nn.Linear)  # the plan holds plain Linear layers only

        def make_forward(original: Callable, module: nn.Linear = module,
                         name: str = name) -> Callable:
            def forward(x: torch.Tensor) -> torch.Tensor:
                return lowbit_linear(x, module.weight, module.bias, recipe, seeds, name)
            return forward
        patches.wrap(module, make_forward)


def install_blockwise_linears(patches: ForwardPatches, model: nn.Module,
                              plan: Float8Selection) -> None:
    """The native fp8-blockwise path (sm90+): each planned layer's forward runs torchao's
    ``fp8_blockwise_mm`` (1x128 / 128x128 e4m3 GEMMs, Triton kernels) on its own weight
    Parameter, the bias added after (torchao's module takes none)."""
    from torchao.prototype.blockwise_fp8_training.linear import fp8_blockwise_mm
    modules = dict(model.named_modules())
    for name in plan.convert:
        module = modules[name]

        def make_forward(original: Callable, module: nn.Module = module) -> Callable:
            def forward(x: torch.Tensor) -> torch.Tensor:
                out = fp8_blockwise_mm.apply(x.to(torch.bfloat16), module.weight, FP8_BLOCK,
                                             torch.bfloat16, True)
                return out if module.bias is None else out + module.bias.to(out.dtype)
            return forward
        patches.wrap(module, make_forward)


def keep_last_in_bf16(plan: Float8Selection, count: int) -> Float8Selection:
    """``plan`` with its last ``count`` layers (in module order) kept in bf16
    (``--lowbit-bf16-last``: the NVFP4 paper keeps the final blocks in higher precision)."""
    if count > 0:
        for name in plan.convert[-count:]:
            plan.skipped[name] = f"{flag('lowbit_bf16_last')} {count}"
        plan.convert = plan.convert[:-count]
    return plan


def setup_lowbit(model: nn.Module, patches: ForwardPatches, spec: ModeSpec,
                 device: torch.device, islands: list[str], skip_first_last: bool, *,
                 bf16_last: int = 0, mx_scale: str = "floor", without: str = "none",
                 seed: int = 0
                 ) -> tuple[Float8Selection, StochasticSeeds | None]:
    """Plan ``spec``'s eligible Linear layers and make them low-bit: torchao's float8
    layers where the format is native on ``device``, else the emulated forward. Returns
    the plan and, for a recipe that rounds stochastically, the layers' seeds (from
    ``seed``; checkpointed by the precision). Logs the plan's one-line summary (a warning
    where nothing handles amptrain's log: a library caller's run); warns (naming the
    flags) when nothing is eligible."""
    recipe = recipe_for(spec, mx_scale, without)
    native = lowbit_native(spec, device)
    plan = keep_last_in_bf16(plan_float8(model, islands=islands,
                                         skip_first_last=skip_first_last,
                                         dim_multiple=recipe.dim_multiple), bf16_last)
    seeds = StochasticSeeds(seed, plan.convert) if recipe.stochastic else None
    if not plan.convert:
        why = f" ({plan.reasons()})" if plan.skipped else " (the model has no nn.Linear)"
        warn(f"{flag('precision')} {spec.name}: no Linear layer is eligible{why}, so nothing "
             f"runs in {recipe.name} and this trains like bf16-mixed; eligible are plain "
             f"nn.Linear layers with both dimensions multiples of {recipe.dim_multiple}, "
             f"outside {flag('keep_fp32')}, other than the first and the last")
    elif native and recipe.native == "fp8-blockwise":
        install_blockwise_linears(patches, model, plan)
    elif native:
        convert_linears(model, plan, recipe=recipe.torchao_recipe or "tensorwise")
    else:
        install_lowbit_linears(patches, model, plan, recipe, seeds)
    summary = plan.summary(recipe.name, emulated=not native)
    if log.hasHandlers():  # the command line's log (or the caller's logging set-up)
        log.info("%s", summary)
    elif plan.convert:  # a library caller has no handler: the line would go nowhere
        warn(summary)
    return plan, seeds


def lowbit_warning(spec: ModeSpec, device: torch.device, shown: Sequence[str] = ()
                   ) -> str | None:
    """The warning for training in a low-bit format that ``device`` only emulates (None
    where it is native): what the emulation computes and what it does not say; ``shown``:
    the low-bit settings the run reads away from their defaults, in words
    (:func:`~.lowbit_settings.settings_shown`: ``without rht``)."""
    if lowbit_native(spec, device):
        return None
    native = {"fp8": "an NVIDIA GPU of compute capability 8.9+ (Ada, Hopper) with torchao",
              "fp8-blockwise": "an NVIDIA GPU of compute capability 9.0+ (Hopper) with "
                               "torchao's blockwise fp8 kernels (Triton)"}.get(
        str(RECIPES[str(spec.lowbit)].native),
        "Blackwell (sm100) GPUs, whose kernels amptrain does not drive yet")
    return (f"{spec.name} is emulated on this {device.type}: each Linear matmul's operands "
            f"are quantised with {spec.name}'s exact rules "
            f"({'; '.join([RECIPES[str(spec.lowbit)].summary, *shown])}"
            f") and multiplied in fp32; use it to study {spec.name}'s accuracy, not its speed "
            f"or memory (native: {native})")


#: Bytes per element of each element format.
_ELEMENT_BYTES = {"e4m3": 1.0, "e5m2": 1.0, "e2m1": 0.5}


def quantised_weight_bytes(recipe: Recipe, weight: torch.Tensor) -> float:
    """Bytes of ``weight``'s low-bit copy in ``recipe``'s forward format, scales included
    (what the format's hardware materialises each step beside the fp32 weight):
    tensorwise one fp32 scale; rowwise one fp32 scale per output row; MX one e8m0 byte
    per 32 values; NVFP4 one e4m3 byte per 16 values (per 16x16 block in the recipe) and
    one fp32 scale; fp8-blockwise one fp32 scale per 128x128 block."""
    rows, numel = weight.shape[0], weight.numel()
    quantiser = recipe.weight
    blocks = numel / (quantiser.block ** 2 if quantiser.square else quantiser.block or 1)
    scales = {"tensorwise": 4.0, "rowwise": 4.0 * rows, "mx": blocks,
              "nvfp4": blocks + 4.0, "blockwise": 4.0 * blocks}[quantiser.scaling]
    return numel * _ELEMENT_BYTES[quantiser.elem] + scales


def lowbit_bytes(model: nn.Module, plan: Float8Selection | None, spec: ModeSpec) -> float:
    """The low-bit weight copies (and their scales) of ``plan``'s layers in ``spec``'s
    format (a precision plan: each layer in its own); 0 for a mode without one."""
    formats = dict(spec.layer_formats)
    if plan is None or not (spec.lowbit or formats):
        return 0.0
    modules = dict(model.named_modules())
    return sum(quantised_weight_bytes(RECIPES[formats.get(name) or str(spec.lowbit)],
                                      modules[name].weight) for name in plan.convert)
