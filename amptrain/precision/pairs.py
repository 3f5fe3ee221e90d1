"""The model/optimizer pairs a :class:`~amptrain.precision.Precision` has set up: each with
its weight policy (:mod:`.policies`) and its own skip counters, found by its optimizer.

A GAN registers two pairs (discriminator, generator); one ``Precision`` serves them all, so
they share the autocast, the fp32 islands and (by default) one loss scale, while each
optimizer is checked, skipped and counted on its own.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import nn

from ..common.errors import UserError
from .outcome import SkipCounter
from .policies import WeightPolicy

log = logging.getLogger("amptrain")


@dataclass(eq=False)
class Pair:
    """One registered model and optimizer."""

    index: int                      # registration order: how checkpoints name the pair
    model: nn.Module
    optimizer: torch.optim.Optimizer
    policy: WeightPolicy
    skips: SkipCounter = field(default_factory=SkipCounter)
    _host_flags: list[torch.Tensor] = field(default_factory=list)
    _flag_index: int = 0

    def next_host_flag(self, device: torch.device) -> torch.Tensor | None:
        """A pinned host buffer for this step's skip flag (CUDA only). Two per pair: the
        Trainer reads step t's flags while step t+1's copies are in flight, and each
        optimizer's flag needs a buffer of its own."""
        if device.type != "cuda":
            return None
        if not self._host_flags:
            self._host_flags = [torch.zeros((), dtype=torch.float32).pin_memory()
                                for _ in range(2)]
        self._flag_index ^= 1
        return self._host_flags[self._flag_index]


class Pairs:
    """The registry: pairs in registration order, found by optimizer."""

    def __init__(self) -> None:
        self._pairs: list[Pair] = []

    def __len__(self) -> int:
        return len(self._pairs)

    def __iter__(self) -> Iterator[Pair]:
        return iter(self._pairs)

    def __getitem__(self, index: int) -> Pair:
        return self._pairs[index]

    def add(self, model: nn.Module, optimizer: torch.optim.Optimizer,
            policy: WeightPolicy) -> Pair:
        """Register a pair (refusing an optimizer that is registered already)."""
        if any(p.optimizer is optimizer for p in self._pairs):
            raise UserError("this optimizer is set up already: call setup(model, optimizer) "
                            "once per model and optimizer")
        pair = Pair(len(self._pairs), model, optimizer, policy)
        self._pairs.append(pair)
        return pair

    def of(self, optimizer: torch.optim.Optimizer | None) -> Pair:
        """The pair of ``optimizer``; None means the only one."""
        if optimizer is None:
            if len(self._pairs) != 1:
                raise UserError("pass the optimizer explicitly: setup() registered "
                                f"{len(self._pairs)} optimizers")
            return self._pairs[0]
        for pair in self._pairs:
            if pair.optimizer is optimizer:
                return pair
        raise UserError(f"this {type(optimizer).__name__} was not set up: call "
                        "precision.setup(model, optimizer) first")

    def grad_links(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every pair's (gradient source, optimizer parameter) links, each tensor once."""
        seen: set[int] = set()
        links = []
        for pair in self._pairs:
            for source, target in pair.policy.grad_links():
                if id(target) not in seen:
                    seen.add(id(target))
                    links.append((source, target))
        return links

    def fp32_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """``model``'s state with fp32 weights: each pair's master copies where its policy
        keeps them (see :meth:`Precision.fp32_state_dict`)."""
        state = model.state_dict()
        for pair in self._pairs:
            state.update(pair.policy.fp32_weights(model))
        return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}

    def load_fp32_state_dict(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Load fp32 weights into ``model``, each pair's half weights and its masters."""
        model.load_state_dict(state)
        for pair in self._pairs:
            pair.policy.load_fp32(model, state)

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> list[dict[str, Any]]:
        """Each pair's counters and weight-policy state, in registration order."""
        return [{"skipped_steps": p.skips.skipped, "consecutive_skips": p.skips.consecutive,
                 "weight_update": p.policy.state_dict()} for p in self._pairs]

    def load_state_dict(self, states: list[dict[str, Any]]) -> None:
        """Restore :meth:`state_dict`."""
        if states and self._pairs and len(states) != len(self._pairs):
            log.warning("warning: the checkpoint has %d model/optimizer pairs, this run %d: "
                        "the first %d are restored", len(states), len(self._pairs),
                        min(len(states), len(self._pairs)))
        for pair, state in zip(self._pairs, states):
            pair.skips = SkipCounter(int(state.get("skipped_steps", 0)),
                                     int(state.get("consecutive_skips", 0)))
            pair.policy.load_state_dict(state.get("weight_update"))
