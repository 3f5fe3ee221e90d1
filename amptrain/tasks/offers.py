"""A task's part that tells the ``eval`` and ``generate`` commands what it offers
(:class:`Offers`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Offers:
    """The default: nothing to generate; ``eval`` fits the task on the data it evaluates."""

    #: What ``amptrain generate`` draws from a trained model of this task: "text" (a
    #: language model's continuation), "images" (a generator's samples), or None.
    generates: str | None = None
    #: The split ``amptrain eval`` fits the task on (``Task.learn_from``): "val" (the data
    #: it evaluates) or "train" (a task that measures against the training split, as the
    #: GAN's feature network).
    eval_learn_split: str = "val"


__all__ = ["Offers"]
