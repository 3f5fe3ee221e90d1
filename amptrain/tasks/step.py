"""A training step as a task sees it: the :class:`StepContext` the Trainer hands to
:meth:`Task.training_step <amptrain.tasks.Task.training_step>`, and the default supervised
step (one model, one loss), which is today's loop written against that context.

A step of several models (a GAN's discriminator and generator) is the same shape, a loop of
``ctx.micro(name)`` per loss and one ``ctx.step(name)`` per optimizer::

    def training_step(ctx):
        for batch, n, share in ctx.micro("discriminator"):
            with ctx.autocast():
                d_loss = ...
            ctx.backward(d_loss * share, loss_id=0)
            ctx.log("d_loss", d_loss.detach(), n)
        ctx.step("discriminator")
        ...

Tasks never import the Trainer: this module is the whole of what they know about it.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ContextManager, Protocol

import torch
from torch import nn

from ..common.forward import LossFn, forward_batch


class StepContext(Protocol):
    """One optimizer step's view of the Trainer (see the module docstring)."""

    #: This step's micro-batches for this rank, on the device.
    micro_batches: list[Any]
    #: Samples in each micro-batch.
    micro_samples: list[int]
    #: Samples in the global batch (all ranks, all micro-batches).
    global_samples: int
    #: The optimizer step being run, counting from 1 (a task that works in cycles of
    #: steps, as PPO's rollouts, knows where a cycle starts; a resumed run goes on counting).
    step_number: int
    #: This process's rank and the processes in the run (from the strategy).
    rank: int
    world_size: int

    def model(self, name: str = "model") -> nn.Module:
        """The callable (wrapped/compiled) part ``name``."""
        ...

    def optimizer(self, name: str = "model") -> torch.optim.Optimizer:
        """Part ``name``'s optimizer."""
        ...

    def autocast(self) -> ContextManager:
        """The precision's autocast."""
        ...

    def micro(self, name: str = "model") -> Iterator[tuple[Any, int, float]]:
        """``(batch, samples, share)`` per micro-batch, inside part ``name``'s gradient-sync
        context (DDP's no_sync except on the last); ``share = samples * world /
        global_samples`` turns a per-micro-batch mean loss into its share of the step."""
        ...

    def backward(self, loss: torch.Tensor, *, loss_id: int = 0) -> None:
        """Backpropagate ``loss`` (scaled where the precision scales)."""
        ...

    def step(self, name: str = "model") -> None:
        """Part ``name``'s optimizer step: unscale, clip, grad norm for the logs, non-finite
        skip, ``optimizer.step``, zero_grad; the skip flag is read one step late and the
        part's LR scheduler steps once it is known."""
        ...

    def log(self, key: str, value: torch.Tensor, samples: int) -> None:
        """A detached device scalar (a per-sample mean over ``samples``), averaged by samples
        over the ``--log-every`` interval into the record's ``key`` (no host sync)."""
        ...


class TrainLoop(Protocol):
    """The Trainer's loop as a task that owns its iteration drives it
    (:meth:`~amptrain.tasks.iteration.Iteration.iterate`): PPO's "for each update, collect
    a rollout, then epochs of minibatches" reads as CleanRL's loop does::

        def iterate(self, loop):
            for update in itertools.count(loop.step_number // per_update):
                if loop.done:
                    return
                self.collect(loop, update)       # under loop.autocast(), no gradients
                for epoch in range(update_epochs):
                    for window in loop.epoch(update * update_epochs + epoch):
                        loop.step(window)        # the task's training_step on the window

    The Trainer keeps the data order, the step (precision, out-of-memory redo), logging,
    evaluation, checkpoints and stops; the task decides what happens between steps.
    """

    #: This process's rank and the processes in the run (from the strategy).
    rank: int
    world_size: int

    @property
    def step_number(self) -> int:
        """Optimizer steps done so far (a resumed run starts past 0)."""
        ...

    @property
    def done(self) -> bool:
        """The run's length is reached, or all ranks agreed to stop: return now."""
        ...

    def epoch(self, index: int, start: int = 0, *, saves: bool = True) -> Iterator[Any]:
        """The windows of the training data's epoch ``index`` in the run's data order (its
        seed and global batch), from window ``start``; none once :attr:`done`. ``saves``:
        whether the epoch's end is a point to checkpoint at (as every epoch's end of a
        supervised run; PPO's: the end of an update, where a resume repeats the run)."""
        ...

    def step(self, window: Any) -> None:
        """One optimizer step of the task's ``training_step`` on ``window``, then the
        Trainer's bookkeeping (logs, evaluation, checkpoints, stop requests)."""
        ...

    def model(self, name: str = "model") -> nn.Module:
        """The callable (wrapped/compiled) part ``name``."""
        ...

    def autocast(self) -> ContextManager:
        """The precision's autocast."""
        ...

    def log(self, key: str, value: torch.Tensor, samples: int) -> None:
        """A value logged between steps (a rollout's returns): it joins the next step's."""
        ...


def supervised_step(ctx: StepContext, loss_fn: LossFn,
                    check: Callable[[Any, Any], None] | None = None) -> None:
    """One model, one loss: forward and backward of every micro-batch (gradients
    accumulate), then one optimizer step; logs ``loss``.

    ``check(outputs, targets)`` (the run's first batch only) sees the outputs before the
    loss is computed from them. The loss is a mean over its micro-batch, so its share of the
    step is ``n * world / N`` (N: samples in the global batch); DDP then averages gradients
    over ranks, which the factor ``world`` undoes: the sum over all ranks and micro-batches
    is exactly the mean over the global batch. A share of exactly 1 (no accumulation) is not
    multiplied in: that would cost a kernel in the forward and one in the backward of every
    step, for nothing.
    """
    model = ctx.model()
    for i, (batch, n, share) in enumerate(ctx.micro()):
        with ctx.autocast():
            loss, _, _ = forward_batch(model, batch, loss_fn, check if i == 0 else None)
        ctx.backward(loss if share == 1 else loss * share)
        ctx.log("loss", loss.detach(), n)
    ctx.step()


__all__ = ["StepContext", "TrainLoop", "supervised_step"]
