"""One forward pass of a batch, below everything that trains or measures: the Trainer's
loop, micro-batch probing, evaluation, compare and diagnose all run batches through here."""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .errors import UserError, first_line
from .oom import is_out_of_memory

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def split_outputs(output: Any) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(logits, loss) from a tensor, a dict, or an object with ``logits``/``loss`` (HF style)."""
    if isinstance(output, torch.Tensor):
        return output, None
    if isinstance(output, dict):
        return output.get("logits"), output.get("loss")
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0], None
    return getattr(output, "logits", None), getattr(output, "loss", None)


def check_dict_batch(model: Any, batch: dict[Any, Any]) -> None:
    """The dict-batch convention (Hugging Face's): every key is a keyword of the model's
    ``forward``, ``labels`` holds the targets. A key that is not one (``label``, ``input``)
    is named here instead of torch's "unexpected keyword argument" deep in the forward."""
    module = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    module = getattr(module, "module", module)   # DDP/DataParallel's wrapper
    keys = [k for k in batch if not isinstance(k, str)]
    if keys:
        raise UserError(f"a dict batch's keys must be the model's forward() keyword names "
                        f"(got the key {keys[0]!r})")
    try:
        # A plain function is its own forward.
        parameters = inspect.signature(getattr(module, "forward", module)).parameters.values()
    except (TypeError, ValueError):  # a builtin or C forward: nothing to compare with
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    names = [p.name for p in parameters
             if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]
    unknown = [k for k in batch if k not in names]
    if unknown:
        raise UserError(f"dict batches are passed to forward() as keywords (the Hugging Face "
                        f"convention; targets under 'labels'), but the model's forward("
                        f"{', '.join(names)}) has no parameter {unknown[0]!r}: rename the key "
                        f"or give (inputs, targets) tuples")


def describe_batch(batch: Any) -> str:
    """A batch's structure in a few words: ``inputs (8, 7) float32, targets (8,) int64``."""
    def one(value: Any) -> str:
        if isinstance(value, torch.Tensor):
            return f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
        return type(value).__name__
    if isinstance(batch, dict):
        return "keys " + ", ".join(f"{k}: {one(v)}" for k, v in list(batch.items())[:6])
    if isinstance(batch, (tuple, list)) and batch:
        *inputs, targets = batch
        return ", ".join([f"inputs {one(v)}" for v in inputs] + [f"targets {one(targets)}"])
    return type(batch).__name__


def forward_batch(model: nn.Module | Callable[..., Any], batch: Any, loss_fn: LossFn,
                  check: Callable[[Any, Any], None] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Run the model on a batch: returns (mean loss, logits, targets).

    A batch is a tuple ``(*inputs, targets)`` or a dict of keyword inputs (with
    ``labels``). A model-computed ``loss`` wins over ``loss_fn``. ``check(logits,
    targets)``, when given, sees the outputs before the loss is computed from them.
    """
    if isinstance(batch, dict):
        if check is not None:  # the run's first batch: the convention is checked once
            check_dict_batch(model, batch)
        inputs, targets, keywords = [], batch.get("labels"), batch
    else:
        *inputs, targets = batch
        keywords = {}
    try:
        output = model(*inputs, **keywords)
    except Exception as exc:
        if check is None or is_out_of_memory(exc) or isinstance(exc, UserError):
            raise
        # The run's first batch: a model that cannot take the data's samples is said in
        # one line naming the data, not as the model's own error deep in its forward.
        raise UserError(f"the model fails on the first batch of the training data "
                        f"({describe_batch(batch)}): {type(exc).__name__}: "
                        f"{first_line(exc)}; the data's samples must be what the model's "
                        f"forward() takes") from None
    logits, loss = split_outputs(output)
    if check is not None and loss is None:
        check(logits, targets)
    if loss is None:
        if isinstance(batch, dict) and targets is None:
            raise UserError("the model returned no loss and no logits with targets: a dict "
                            "batch carries its targets under 'labels' (or the model returns "
                            ".loss itself), and this batch has no 'labels' key")
        if logits is None or targets is None:
            raise UserError("the model returned no loss and no logits with targets: return logits "
                            "(a tensor) or an object with .loss")
        loss = loss_fn(logits, targets)
    return loss, logits, targets


def fp32_window_loss(model: Any, window: Any, loss_fn: LossFn, device: torch.device) -> float:
    """The mean loss of one data window's micro-batches through ``model`` in fp32: autocast
    off, no gradient, and the RNG (CPU, and the device's on CUDA) as it was before -- a
    measurement that must not move the run it measures. One host read per micro-batch."""
    devices = [] if device.type != "cuda" else \
        [device.index if device.index is not None else torch.cuda.current_device()]
    total, samples = 0.0, 0
    with torch.random.fork_rng(devices=devices), torch.no_grad(), \
            torch.autocast(device.type, enabled=False):
        for batch, n in zip(window.micro_batches, window.micro_samples):
            loss, _, _ = forward_batch(model, batch, loss_fn)
            total += float(loss.float().item()) * n
            samples += n
    return total / max(samples, 1)

