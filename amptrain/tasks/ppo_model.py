"""The interface the ``ppo`` task needs of its model, checked once at set-up, before any
rollout: ``forward(obs) -> (logits_or_mean, value)`` (models/actor_critic.py keeps it).

A user's own actor-critic (``--model module:pkg.mod:Class``) that does not keep it is one
line naming ``--model`` (the option to change) and what its forward must accept, never
the TypeError of the first rollout: the forward's signature is read first (a forward that
takes no observations, or needs more than them), then one batch of zero observations is
passed through it (shapes, return type).
"""
from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from ..common.errors import UserError, bounded, flag
from .gan import unwrap


def actor_critic_of(model: nn.Module, env: Any, spec: str | None = None
                    ) -> tuple[nn.Module, bool]:
    """Check ``model`` keeps the actor-critic interface for the environment ``env`` (its
    ``obs_shape``, ``actions`` and ``discrete``); (the module, whether it has ``log_std``).
    ``spec``: the ``--model`` the run was given, named in the error (the CLI's runs)."""
    module = unwrap(model)
    name = type(module).__name__
    given = f"{flag('model')} {spec}" if spec else f"{flag('model')} ({name})"
    obs = "(N" + "".join(f", {n}" for n in env.obs_shape) + ")"
    needs = (f"{given}: {flag('task')} ppo needs an actor-critic whose forward takes one "
             f"batch of observations, forward(obs) with obs of shape {obs}, and returns "
             f"(logits_or_mean, value) with shapes (N, {env.actions}) and (N,)"
             + ("" if env.discrete else f", and a log_std parameter of {env.actions} values")
             + f" (e.g. {flag('model')} actor-critic)")
    params = list(module.parameters())
    if not params:
        raise UserError(f"{needs}; the model {name} has no parameters")
    probe = torch.zeros(2, *env.obs_shape, device=params[0].device)
    _check_signature(module, probe, needs)
    try:
        with torch.no_grad():
            out = module(probe)
    except Exception as exc:  # the model's own error on an observation batch
        raise UserError(f"{needs}; the model {name} fails on a batch of observations of "
                        f"shape {tuple(probe.shape)}: {type(exc).__name__}: "
                        f"{bounded(exc)}") from None
    if not (isinstance(out, (tuple, list)) and len(out) == 2
            and all(isinstance(t, torch.Tensor) for t in out)):
        raise UserError(f"{needs}; the model {name} returns {type(out).__name__}")
    head, value = out
    if tuple(head.shape) != (2, env.actions) or value.numel() != 2:
        raise UserError(f"{needs}; the model {name} returns shapes {tuple(head.shape)} and "
                        f"{tuple(value.shape)} for 2 observations")
    log_std = getattr(module, "log_std", None)
    if not env.discrete and not (isinstance(log_std, torch.Tensor)
                                 and log_std.numel() == env.actions):
        raise UserError(f"{needs}; the model {name} has no such log_std")
    return module, not env.discrete


def _check_signature(module: nn.Module, probe: torch.Tensor, needs: str) -> None:
    """Refuse a forward that cannot be called as ``forward(obs)`` by its signature alone,
    so the message says what the forward takes rather than a TypeError from inside it.
    A forward with no readable signature (a builtin) is left to the call."""
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(probe)
    except TypeError as exc:
        bare = signature.replace(  # the names say it; annotations would only lengthen it
            parameters=[p.replace(annotation=inspect.Parameter.empty)
                        for p in signature.parameters.values()],
            return_annotation=inspect.Signature.empty)
        shown = bounded(f"{type(module).__name__}.forward{bare}", 160)
        raise UserError(f"{needs}; {shown} cannot be called as forward(obs): {exc}") from None


__all__ = ["actor_critic_of"]
