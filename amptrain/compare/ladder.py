"""The memory ladder of a set-up run: exact bytes of what training keeps per parameter.

Summed over the tensors themselves (not sampled, not measured from an allocator), so the
rungs can be compared on any device:

* ``weights_bytes``: the model's parameters as the precision stores them; in a low-bit
  mode (fp8, MX, NVFP4) also the low-bit copy of each converted Linear's weight with its
  scales, which the format's hardware materialises every step
  (:func:`amptrain.precision.lowbit.lowbit_bytes`; activations are not per parameter and
  not counted: torchao's recipes save the bf16 input for the backward).
* ``grad_bytes``: the gradients the optimizer steps on (fp32 for master copies, else the
  parameters' dtype), one per optimizer parameter.
* ``master_bytes``: what keeps the weights' lost precision: fp32 master copies
  (``X-master``) or Kahan compensation buffers (``--weight-update kahan``).
* ``optimizer_state_bytes``: the optimizer's state (moments, momentum, step counters);
  quantised states count their codes, scales and code maps.
* ``bytes_per_param``: their sum over the model's parameter count.
* ``lowbit_flops_share``: the share of the plain Linear layers' matmul FLOPs (per token)
  that run in a low-bit format (0 outside the low-bit modes and precision plans).
* ``est_matmul_speedup_h100`` / ``est_matmul_speedup_b200``: for a low-bit mode or plan,
  the Linear GEMMs' bf16 time over their time in the run's formats at each GPU's published
  dense peak rates -- an **estimate** (:mod:`amptrain.precision.hardware.peak_rates`: the
  rest of the step not counted); None outside the low-bit modes and where the GPU has no
  hardware for a format (MXFP4 on an H100).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..precision import Precision
from ..precision.lowbit import lowbit_bytes
from ..precision.hardware.peak_rates import speed_estimates
from ..precision.precision_plan import linear_flops, lowbit_flops_share

#: The ladder's fields, in compare.json's order.
LADDER_FIELDS = ("weights_bytes", "grad_bytes", "master_bytes", "optimizer_state_bytes",
                 "bytes_per_param", "lowbit_flops_share", "est_matmul_speedup_h100",
                 "est_matmul_speedup_b200")


def inner_tensors(value: Any) -> list[torch.Tensor]:
    """The plain tensors that hold ``value``'s data: itself, or the inner tensors of a
    tensor subclass (torchao's quantised optimizer states: codes, scales, code map);
    nothing for a non-tensor."""
    if not isinstance(value, torch.Tensor):
        return []
    flatten = getattr(value, "__tensor_flatten__", None)
    if flatten is not None and type(value) is not torch.Tensor \
            and not isinstance(value, nn.Parameter):
        names, _ = flatten()
        return [t for name in names for t in inner_tensors(getattr(value, name))]
    return [value]


def tensor_bytes(value: Any) -> int:
    """Bytes of a tensor (a subclass: of its inner tensors), or 0 for anything else."""
    return sum(t.numel() * t.element_size() for t in inner_tensors(value))


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in ``optimizer.state``."""
    return sum(tensor_bytes(v) for state in optimizer.state.values() for v in state.values())


def memory_ladder(model: nn.Module, optimizer: torch.optim.Optimizer,
                  precision: Precision | None = None) -> dict[str, Any]:
    """The ladder's fields (:data:`LADDER_FIELDS`) for a model and optimizer after
    ``precision.setup`` (and after a step, so that the optimizer's state exists)."""
    model_params = list(model.parameters())
    own = {id(p) for p in model_params}
    stepped = [p for g in optimizer.param_groups for p in g["params"]]
    weights = sum(tensor_bytes(p) for p in model_params)
    if precision is not None:
        weights += round(lowbit_bytes(model, precision.float8_plan, precision.spec))
    grads = sum(p.numel() * p.element_size() for p in stepped if p.requires_grad)
    masters = sum(tensor_bytes(p) for p in stepped if id(p) not in own)
    if precision is not None:
        masters += precision.weight_rule_nbytes()
    state = optimizer_state_bytes(optimizer)
    count = sum(p.numel() for p in model_params)
    lowbit = precision.float8_plan.convert if precision is not None \
        and precision.float8_plan is not None else []
    estimates = _speed_estimates(model, precision, lowbit)
    return {"weights_bytes": weights, "grad_bytes": grads, "master_bytes": masters,
            "optimizer_state_bytes": state,
            "bytes_per_param": (weights + grads + masters + state) / count if count else None,
            "lowbit_flops_share": lowbit_flops_share(model, lowbit),
            "est_matmul_speedup_h100": estimates.get("H100"),
            "est_matmul_speedup_b200": estimates.get("B200")}


def _speed_estimates(model: nn.Module, precision: Precision | None,
                     lowbit: list[str]) -> dict[str, float | None]:
    """The peak-rate estimates for the low-bit layers in their formats (a plan's own per
    layer; a low-bit mode's name for all of them); nothing without a low-bit layer."""
    if precision is None or not lowbit:
        return {}
    plan = precision.mode.plan
    formats = plan.formats if plan is not None else {}
    chosen = {name: formats.get(name, precision.mode.name) for name in lowbit}
    return {gpu: None if value is None else round(value, 3)
            for gpu, value in speed_estimates(linear_flops(model), chosen).items()}
