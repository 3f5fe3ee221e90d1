"""One forward pass of a batch, below everything that trains or measures: the Trainer's
loop, micro-batch probing, evaluation, compare and diagnose all run batches through here."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .errors import UserError

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


def forward_batch(model: nn.Module | Callable[..., Any], batch: Any, loss_fn: LossFn,
                  check: Callable[[Any, Any], None] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Run the model on a batch: returns (mean loss, logits, targets).

    A batch is a tuple ``(*inputs, targets)`` or a dict of keyword inputs (with
    ``labels``). A model-computed ``loss`` wins over ``loss_fn``. ``check(logits,
    targets)``, when given, sees the outputs before the loss is computed from them.
    """
    if isinstance(batch, dict):
        output = model(**batch)
        targets = batch.get("labels")
    else:
        *inputs, targets = batch
        output = model(*inputs)
    logits, loss = split_outputs(output)
    if check is not None and loss is None:
        check(logits, targets)
    if loss is None:
        if logits is None or targets is None:
            raise UserError("the model returned no loss and no logits with targets: return logits "
                            "(a tensor) or an object with .loss")
        loss = loss_fn(logits, targets)
    return loss, logits, targets
