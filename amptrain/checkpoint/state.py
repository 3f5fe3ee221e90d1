"""What goes into a checkpoint's state and comes out of it again.

The Trainer assembles a checkpoint (``Trainer.state_dict``); these are the pieces that do
not depend on it: checking that saved weights fit a model, loading optimizer state across
precisions, and capturing and restoring the random generators for an exact resume.
"""
from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import torch

from ..common.errors import UserError
from ..common.quiet import quiet_torchao

log = logging.getLogger("amptrain")

#: Optimizer group entries that describe how this process runs the optimizer (kernel
#: choice, the precision layer's Adam eps floor), not the training state: the running
#: optimizer keeps its own values when a checkpoint is loaded.
RUNTIME_GROUP_KEYS = ("eps", "fused", "foreach", "capturable", "differentiable")


def weights_mismatch(expected: dict[str, torch.Tensor], found: dict[str, Any]) -> str | None:
    """The first difference between a model's state_dict and a checkpoint's, or None."""
    for key, value in expected.items():
        if key not in found:
            return f"the model's '{key}' is missing from the checkpoint"
        other = found[key]
        if isinstance(value, torch.Tensor) and isinstance(other, torch.Tensor) \
                and value.shape != other.shape:
            return (f"'{key}' has shape {tuple(other.shape)} in the checkpoint but "
                    f"{tuple(value.shape)} in the model")
    extra = [key for key in found if key not in expected]
    if extra:
        return f"the checkpoint's '{extra[0]}' is not in the model"
    return None


def plain_tensor(value: torch.Tensor) -> torch.Tensor:
    """A host copy of ``value`` as a plain tensor: a DTensor (a gradient norm under FSDP)
    becomes its full value (a collective: every rank calls it), so the checkpoint still
    loads with ``weights_only=True`` where ``torch.distributed.tensor`` is not imported."""
    full = getattr(value, "full_tensor", None)
    if callable(full):
        value = full()
    return value.detach().cpu().clone()


#: Where a quantised optimizer state (a tensor subclass) is kept as its plain parts.
_QUANTISED = "__quantised_state__"


def load_weights(model: Any, state: dict[str, torch.Tensor], strategy: Any,
                 precision: Any) -> None:
    """Load fp32 weights (a checkpoint's ``model`` entry) into a set-up ``model`` through
    ``strategy`` (which may shard them); a mismatch is a UserError naming the first
    difference, never torch's message."""
    mismatch = weights_mismatch(model.state_dict(), state)
    if mismatch:
        raise UserError(f"checkpoint does not fit this model: {mismatch}")
    try:
        strategy.load_model_state_dict(model, precision, state)
    except RuntimeError as exc:
        text = str(exc).strip()
        raise UserError(f"checkpoint does not fit this model: "
                        f"{text.splitlines()[0] if text else type(exc).__name__}") from None


def plain_optimizer_state(state: dict[str, Any]) -> dict[str, Any]:
    """``optimizer.state_dict()`` with tensor-subclass states (``--optimizer adamw8bit``:
    torchao's block-quantised moments) replaced by their plain tensors and metadata, so the
    checkpoint still loads with ``weights_only=True``; :func:`load_optimizer_state` rebuilds
    them."""
    def plain(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or type(value) is torch.Tensor \
                or not hasattr(value, "__tensor_flatten__"):
            return value
        names, meta = value.__tensor_flatten__()
        return {_QUANTISED: f"{type(value).__module__}.{type(value).__qualname__}",
                "tensors": {n: getattr(value, n) for n in names}, "meta": list(meta),
                "size": list(value.shape), "stride": list(value.stride())}

    return {**state, "state": {k: {name: plain(v) for name, v in s.items()}
                               for k, s in state.get("state", {}).items()}}


def _quantised_classes() -> dict[str, type]:
    with quiet_torchao():
        from torchao.optim.subclass_4bit import OptimState4bit
        from torchao.optim.subclass_8bit import OptimState8bit
        from torchao.optim.subclass_fp8 import OptimStateFp8

    return {f"{c.__module__}.{c.__qualname__}": c
            for c in (OptimState8bit, OptimState4bit, OptimStateFp8)}


def _rebuild_quantised(saved: dict[str, Any]) -> dict[str, Any]:
    """Undo :func:`plain_optimizer_state` (only torchao's known state classes are built)."""
    entries = [v for s in saved.get("state", {}).values() for v in s.values()
               if isinstance(v, dict) and _QUANTISED in v]
    if not entries:
        return saved
    try:
        classes = _quantised_classes()
    except ImportError:
        raise UserError("the checkpoint's optimizer state is quantised (--optimizer adamw8bit) "
                        "and needs torchao: pip install 'amptrain[lowbit]'") from None

    def build(value: Any) -> Any:
        if not (isinstance(value, dict) and _QUANTISED in value):
            return value
        cls = classes.get(value[_QUANTISED])
        if cls is None:
            raise UserError(f"the checkpoint's optimizer state holds an unknown quantised "
                            f"tensor type {value[_QUANTISED]!r}")
        return cls.__tensor_unflatten__(value["tensors"], tuple(value["meta"]),  # type: ignore[attr-defined]
                                        torch.Size(value["size"]), tuple(value["stride"]))

    return {**saved, "state": {k: {name: build(v) for name, v in s.items()}
                               for k, s in saved["state"].items()}}


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """Load a checkpoint's optimizer state into ``optimizer``, whatever precision wrote it.

    State is keyed by parameter position, which is the same with or without fp32 master
    copies (the masters take their parameters' places), and torch casts moments to each
    parameter's dtype. The entries in :data:`RUNTIME_GROUP_KEYS` keep this optimizer's
    values: they belong to the current precision and device, not to the run.
    """
    saved = _rebuild_quantised(saved)
    runtime = [{k: g[k] for k in RUNTIME_GROUP_KEYS if k in g} for g in optimizer.param_groups]
    sizes = [len(g["params"]) for g in optimizer.param_groups]
    saved_sizes = [len(g["params"]) for g in saved.get("param_groups", [])]
    if sizes != saved_sizes:
        raise UserError(f"the checkpoint's optimizer has parameter groups of sizes {saved_sizes}, "
                        f"this one {sizes}: a different model or optimizer setup")
    try:
        optimizer.load_state_dict(saved)
    except (ValueError, KeyError, RuntimeError) as exc:
        raise UserError(f"the checkpoint's optimizer state does not fit: "
                        f"{str(exc).strip().splitlines()[0]}") from None
    for group, kept in zip(optimizer.param_groups, runtime):
        group.update(kept)
        if not (group.get("fused") or group.get("capturable")):
            # Plain kernels keep the step count as a CPU scalar; fused ones on the device.
            for param in group["params"]:
                step = optimizer.state.get(param, {}).get("step")
                if isinstance(step, torch.Tensor) and step.device.type != "cpu":
                    optimizer.state[param]["step"] = step.to("cpu", torch.float32)


# ------------------------------------------------------------------------ RNG
def capture_rng() -> dict[str, Any]:
    """Python, numpy, torch and CUDA generator states, as tensors and plain values."""
    # The global RandomState is an MT19937, whose legacy state is a tuple (numpy's stub
    # types a no-argument get_state() as the dict form).
    state = np.random.get_state(legacy=True)
    assert isinstance(state, tuple)
    kind, keys, pos, has_gauss, cached = state
    rng: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: dict[str, Any]) -> None:
    """Undo :func:`capture_rng` (CUDA states only where CUDA is available)."""
    if "python" in rng:
        random.setstate(rng["python"])
    numpy_state = rng.get("numpy")
    if isinstance(numpy_state, dict):
        np.random.set_state((numpy_state["kind"], numpy_state["keys"].numpy().astype(np.uint32),
                             numpy_state["pos"], numpy_state["has_gauss"],
                             numpy_state["cached_gaussian"]))
    if "torch" in rng:
        torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        states = rng["cuda"]
        if len(states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(states)
        else:
            log.warning("checkpoint has CUDA RNG states for %d devices, this process sees %d: "
                        "CUDA random streams restart", len(states), torch.cuda.device_count())


class RngState:
    """The process's random generators as a checkpoint section (:class:`~.stateful.Stateful`):
    captured when a checkpoint is made, restored on resume, so the resumed run draws what
    the unbroken one would."""

    section = "rng"
    format_version = 1

    def state_dict(self) -> dict[str, Any]:
        return capture_rng()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_rng(state)

    def migrate(self, state: dict[str, Any], version: int) -> dict[str, Any]:
        """Version 0 (amptrain before versioned sections) kept the same entries under "rng"
        (or none: the generators were not saved)."""
        return dict(state.get("rng") or {})
